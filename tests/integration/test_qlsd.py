"""QLSD, QLSD* and QLSD++ (fedhmc.algorithms.qlsd): the stationary law against the exact one,
compression, options, resume, and the Flower apps against the engine."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedhmc.algorithms import qlsd, registry
from fedhmc.analysis.linear_gaussian import ula_gaussian
from fedhmc.errors import ConfigError
from fedhmc.models.targets import hetero_gaussian
from fedhmc.runtime.config import RunConfig
from fedhmc.runtime.engine import run

ROUNDS, BURN, CHAINS = 400, 80, 500


def _chain(settings: qlsd.Settings, rounds=ROUNDS, chains=CHAINS, seed=0):
    """Every chain's positions after ``BURN`` rounds (rounds − BURN, chains) of one
    coordinate of ``gaussian-hetero`` (10 clients, d = 2)."""
    target = hetero_gaussian(10, 2, dtype=torch.float64)
    state = qlsd.init(torch.zeros(chains, 2, dtype=torch.float64), settings)
    kept = []
    for r in range(rounds):
        state, info = qlsd.step(seed, state, target, settings)
        assert info.finite
        if r >= BURN:
            kept.append(state.position[:, 0].clone())
    return torch.stack(kept).numpy(), target


def _exact(target, gamma):
    w, mu, v = (target.weights.numpy(), target.means.numpy(), target.variances.numpy())
    A = float((w / v).sum())
    mean = float((w * mu / v).sum()) / A
    m, V = ula_gaussian(np.array([mean]), np.array([[A]]), gamma)
    return float(m[0]), float(V[0, 0])


def _moments_with_errors(x: np.ndarray):
    """(mean, variance, their standard errors) of draws (rounds, chains): the chains are
    independent, so each chain's time average is one draw of the mean (batch means)."""
    per_chain_mean = x.mean(0)
    per_chain_var = x.var(0)
    n = x.shape[1]
    return (
        per_chain_mean.mean(),
        per_chain_var.mean(),
        per_chain_mean.std(ddof=1) / math.sqrt(n),
        per_chain_var.std(ddof=1) / math.sqrt(n),
    )


@pytest.mark.parametrize("variant", ["plain", "star", "pp"])
def test_uncompressed_full_participation_is_ula_exactly(variant):
    # s = ∞, S = N and exact gradients (the Gaussian target's): every variant is the
    # unadjusted Langevin algorithm on f, whose law is N(μ, [A (I − γA/2)]⁻¹).
    gamma = 0.3
    x, target = _chain(qlsd.Settings(step_size=gamma, variant=variant, reference_refresh=7))
    mean, var, se_mean, se_var = _moments_with_errors(x)
    m, v = _exact(target, gamma)
    # A chain's time variance over R draws underestimates v by about v·τ/R (τ the
    # integrated autocorrelation time, ≤ 2/(γA) ≈ 9 rounds here): allowed for.
    bias = v * 10 / x.shape[0]
    assert abs(mean - m) < 5 * se_mean, (mean, m, se_mean)
    assert abs(var - v) < 5 * se_var + bias, (var, v, se_var)


def test_compression_raises_the_stationary_variance():
    gamma = 0.3
    plain, target = _chain(qlsd.Settings(step_size=gamma))
    coarse, _ = _chain(qlsd.Settings(step_size=gamma, quantization_levels=1.0))
    _, v0, _, se0 = _moments_with_errors(plain)
    m1, v1, sm1, se1 = _moments_with_errors(coarse)
    assert v1 > v0 + 5 * math.hypot(se0, se1), (v0, v1)
    m, _ = _exact(target, gamma)
    assert abs(m1 - m) < 5 * sm1  # the quantiser is unbiased: the mean stays


def test_qlsd_pp_memory_shrinks_what_is_sent():
    # The memory learns each client's gradient: Δ_c = C_s(H_c − m_c) gets small, so the
    # chain with memory is closer to uncompressed QLSD than QLSD* at the same s.
    gamma = 0.3
    pp, _ = _chain(qlsd.Settings(step_size=gamma, quantization_levels=1.0, variant="pp",
                                 reference_refresh=1000))  # fmt: skip
    star, _ = _chain(qlsd.Settings(step_size=gamma, quantization_levels=1.0, variant="star"))
    _, v_pp, _, se_pp = _moments_with_errors(pp)
    _, v_star, _, se_star = _moments_with_errors(star)
    assert v_pp < v_star - 5 * math.hypot(se_pp, se_star), (v_pp, v_star)


def _cfg(tmp_path, name, **kw):
    base = dict(dataset="gaussian-hetero", dim=3, num_clients=4, chains=3, rounds=8,
                burn_in=2, step_size=0.1, dtype="float64", out=str(tmp_path / name))  # fmt: skip
    base.update(kw)
    return RunConfig(**base)


def test_the_entries_declare_their_own_options():
    names = {e.name: {o.name for o in e.options} for e in registry.ENTRIES if e.name[:4] == "qlsd"}
    assert names["qlsd"] == {"step_size", "quantization_levels", "clients_per_round"}
    assert names["qlsd-star"] == names["qlsd"] | {"mode_steps"}
    assert names["qlsd-pp"] == names["qlsd"] | {"reference_refresh"}


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        (dict(algorithm="qlsd", quantization_levels=0.0), "--quantization-levels must be"),
        (dict(algorithm="qlsd", quantization_levels=2.5), "--quantization-levels must be"),
        (dict(algorithm="qlsd", reference_refresh=5), "--reference-refresh is not an option"),
        (dict(algorithm="fahmc", quantization_levels=4.0),
         r"not an option of --algorithm fahmc \(its options: --step-size, --leapfrog-steps, "
         "--local-steps, --rho"),
        (dict(algorithm="qlsd", participation="uniform", clients_per_round=2),
         "--participation is not an option"),
        (dict(algorithm="qlsd-pp", reference_refresh=0), "--reference-refresh must be"),
    ],
)  # fmt: skip
def test_bad_options_are_refused_in_one_line(tmp_path, kw, words):
    algorithm = kw.pop("algorithm")
    with pytest.raises(ConfigError, match=words) as e:
        _cfg(tmp_path, "x", algorithm=algorithm).replace(**kw).resolve()
    assert "\n" not in str(e.value)
    if "not an option of --algorithm" in str(e.value):
        assert "its options: --step-size" in str(e.value)


def test_a_run_option_qlsd_lacks_is_refused_naming_its_own(tmp_path):
    with pytest.raises(ConfigError, match="^--temperature is not an option of --algorithm qlsd"):
        _cfg(tmp_path, "x", algorithm="qlsd", temperature=0.5).resolve()


def test_options_read_back_from_config_json(tmp_path):
    cfg = _cfg(tmp_path, "a", algorithm="qlsd-pp", quantization_levels=4, reference_refresh=3)
    result = run(cfg, progress=False)
    saved = (tmp_path / "a" / "config.json").read_text()
    assert '"quantization_levels": 4.0' in saved and '"reference_refresh": 3' in saved
    again = RunConfig.from_mapping(__import__("json").loads(saved))
    assert again.option("quantization_levels") == 4.0 and again.option("reference_refresh") == 3
    assert result.history[-1]["bytes_up"] > 0


@pytest.mark.parametrize("algorithm", ["qlsd-pp", "fsgld", "dglmc"])
def test_a_sampler_whose_clients_keep_state_is_not_resumed_on_flower(tmp_path, algorithm):
    cfg = _cfg(tmp_path, "x", algorithm=algorithm, backend="flower", resume=True, step_size=1e-3)
    with pytest.raises(ConfigError, match=f"--algorithm {algorithm} cannot be resumed on Flower"):
        cfg.resolve()
    _cfg(tmp_path, "y", algorithm="qlsd-star", backend="flower", resume=True).resolve()


def test_qlsd_pp_resumes_bit_exactly(tmp_path):
    kw = dict(algorithm="qlsd-pp", quantization_levels=2, reference_refresh=3,
              clients_per_round=3, rounds=10, checkpoint_every=1)  # fmt: skip
    whole = run(_cfg(tmp_path, "whole", **kw), progress=False)
    run(_cfg(tmp_path, "part", **{**kw, "rounds": 5}), progress=False)
    resumed = run(_cfg(tmp_path, "part", **kw).replace(resume=True), progress=False)
    assert torch.equal(whole.theta_bar, resumed.theta_bar)
    a = (tmp_path / "whole" / "metrics.csv").read_text().splitlines()
    b = (tmp_path / "part" / "metrics.csv").read_text().splitlines()
    cols = a[0].split(",")
    keep = [i for i, c in enumerate(cols) if "wall" not in c and "time" not in c]
    for ra, rb in zip(a[1:], b[1:], strict=True):
        x, y = ra.split(","), rb.split(",")
        assert [x[i] for i in keep] == [y[i] for i in keep]


@pytest.mark.slow  # Flower
@pytest.mark.parametrize("algorithm", ["qlsd", "qlsd-star", "qlsd-pp"])
def test_flower_apps_equal_the_engine(tmp_path, algorithm):
    from _grids import assert_same_chain, flower_run

    cfg = _cfg(tmp_path, "e", algorithm=algorithm, quantization_levels=4, clients_per_round=3)
    if algorithm == "qlsd-pp":
        cfg = cfg.replace(reference_refresh=3)
    engine = run(cfg, progress=False)
    flower, seen = flower_run(cfg.replace(out=str(tmp_path / "f")))
    # The reply carries Δ_c alone (QLSD*'s set-up rounds: ∇U_c); QLSD++'s memory and the
    # reference gradient stay in the node's state.
    setup = cfg.num_clients if algorithm == "qlsd-star" else 0  # (its set-up: one round)
    assert [set(r) for r in seen.replies[:setup]] == [{"grad"}] * setup
    assert {frozenset(r) for r in seen.replies[setup:]} == {frozenset({"delta"})}
    want = {"qlsd": set(), "qlsd-star": {"reference_grad", "reference_round"}}
    assert seen.kept[-1] == want.get(algorithm, {"memory", "reference_grad", "reference_round"})
    assert_same_chain(engine, flower, ("w2", "mean_error", "grad_evals", "clients", "bits_up"))


def test_qlsd_star_set_up_descends_to_the_mode_and_sets_the_reference_there():
    """--mode-steps M: M rounds of federated gradient descent on f from θ₀ = 0, exactly
    θ_M − m = (1 − γA)^M (θ₀ − m) on the Gaussian (full-data gradients), then θ* = θ_M."""
    target = hetero_gaussian(4, 2, dtype=torch.float64)
    post = target.posterior()
    A, m = 1 / post.var, post.mean
    gamma, steps = 0.05, 30
    s = registry.entry("qlsd-star").build_settings({"step_size": gamma, "mode_steps": steps})
    assert qlsd.setup_rounds(s) == steps + 1
    state = qlsd.init(torch.zeros(3, 2, dtype=torch.float64), s)
    evals = 0
    for _ in range(steps + 1):
        state, info = qlsd.step(0, state, target, s)
        evals += info.grad_evals
    want = m + (1 - gamma * A) ** steps * (0 - m)
    torch.testing.assert_close(state.reference, torch.full((3, 2), want, dtype=torch.float64))
    assert (
        torch.equal(state.position, state.reference) and state.round == state.reference_round == 0
    )
    assert evals == (steps + 1) * 3 * 4  # one full gradient a client and chain a round
    # Round 1 finds every client's ∇f^(c)(θ*) kept: two minibatch gradients each, no more.
    _, info = qlsd.step(0, state, target, s)
    assert info.grad_evals == 2 * 3 * 4
