"""``--compile``: a network module's gradient compiled by inductor (``CompiledRows``).

- The default is a fixed rule of the run's settings (a module, on the CPU, with enough
  gradient evaluations to repay the compilation), recorded in ``config.json``.
- The compiled gradient equals the eager one up to float rounding.
- A module or a machine that cannot compile stays eager, said in one line; a shape that
  fails to compile later is computed eagerly, said in one line, the strategy unchanged.
- Like ``--device``, it is a setting of how a run computes, not what: a resume may change
  it, a sweep's cells are not told apart by it, and each Flower client decides its own.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from fedhmc.errors import ConfigError
from fedhmc.models.module import TorchModel
from fedhmc.runtime.config import COMPILE_MIN_EVALS, RunConfig


def _mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))


def _cfg(**kw) -> RunConfig:
    base = dict(dataset="digits", model="cnn", num_clients=4, chains=2, local_steps=5)
    return RunConfig(**{**base, **kw})


def test_the_default_is_a_rule_of_the_settings():
    # rounds × chains × clients × T × (K + 1) evaluations
    per_round = 2 * 4 * 5 * 11
    just = -(-COMPILE_MIN_EVALS // per_round)
    assert _cfg(rounds=just).resolve().compile is True
    assert _cfg(rounds=just - 1).resolve().compile is False
    assert _cfg(rounds=just, leapfrog_steps=4).resolve().compile is False  # fewer evaluations
    assert _cfg(rounds=just, compile=False).resolve().compile is False  # as given
    assert _cfg(rounds=2, compile=True).resolve().compile is True
    # the built-in, hand-differentiated models and the Gaussian targets never compile
    assert RunConfig(dataset="digits", rounds=10_000).resolve().compile is False
    assert RunConfig(dataset="gaussian-hetero", rounds=10_000).resolve().compile is False


def test_compile_is_refused_where_there_is_nothing_to_compile():
    with pytest.raises(ConfigError, match="--compile applies to a network"):
        RunConfig(dataset="digits", model="logistic", compile=True).resolve()


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_the_compiled_gradient_is_the_eager_one(dtype, tol):
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(3, 7, 6, generator=gen, dtype=dtype)
    y = torch.randint(0, 3, (3, 7), generator=gen)
    sw = torch.rand(3, 7, generator=gen, dtype=dtype)
    eager = TorchModel(_mlp, 3, X[0], dtype=dtype)
    compiled = TorchModel(_mlp, 3, X[0], dtype=dtype, compile=True)
    assert compiled.compiled and not eager.compiled
    theta = torch.randn(3, eager.dim, generator=gen, dtype=dtype)
    g0, v0 = eager.loss_grad(theta, X, y, sw)
    g1, v1 = compiled.loss_grad(theta, X, y, sw)
    torch.testing.assert_close(g1, g0, rtol=tol, atol=tol)
    torch.testing.assert_close(v1, v0, rtol=tol, atol=tol)
    _, none = compiled.loss_grad(theta, X, y, sw, need_value=False)
    assert none is None


def test_a_module_that_cannot_compile_stays_eager_in_one_line(monkeypatch, capsys):
    def fail(*args, **kwargs):
        raise RuntimeError("no C compiler found\nsecond line")

    from torch._inductor import compile_fx

    monkeypatch.setattr(compile_fx, "compile_fx", fail)  # what a machine without a compiler does
    model = TorchModel(_mlp, 3, torch.randn(2, 6), compile=True)
    assert not model.compiled
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "runs uncompiled" in err[0] and "no C compiler" in err[0], err


def test_loop_batching_and_large_minibatches_are_not_compiled():
    from fedhmc.models.module import COMPILE_MAX_VALUES

    model = TorchModel(_mlp, 3, torch.randn(2, 6), batching="loop", compile=True)
    assert not model.compiled
    rows = COMPILE_MAX_VALUES // 6  # examples of 6 values: just below, then at the limit
    assert TorchModel(_mlp, 3, torch.randn(2, 6), compile=True, batch_size=rows).compiled
    assert not TorchModel(_mlp, 3, torch.randn(2, 6), compile=True, batch_size=rows + 1).compiled


def test_the_run_records_the_choice(tmp_path):
    from fedhmc.runtime.engine import run

    cfg = _cfg(rounds=2, chains=1, num_clients=2, local_steps=1, leapfrog_steps=2)
    res = run(cfg.replace(out=str(tmp_path / "r"), compile=False), progress=False)
    saved = json.loads((tmp_path / "r" / "config.json").read_text())
    assert saved["compile"] is False and res.summary["model_compiled"] is False
    # a built-in model records null: the setting played no part
    res = run(
        RunConfig(dataset="digits", rounds=2, chains=1, out=str(tmp_path / "b")), progress=False
    )
    assert json.loads((tmp_path / "b" / "config.json").read_text())["compile"] is None
    assert "model_compiled" not in res.summary


def test_a_shape_that_fails_to_compile_in_the_run_is_eager_in_one_line(monkeypatch, capsys):
    """The strategy stays compiled for the whole run: a shape whose compilation fails is
    computed eagerly (said once), and the shapes that compiled stay compiled."""
    from torch._inductor import compile_fx

    gen = torch.Generator().manual_seed(2)
    X = torch.randn(2, 5, 6, generator=gen)
    y, sw = torch.zeros(2, 5, dtype=torch.int64), torch.ones(2, 5)
    model = TorchModel(_mlp, 3, X[0], compile=True)
    theta = torch.randn(2, model.dim, generator=gen)
    g_ok, _ = model.loss_grad(theta, X, y, sw)  # (2, 5): compiles
    capsys.readouterr()

    def fail(*args, **kwargs):
        raise RuntimeError("inductor failed on this shape")

    monkeypatch.setattr(compile_fx, "compile_fx", fail)
    X3 = torch.randn(3, 4, 6, generator=gen)
    y3, sw3 = torch.zeros(3, 4, dtype=torch.int64), torch.ones(3, 4)
    theta3 = torch.randn(3, model.dim, generator=gen)
    g, v = model.loss_grad(theta3, X3, y3, sw3)
    want, want_v = TorchModel(_mlp, 3, X[0]).loss_grad(theta3, X3, y3, sw3)
    assert torch.equal(g, want) and torch.equal(v, want_v)  # the eager numbers
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "shape (3, 4, 6) uncompiled" in err[0], err
    assert model.compiled  # the strategy did not change
    g2, _ = model.loss_grad(theta3, X3, y3, sw3)  # that shape eager again, silently
    assert torch.equal(g2, g) and capsys.readouterr().err == ""
    assert torch.equal(model.loss_grad(theta, X, y, sw)[0], g_ok)  # still compiled


def test_a_resumed_run_may_change_it(tmp_path):
    """The folder's recorded choice does not decide a resume's: the rule does, or the
    option given; a checkpoint of either choice (or of a run recorded before the option
    existed) continues under the other."""
    from fedhmc.runtime.backends import prepare
    from fedhmc.runtime.checkpoint import check_resumable

    folder = tmp_path / "run"
    folder.mkdir()
    long = _cfg(rounds=10_000, out=str(folder))  # the rule would compile it
    (folder / "config.json").write_text(json.dumps({"compile": False}))
    assert prepare(long.replace(resume=True)).compile is True  # the rule's, not the folder's
    assert prepare(long.replace(resume=True, compile=False)).compile is False  # as given
    saved = _cfg(rounds=3, compile=False).resolve().to_dict()
    before = {k: v for k, v in saved.items() if k != "compile"}  # recorded before it existed
    for old in (saved, before):
        now = _cfg(rounds=3, compile=True).resolve()
        check_resumable(old, 2, fedhmc_version(), now, {"compile"})  # --compile given
        check_resumable(old, 2, fedhmc_version(), now)


def test_a_resume_from_the_command_line_keeps_it_on_the_same_device(tmp_path):
    """``fedhmc run --resume DIR`` reads the run's settings from its config.json, the
    recorded --compile among them, unless --compile is given, or --device changes (then
    the rule decides for the new device, as for --cuda-graphs)."""
    from fedhmc.cli.options import resume_config

    saved = _cfg(rounds=3, compile=True).resolve().to_dict()
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert resume_config(str(tmp_path), {}).compile is True
    assert resume_config(str(tmp_path), {"compile": False}).compile is False
    (tmp_path / "config.json").write_text(json.dumps({**saved, "device": "cuda:0"}))
    assert resume_config(str(tmp_path), {"device": "cpu"}).compile is None  # the rule's


def fedhmc_version() -> str:
    import fedhmc

    return fedhmc.__version__


def test_each_client_decides_its_own():
    """The round's settings carry no --compile: a Flower client compiles as its own run
    config and device say (as it chooses its device)."""
    from fedhmc.runtime import wire

    cfg = _cfg(rounds=3, compile=True).resolve()
    message = wire.encode_round(cfg, 1, 100)
    assert "compile" not in message
    client = _cfg(rounds=3, compile=False).resolve()
    assert wire.apply_data(client, message).compile is False


def test_sweep_cells_are_not_told_apart_by_it():
    """A finished cell is the same cell whatever --compile it ran with, and a cell's id
    does not hash it (ids of cells that give none are as before the option was run-only)."""
    from fedhmc.sweep.cells import same_run_settings
    from fedhmc.sweep.grid import cell_id

    now = _cfg(rounds=3, compile=False).resolve().to_dict()
    before = {k: v for k, v in now.items() if k != "compile"}
    assert same_run_settings(now, {**now, "compile": True})
    assert same_run_settings(before, {**now, "compile": True})
    assert not same_run_settings(now, {**now, "seed": 1})
    settings = {"dataset": "digits", "model": "cnn", "rounds": "3"}
    plain = cell_id(settings, {})
    assert plain == "93a2c057"  # (the id it had when --compile was part of it)
    assert cell_id({**settings, "compile": "true"}, {}) == plain
    assert cell_id({**settings, "compile": "false"}, {}) == plain


def test_each_shape_compiles_once_and_gives_the_eager_numbers(monkeypatch):
    """CompiledRows calls inductor's functions without Dynamo's guards: the key (shapes,
    strides, dtypes, threads) must tell the shapes apart, and a shape past the limit is
    compiled too, in place of the one used longest ago."""
    import fedhmc.models.module as module

    monkeypatch.setattr(module, "COMPILE_MAX_SHAPES", 3)  # the check's batch, then 2 more
    gen = torch.Generator().manual_seed(1)
    dtype = torch.float64
    eager = TorchModel(_mlp, 3, torch.randn(2, 6, generator=gen, dtype=dtype), dtype=dtype)
    model = TorchModel(
        _mlp, 3, torch.randn(2, 6, generator=gen, dtype=dtype), dtype=dtype, compile=True
    )
    rows = model._compiled()
    built = []
    original = rows._compile
    monkeypatch.setattr(rows, "_compile", lambda inputs: built.append(1) or original(inputs))
    for M, B in [(3, 5), (2, 9), (3, 5), (2, 9), (4, 4), (4, 4)]:
        X = torch.randn(M, B, 6, generator=gen, dtype=dtype)
        y = torch.randint(0, 3, (M, B), generator=gen)
        sw = torch.rand(M, B, generator=gen, dtype=dtype)
        theta = torch.randn(M, eager.dim, generator=gen, dtype=dtype)
        g0, v0 = eager.loss_grad(theta, X, y, sw)
        g1, v1 = model.loss_grad(theta, X, y, sw)
        torch.testing.assert_close(g1, g0, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(v1, v0, rtol=1e-12, atol=1e-12)
    # (3, 5) and (2, 9), then (4, 4) in place of the check's batch: every shape compiled
    assert len(built) == 3
    assert model.compiled


def _digits_mlp():
    return nn.Sequential(nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 10))


def test_a_compiled_run_follows_the_eager_chain(tmp_path):
    """A whole run through the compiled gradient (its minibatches gathered ahead, as views at
    changing offsets of one tensor) stays on the eager chain up to float rounding: in
    float64, 1e-9 relative after 3 rounds (measured: 1e-16)."""
    from fedhmc.runtime.engine import run

    base = dict(
        dataset="digits",
        model=_digits_mlp,
        rounds=3,
        chains=2,
        num_clients=3,
        local_steps=2,
        leapfrog_steps=3,
        batch_size=16,
        dtype="float64",
        step_size=0.01,
        init="zeros",
    )
    eager = run(RunConfig(**base, compile=False, out=str(tmp_path / "e")), progress=False)
    comp = run(RunConfig(**base, compile=True, out=str(tmp_path / "c")), progress=False)
    assert comp.summary["model_compiled"] is True
    a, b = comp.theta_bar, eager.theta_bar
    assert float((a - b).norm() / b.norm()) < 1e-9
