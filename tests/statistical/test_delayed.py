"""Shared-memory delayed SGLD (Kungurtsev et al. §3): the three modes, the sequential
reference, clean shutdown after a run, a crash and a hang, and the closed-form posterior."""

import math
import multiprocessing as mp
import os

import pytest
import torch

from fedhmc.algorithms import delayed
from fedhmc.algorithms.delayed.driver import run_delayed
from fedhmc.algorithms.delayed.problem import hessian_eigs, make_regression, posterior
from fedhmc.algorithms.delayed.sgld import MODES, sequential_reference
from fedhmc.algorithms.delayed.workers import WorkerError
from fedhmc.cli.main import main
from fedhmc.errors import ConfigError

FORK = "fork" if "fork" in mp.get_all_start_methods() else "spawn"


def _gone(pids):
    """None of the processes exists any more (joined processes leave no zombie either)."""
    return all(not os.path.exists(f"/proc/{pid}") for pid in pids) and not mp.active_children()


@pytest.fixture(scope="module")
def small():
    return make_regression(100, noise_var=1.0, seed=3)


def _settings(problem, **kw):
    _, L = hessian_eigs(problem)
    base = dict(
        workers=2,
        iterations=150,
        step_size=0.1 / L,
        batch_size=8,
        chains=16,
        record_every=25,
        start_method=FORK,
        timeout=60.0,
        seed=1,
    )
    base.update(kw)
    return delayed.Settings(**base)


@pytest.fixture(scope="module")
def runs(small):
    return {mode: run_delayed(small, _settings(small, mode=mode)) for mode in MODES}


@pytest.mark.slow  # multiprocessing
@pytest.mark.parametrize("mode", MODES)
def test_every_mode_runs_to_completion_with_two_processes(runs, small, mode):
    r = runs[mode]
    assert r.snapshots.shape == (150 // 25 + 1, 16, small.dim)
    assert torch.isfinite(r.snapshots).all()
    assert r.updates[0] == 0 and r.updates[-1] == 2 * 150
    assert (r.updates.diff() > 0).all() and (r.wall_s.diff() >= 0).all()
    assert (r.snapshots[-1] != r.snapshots[0]).all()
    hist = r.staleness.sum(0)
    if mode == "sync":
        assert hist.sum() == 0
    else:  # every increment recorded once; w-con counts are exact
        assert hist.sum() == 2 * 150
    assert _gone(r.pids)


@pytest.mark.slow  # multiprocessing
def test_sync_equals_the_sequential_reference(runs, small):
    ref = sequential_reference(small, _settings(small, mode="sync"))
    torch.testing.assert_close(runs["sync"].snapshots, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.slow  # multiprocessing
def test_sync_with_the_full_data_and_three_workers_equals_the_reference(small):
    s = _settings(small, mode="sync", workers=3, batch_size=0, iterations=40, record_every=10)
    torch.testing.assert_close(
        run_delayed(small, s).snapshots, sequential_reference(small, s), rtol=1e-12, atol=1e-12
    )


@pytest.mark.slow  # multiprocessing
def test_a_worker_that_raises_stops_the_run_and_leaves_no_process(small):
    s = _settings(small, mode="sync", iterations=10_000, fail_at=(1, 5))
    with pytest.raises(WorkerError, match=r"worker 1 failed at iteration 5 .*injected") as e:
        run_delayed(small, s)
    assert _gone(e.value.pids)


@pytest.mark.slow  # multiprocessing
def test_a_crash_in_an_async_mode_under_spawn_leaves_no_process(small):
    s = _settings(small, mode="w-con", iterations=10_000, start_method="spawn", fail_at=(0, 3))
    with pytest.raises(WorkerError, match="worker 0 failed") as e:
        run_delayed(small, s)
    assert _gone(e.value.pids)


@pytest.mark.slow  # multiprocessing
def test_a_hung_worker_times_out_and_is_terminated(small):
    s = _settings(small, mode="w-icon", iterations=10_000, timeout=1.5, hang_at=(1, 2))
    with pytest.raises(WorkerError, match="timeout") as e:
        run_delayed(small, s)
    assert _gone(e.value.pids)


def test_posterior_closed_form_matches_direct_linear_algebra(small):
    mean, cov = posterior(small)
    # mean: least squares of the prior-augmented system [Φ/s; I/σ₀] β ≈ [y/s; 0]
    s, d = math.sqrt(small.noise_var), small.dim
    a = torch.cat([small.features / s, torch.eye(d, dtype=torch.float64) / small.prior_std])
    b = torch.cat([small.targets / s, torch.zeros(d, dtype=torch.float64)])
    torch.testing.assert_close(mean, torch.linalg.lstsq(a, b.unsqueeze(1)).solution[:, 0])

    # covariance: inverse Hessian of U, by autograd
    def U(beta):
        r = small.targets - small.features @ beta
        return 0.5 * r.square().sum() / small.noise_var + 0.5 * beta.square().sum()

    hess = torch.autograd.functional.hessian(U, torch.zeros(d, dtype=torch.float64))
    torch.testing.assert_close(cov, torch.linalg.inv(hess))
    torch.testing.assert_close(posterior(small, temperature=2.0)[1], 2.0 * cov)
    # the gradient used by the workers vanishes at the posterior mean (full data)
    from fedhmc.algorithms.delayed.sgld import gradient

    g = gradient(small, mean.unsqueeze(0), torch.zeros(1, dtype=torch.int64), 0, 0)
    assert g.abs().max() < 1e-8


@pytest.mark.slow  # multiprocessing
def test_sync_recovers_the_posterior_mean_and_the_exact_stationary_covariance():
    """Quadratic U: SGLD's stationary mean is exactly the posterior mean for any stable γ
    (minibatch noise included). With the full data, a sync iteration is SGLD with step
    h = Pγ, whose stationary covariance S = (A (I − hA/2))⁻¹ exactly. The chains start at
    0; after 600 iterations the slowest mode has decayed by e^{-8}, far below the MC error.
    Tolerances: 5 standard errors over R independent chains (a 20% error in the noise
    variance fails the covariance check)."""
    prob = make_regression(50, degree=2, noise_var=1.0, seed=1)
    mean, cov = posterior(prob)
    _, L = hessian_eigs(prob)
    R, P = 2000, 2
    for batch in (10, 0):
        s = delayed.Settings(
            mode="sync",
            workers=P,
            iterations=600,
            step_size=0.1 / L,
            batch_size=batch,
            chains=R,
            record_every=600,
            seed=7,
            start_method=FORK,
            timeout=120.0,
        )
        x = run_delayed(prob, s).snapshots[-1]
        se = x.std(0) / math.sqrt(R)
        assert ((x.mean(0) - mean).abs() < 5 * se).all(), (x.mean(0) - mean) / se
        if batch == 0:
            A = torch.linalg.inv(cov)
            h = P * s.step_size
            exact = torch.linalg.inv(A @ (torch.eye(3, dtype=torch.float64) - h * A / 2))
            # (x − m)ᵀ S⁻¹ (x − m) is χ²_d under the exact law: mean d, variance 2d
            z = x - mean
            stat = float((z @ torch.linalg.inv(exact) * z).sum(1).mean())
            assert abs(stat - 3) < 5 * math.sqrt(2 * 3 / R), stat


@pytest.mark.parametrize(
    "kw, text",
    [
        (dict(mode="hogwild"), "unknown mode"),
        (dict(workers=0), "workers must be an integer"),
        (dict(chains=1), "chains must be"),
        (dict(step_size=-1.0), "step-size must be positive"),
        (dict(batch_size=-2), "batch-size"),
        (dict(start_method="thread"), "start method"),
    ],
)
def test_bad_settings_are_one_line_config_errors(kw, text):
    with pytest.raises(ConfigError, match=text):
        delayed.Settings(**kw)


@pytest.mark.slow  # multiprocessing
def test_delayed_sgld_preset_quick(tmp_path):
    import json

    assert main(["experiment", "delayed-sgld", "--quick", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "delayed_sgld.json").read_text())
    assert {(r["workers"], r["mode"]) for r in summary["rows"]} == {
        (P, m) for P in (2, 4) for m in MODES
    }
    lines = (tmp_path / "delayed_sgld.csv").read_text().splitlines()
    assert lines[0].startswith("step_scale,workers,mode,iteration,updates,wall_s,w2")
    for name in ("delayed_sgld_iterations.png", "delayed_sgld_wall.png"):
        assert (tmp_path / name).stat().st_size > 1000
    assert not mp.active_children()


def test_batched_w2_matches_the_metrics_module():
    from fedhmc.analysis.metrics import gaussian_w2
    from fedhmc.experiments.delayed_sgld import w2_to

    gen = torch.Generator().manual_seed(0)
    snaps = torch.randn(3, 40, 4, generator=gen, dtype=torch.float64) * 2 + 1
    a = torch.randn(4, 4, generator=gen, dtype=torch.float64)
    mean, cov = torch.randn(4, generator=gen, dtype=torch.float64), a @ a.T + torch.eye(4)
    want = [gaussian_w2(x.mean(0), torch.cov(x.T), mean, cov) for x in snaps]
    assert w2_to(snaps, mean, cov) == pytest.approx(want, rel=1e-9, abs=1e-12)
