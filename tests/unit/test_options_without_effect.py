"""No option is accepted without effect: an option given to ``fedhmc run`` that the run
would make no use of is refused in one line that names what it applies to, and a sampler's
option given for another sampler is refused naming the chosen sampler's own."""

from __future__ import annotations

import itertools

import pytest

from fedhmc.algorithms import registry
from fedhmc.errors import ConfigError
from fedhmc.runtime.config import (
    NULLABLE,
    RunConfig,
    refuse_unused,
    sampler_options,
    unused_settings,
)

VALUES = {
    "hidden": "8", "model_batching": "loop", "compile": True, "partition": "shards",
    "dirichlet_alpha": 0.3, "min_client_size": 2, "classes_per_client": 2,
    "quantity_sigma": 0.5, "scaling": "none", "ece_bins": 10, "rho": 0.5,
    "anchor_batch_size": 10, "staleness": 2, "staleness_dist": "uniform",
    "max_staleness": 3, "max_worker_failures": 2, "client_gpus": 0.5, "round_timeout": 5.0,
    "straggler_factor": 2.0, "straggler_floor": 1.0, "min_clients": 2,
    "node_wait_timeout": 5.0, "on_failure": "renormalize", "max_failed_rounds": 2,
    "participation": "uniform", "step_size": 0.02, "local_steps": 3, "leapfrog_steps": 3,
    "grad_noise": 0.1, "temperature": 0.5, "clients_per_round": 2, "friction": 0.5,
    "sync_unit": "leapfrog", "fresh_gradients": True,
}  # fmt: skip
"""A valid value, other than the default, for every setting a run may leave unused."""

SETUPS = [
    dict(dataset=d, model=m) for d, m in (("digits", "logistic"), ("digits", "mlp"),
                                          ("digits", "cnn"), ("gaussian-hetero", "logistic"))
]  # fmt: skip


def test_every_setting_a_run_may_leave_unused_has_a_value_here():
    skip = {"model", "model_arg"}  # (what --model names: tested by the CLI cases below)
    assert set(NULLABLE) - skip <= set(VALUES)


def _resolved(**kw):
    try:
        return RunConfig(**kw).resolve()
    except ConfigError:
        return None  # a combination no run takes (async-sgld on the engine, ...)


@pytest.mark.parametrize("algorithm", registry.NAMES)
def test_every_option_against_every_backend_and_model(algorithm):
    """For every setting, backend and model (and the Gaussian target): the option given
    is refused, naming it, exactly where the run would leave it unused."""
    checked = 0
    for setup, backend in itertools.product(SETUPS, ("engine", "flower")):
        base = _resolved(algorithm=algorithm, backend=backend, **setup)
        if base is None:
            continue
        unused = set(unused_settings(base.to_dict()))
        own = registry.entry(algorithm).own
        for key, value in VALUES.items():
            given = base.replace(**{key: value})
            if key in sampler_options() and key not in own:  # another sampler's option
                with pytest.raises(ConfigError, match="is not an option of"):
                    given.resolve()
            elif key in unused:
                with pytest.raises(ConfigError, match="^--" + key.replace("_", "-") + " "):
                    refuse_unused(given, {key})
            else:
                refuse_unused(given, {key})
            checked += 1
    assert checked > 0


@pytest.mark.parametrize(
    "argv, applies",
    [
        (["--round-timeout", "5.0"], "--backend flower"),
        (["--min-clients", "2"], "--backend flower"),
        (["--model", "cnn", "--hidden", "10"], "--model mlp"),
        (["--model-batching", "loop"], "a network given as an nn.Module"),
        (["--dataset", "gaussian-hetero", "--ece-bins", "10"], "a dataset of examples"),
    ],
    ids=lambda a: " ".join(a) if isinstance(a, list) else None,
)
def test_the_command_line_refuses_an_option_without_effect(cli, tmp_path, argv, applies):
    out = tmp_path / "run"
    code, _, err = cli("run", *argv, "--rounds", "1", "--out", out)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    flag = next(a for a in argv if a.startswith("--") and a not in ("--model", "--algorithm",
                                                                    "--dataset"))  # fmt: skip
    value = argv[argv.index(flag) + 1]
    assert lines[0].startswith(f"fedhmc run: error: {flag} {value} applies to {applies}")
    assert not out.exists()


@pytest.mark.parametrize(
    "argv, algorithm",
    [
        (["--anchor-batch-size", "10"], "fahmc"),
        (["--max-staleness", "3"], "fahmc"),
        (["--algorithm", "sgld", "--rho", "0.5"], "sgld"),
        (["--algorithm", "async-sgld", "--backend", "flower", "--staleness", "3"], "async-sgld"),
    ],
    ids=lambda a: " ".join(a) if isinstance(a, list) else None,
)
def test_a_samplers_option_is_refused_for_another_sampler(cli, tmp_path, argv, algorithm):
    out = tmp_path / "run"
    code, _, err = cli("run", *argv, "--rounds", "1", "--out", out)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    flag = [a for a in argv if a.startswith("--")][-1]
    assert lines[0].startswith(
        f"fedhmc run: error: {flag} is not an option of --algorithm {algorithm} (its options: "
    ), lines[0]
    assert not out.exists()


@pytest.mark.parametrize(
    "argv, grid, applies",
    [
        (["--hidden", "10"], "model=logistic,cnn", "--model mlp"),
        (["--round-timeout", "5.0"], "seed=0,1", "--backend flower"),
    ],
    ids=lambda a: " ".join(a) if isinstance(a, list) else a,
)
def test_a_sweep_refuses_an_option_that_no_cell_uses(
    cli, tmp_path, monkeypatch, argv, grid, applies
):
    """The run's rule over the grid: an option fixed on the sweep's command line that no
    cell would use is refused in one line, before any cell runs or anything is written."""
    import fedhmc.sweep.cells as cells

    monkeypatch.setattr(cells, "run_cells", lambda *a, **k: pytest.fail("a cell ran"))
    out = tmp_path / "sweep"
    code, _, err = cli("sweep", "--grid", grid, *argv, "--rounds", "1", "--quiet", "--out", out)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    flag, value = argv
    assert lines[0].startswith(f"fedhmc sweep: error: {flag} {value} applies to {applies}")
    assert "no cell of the grid would make use of it" in lines[0] and f"drop {flag}" in lines[0]
    assert not out.exists()


@pytest.mark.parametrize(
    "argv, grid",
    [
        (["--hidden", "10"], "model=logistic,mlp"),
        (["--round-timeout", "5.0"], "backend=engine,flower"),
        (["--backend", "flower", "--max-staleness", "3"], "algorithm=fahmc,async-sghmc"),
    ],
    ids=lambda a: " ".join(a) if isinstance(a, list) else a,
)
def test_a_sweep_takes_an_option_that_some_cells_use(cli, tmp_path, monkeypatch, argv, grid):
    import fedhmc.sweep.cells as cells

    ran = []
    monkeypatch.setattr(cells, "_run_recorded", lambda out, record, todo, *a: ran.extend(todo))
    monkeypatch.setattr(cells, "build_table", lambda out: [])
    code, _, err = cli("sweep", "--grid", grid, *argv, "--rounds", "1", "--quiet",
                       "--out", tmp_path / "sweep")  # fmt: skip
    assert "fedhmc sweep: error" not in err and "applies to" not in err, err
    assert len(ran) == 2  # (not run here: the sweep then says its cells are pending)


def test_a_sweep_refuses_a_sampler_option_that_no_cells_sampler_has(cli, tmp_path, monkeypatch):
    import fedhmc.sweep.cells as cells

    monkeypatch.setattr(cells, "run_cells", lambda *a, **k: pytest.fail("a cell ran"))
    out = tmp_path / "sweep"
    argv = ["--grid", "algorithm=fahmc,fald", "--max-staleness", "3", "--rounds", "1"]
    code, _, err = cli("sweep", *argv, "--quiet", "--out", out)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert "--max-staleness is not an option of any sampler of the grid (fahmc, fald)" in err
    assert not out.exists()
