"""The plugin the documentation ships (docs/examples/fedsghmc, docs/new-sampler.md) works as
the page says, installed as a user installs it.

The package is built and installed with pip into a folder of the test's own (``pip install
--target``, from a copy, so that the build leaves nothing in docs/), which the runs get on
their PYTHONPATH: fedhmc finds ``fed-sghmc`` through the package's entry point, as after
``pip install docs/examples/fedsghmc``, and this test's own process never imports it. With
it, ``python -m fedhmc run`` runs 10 clients of a Dirichlet split of ``digits`` on the
engine, through a checkpoint and ``--resume`` (bit for bit an uninterrupted run: its
metrics and its state, the momenta its clients keep included), and on the Flower simulation
(the engine's metrics to 1e-9: its clients keep their momenta in their node state). fedhmc's
own tests of the registry read the registry, so they pass with the plugin installed too.
The sampler itself samples: on the heterogeneous Gaussian its drift correction removes the
bias that the clients' heterogeneity gives the plain federated chain.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "docs" / "examples" / "fedsghmc"
ROUNDS, HALF = 6, 3

COMMON = ("--algorithm", "fed-sghmc", "--dataset", "digits", "--num-clients", "10",
          "--partition", "dirichlet", "--chains", "2", "--friction", "5",
          "--drift-correction", "0.5", "--dtype", "float64", "--threads", "1",
          "--quiet")  # fmt: skip
"""A run of the plugin: 10 clients of a Dirichlet split, a friction of the run's and an option
of the sampler's own, both other than their defaults (they travel in every round's message)."""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The folder the package is installed into (its module and its dist-info)."""
    pytest.importorskip("setuptools")  # the package's build backend (no build isolation)
    work = tmp_path_factory.mktemp("fedsghmc")
    source = work / "source"
    shutil.copytree(
        PACKAGE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    target = work / "site"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
           "--no-build-isolation", "--target", str(target), str(source)]  # fmt: skip
    got = subprocess.run(pip, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr
    (info,) = target.glob("fedhmc_fedsghmc-*.dist-info")
    assert "fed-sghmc = fedsghmc.sampler:ENTRY" in (info / "entry_points.txt").read_text()
    return target


def _env(site: Path) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}


def _run(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fedhmc", "run", *args],
        cwd=cwd,
        env=_env(site),
        capture_output=True,
        text=True,
        timeout=600,
    )


def _rows(out: Path, drop=("wall", "time")) -> list[dict]:
    """metrics.csv's rows without the columns of wall-clock time (and ``drop``'s others)."""
    with open(out / "metrics.csv", newline="") as f:
        return [
            {k: v for k, v in row.items() if not any(d in k for d in drop)}
            for row in csv.DictReader(f)
        ]


def _state(out: Path) -> dict:
    """The sampler's state in the run's last checkpoint, field by field."""
    from fedhmc.runtime import checkpoint

    saved, _ = checkpoint.load(out)
    return saved["backend"]["fields"]


@pytest.fixture(scope="module")
def engine(site, tmp_path_factory) -> Path:
    """An uninterrupted run on the engine."""
    cwd = tmp_path_factory.mktemp("engine")
    got = _run(site, cwd, *COMMON, "--rounds", str(ROUNDS), "--out", "whole")
    assert got.returncode == 0, got.stderr
    return cwd / "whole"


def test_the_engine_runs_it_and_a_resumed_run_is_bit_identical(site, engine, tmp_path):
    first = _run(site, tmp_path, *COMMON, "--rounds", str(HALF), "--out", "parts")
    assert first.returncode == 0, first.stderr
    rest = _run(site, tmp_path, *COMMON, "--rounds", str(ROUNDS), "--resume", "parts")
    assert rest.returncode == 0, rest.stderr
    whole, parts = _rows(engine), _rows(tmp_path / "parts")
    assert len(whole) == ROUNDS and whole == parts
    assert all(int(r["clients"]) == 10 and int(r["grad_evals"]) > 0 for r in whole)
    a, b = _state(engine), _state(tmp_path / "parts")
    assert a.keys() == b.keys() and a["round"] == b["round"] == ROUNDS
    # the server's θ̄ and ḡ, and what the batched clients keep: p_c and g_c (S, N, D)
    for name in ("position", "mean_drift"):
        assert torch.equal(a[name], b[name]), name
    kept_a, kept_b = a["clients"]["fields"], b["clients"]["fields"]
    for name in ("momentum", "drift"):
        assert torch.equal(kept_a["arrays"][name], kept_b["arrays"][name]), name
    assert kept_a["arrays"]["momentum"].shape[:2] == (2, 10) and bool(kept_a["held"].all())


def test_its_options_are_checked_and_recorded(site, engine, tmp_path):
    saved = (engine / "config.json").read_text()
    assert '"drift_correction": 0.5' in saved and '"friction": 5.0' in saved
    bad = _run(site, tmp_path, *COMMON, "--rounds", "1", "--drift-correction", "2")
    assert bad.returncode != 0
    assert "--drift-correction must be a number ≥ 0 and ≤ 1, got 2.0" in bad.stderr


@pytest.mark.slow  # Flower
def test_the_flower_simulation_gives_the_engines_chain(site, engine, tmp_path):
    pytest.importorskip("flwr")
    pytest.importorskip("ray")
    flower = _run(site, tmp_path, *COMMON, "--rounds", str(ROUNDS), "--out", "flower",
                  "--backend", "flower")  # fmt: skip
    assert flower.returncode == 0, flower.stderr
    drop = ("wall", "time", "bytes")  # (Flower counts its whole messages' bytes, the engine
    a, b = _rows(engine, drop), _rows(tmp_path / "flower", drop)  # the arrays')
    assert len(a) == len(b) == ROUNDS
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            if x[k] in ("", None) or k in ("round", "clients", "failed", "grad_evals"):
                assert x[k] == y[k], (k, x[k], y[k])
                continue
            u, v = float(x[k]), float(y[k])
            assert u == pytest.approx(v, rel=1e-9, abs=1e-12), (x["round"], k, u, v)
            worst = max(worst, abs(u - v) / max(abs(u), 1e-12))
    print(f"engine against Flower: largest relative difference {worst:.3g}")


def _pytest(env: dict, *args: str) -> tuple[int, set[str]]:
    """(exit status, the ids of the tests that failed) of fedhmc's tests ``args``."""
    got = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    failed = {line.split()[1] for line in got.stdout.splitlines() if line.startswith("FAILED ")}
    return got.returncode, failed


def test_fedhmcs_registry_tests_pass_with_the_plugin_installed(site):
    """fedhmc's tests of its samplers' facts read the registry: with the plugin installed
    they check fed-sghmc too, and pass. (A test that fails without the plugin as well is
    another change's, not the plugin's.)"""
    listed = subprocess.run(
        [sys.executable, "-c", "from fedhmc.algorithms import registry; print(registry.NAMES)"],
        cwd=ROOT, env=_env(site), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert "'fed-sghmc'" in listed.stdout and "not loaded" not in listed.stderr, listed.stderr
    tests = ("tests/unit/test_registry.py", "tests/unit/test_names.py",
             "tests/unit/test_options_without_effect.py")  # fmt: skip
    code, failed = _pytest(_env(site), *tests)
    assert code in (0, 1), f"pytest exited with {code}"
    if failed:  # the same tests without the plugin
        plain = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        _, before = _pytest(plain, *sorted(failed))
        broken = sorted(t for t in failed if t not in before)
        assert not broken, f"failed with the plugin installed only: {broken}"


def test_the_drift_correction_removes_the_heterogeneity_bias(monkeypatch):
    """On the heterogeneous Gaussian (10 clients, d = 1, posterior N(41/3, 4/3)) with T = 10
    local steps, plain federated SGHMC (λ = 0) is pulled off the posterior mean by the
    clients' disagreement; with λ = 1 the mean and the variance are right (within the
    Monte Carlo error of 200 independent chains, about 0.02, and the step's bias)."""
    from fedhmc.models.targets import hetero_gaussian

    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # (no __pycache__ in docs/)
    monkeypatch.syspath_prepend(str(PACKAGE))
    monkeypatch.delitem(sys.modules, "fedsghmc", raising=False)
    monkeypatch.delitem(sys.modules, "fedsghmc.sampler", raising=False)
    from fedsghmc import sampler

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # (small tensors: one thread is the fastest)
    try:
        target = hetero_gaussian(10, 1, dtype=torch.float64)
        exact = target.posterior()
        means = {}
        for lam in (0.0, 1.0):
            settings = sampler.Settings(
                step_size=0.05, local_steps=10, friction=2.0, drift_correction=lam
            )
            state = sampler.init(torch.full((200, 1), 13.0, dtype=torch.float64), settings)
            draws = []
            for r in range(300):
                state, info = sampler.step(0, state, target, settings)
                assert info.finite and info.clients == 10
                if r >= 50:
                    draws.append(state.position[:, 0])
            x = torch.stack(draws)
            means[lam] = float(x.mean())
            if lam == 1.0:
                assert abs(float(x.var()) / exact.var - 1) < 0.06
    finally:
        torch.set_num_threads(threads)
        for name in ("fedsghmc.sampler", "fedsghmc"):
            sys.modules.pop(name, None)
    assert abs(means[1.0] - exact.mean) < 0.07
    assert means[0.0] < exact.mean - 0.12
