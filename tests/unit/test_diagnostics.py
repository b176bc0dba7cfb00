"""Rank-normalised split R̂ and bulk ESS on cases with known answers.

Tolerances. For n·m iid draws the estimated ESS has a relative standard deviation of about
3-4 % at n·m = 8,000-20,000 (measured over 20-50 seeds: 4.3 % at 4,000 draws, 3.8 % for
an AR(1) with φ = 0.6 and 3.5 % with φ = −0.5 at 20,000 draws), so ±15 % is ≥ 4 standard
deviations. For iid draws R̂ − 1 ≈ (χ²_{2m−1}/(2m−1) − 1) / (2n') with n' draws per half
chain, i.e. a few 10⁻⁴ at n' = 1,000: the 1.01 bound is far away. One chain of four
shifted by 2 standard deviations gives R̂ = 1.32, one with 3× the spread 1.15, a common
trend of 3 standard deviations 1.26: > 1.1 separates them from the iid case (≤ 1.005).
"""

import json
import math

import numpy as np
import pytest
import torch

from fedhmc.analysis.diagnostics import convergence_summary, ess, ess_basic, mcse_mean, split_rhat


def ar1(phi: float, n: int, m: int, seed: int) -> np.ndarray:
    """m independent stationary AR(1) chains x_t = φ x_{t−1} + √(1−φ²) ε_t, (n, m)."""
    gen = np.random.default_rng(seed)
    z = gen.standard_normal((n, m))
    x = np.empty((n, m))
    x[0] = z[0]
    c = math.sqrt(1.0 - phi * phi)
    for t in range(1, n):
        x[t] = phi * x[t - 1] + c * z[t]
    return x


def test_iid_draws_have_rhat_one_and_full_ess():
    iid = np.random.default_rng(0).standard_normal((2000, 4, 3))
    r = split_rhat(iid)
    assert r.shape == (3,) and float(r.max()) < 1.01
    for e in (ess(iid), ess_basic(iid)):
        assert np.all((e > 0.85 * 8000) & (e < 1.15 * 8000)), e


def test_rhat_flags_a_shifted_chain_and_a_rescaled_chain():
    iid = np.random.default_rng(1).standard_normal((1000, 4))
    shifted = iid.copy()
    shifted[:, 0] += 2.0
    assert float(split_rhat(shifted)) > 1.1
    # Same location, three times the spread: invisible to the classic R̂ of the means,
    # caught by the folded (|x − median|) part of the rank-normalised R̂.
    wide = iid.copy()
    wide[:, 0] *= 3.0
    assert float(split_rhat(wide)) > 1.1


def test_rhat_flags_a_trend_within_chains():
    # Every chain drifts the same way: the chains agree with each other, their halves do not.
    gen = np.random.default_rng(2)
    trend = np.linspace(0.0, 3.0, 1000)[:, None] + gen.standard_normal((1000, 4))
    assert float(split_rhat(trend)) > 1.1


@pytest.mark.parametrize("phi", [0.6, -0.5])
def test_ess_of_ar1_chains(phi):
    n, m = 5000, 4
    x = ar1(phi, n, m, seed=3)
    expected = n * m * (1 - phi) / (1 + phi)  # > n·m for the antithetic φ < 0
    for e in (float(ess(x)), float(ess_basic(x))):
        assert 0.85 * expected < e < 1.15 * expected, (e, expected)


def test_bulk_ess_is_invariant_to_monotone_maps():
    x = ar1(0.8, 1000, 4, seed=4)
    assert float(ess(np.exp(x))) == pytest.approx(float(ess(x)), rel=1e-12)
    # The basic ESS is not rank based: exp(x) has heavier tails and a different value.
    assert float(ess_basic(np.exp(x))) != pytest.approx(float(ess_basic(x)), rel=1e-3)


def test_mcse_of_the_mean_of_iid_draws_is_sd_over_root_n():
    x = np.random.default_rng(5).standard_normal((2000, 4, 2))
    se = mcse_mean(x)
    assert np.all(np.abs(se * math.sqrt(8000) - 1.0) < 0.1), se


def test_shapes_types_and_summary():
    x = np.random.default_rng(6).standard_normal((500, 3, 5))
    t = torch.as_tensor(x)
    np.testing.assert_array_equal(split_rhat(t), split_rhat(x))
    np.testing.assert_array_equal(ess(t), ess(x))
    assert split_rhat(x[:, :, 0]).shape == () and ess(x[:, :, 0]).shape == ()
    assert ess(x).shape == (5,)
    s = convergence_summary(t)
    assert set(s) == {"rhat_max", "ess_min", "ess_median", "ess_tail_min", "draws", "chains"}
    assert s["draws"] == 500 and s["chains"] == 3
    assert s["rhat_max"] < 1.01 and 0.85 * 1500 < s["ess_min"] <= s["ess_median"]
    # Odd length: the middle draw is dropped; ties (a discrete coordinate) are fine.
    odd = np.random.default_rng(7).integers(0, 3, (101, 2)).astype(float)
    assert math.isfinite(float(split_rhat(odd))) and math.isfinite(float(ess(odd)))
    # A constant coordinate has no R̂; convergence_summary skips it.
    const = np.concatenate([x, np.ones((500, 3, 1))], axis=2)
    assert math.isnan(float(split_rhat(const)[-1]))
    assert convergence_summary(const)["rhat_max"] == pytest.approx(s["rhat_max"])


def test_too_few_draws():
    with pytest.raises(ValueError):
        split_rhat(np.zeros((3, 2)))
    with pytest.raises(ValueError):
        ess(np.zeros(10))


def test_tail_ess_equals_arviz():
    az = pytest.importorskip("arviz")
    from fedhmc.analysis.diagnostics import ess_tail

    x = np.random.default_rng(3).standard_t(3, size=(300, 4, 2)).cumsum(0) * 0.1
    want = az.ess(az.convert_to_dataset(x.transpose(1, 0, 2)), method="tail")["x"].values
    np.testing.assert_allclose(ess_tail(x), want, rtol=1e-8)


def test_convergence_warning_speaks_up_only_when_it_should():
    from fedhmc.analysis.diagnostics import convergence_summary, warning

    g = np.random.default_rng(0)
    assert warning(convergence_summary(g.normal(size=(400, 4, 3)))) is None  # iid: ESS ≈ 1600
    stuck = convergence_summary(g.normal(size=(400, 4, 3)).cumsum(0))  # random walks
    text = warning(stuck)
    assert "R-hat" in text and "bulk ESS" in text and "tail ESS" in text and "\n" not in text
    assert warning(convergence_summary(g.normal(size=(400, 1, 3)).cumsum(0))) is None  # one chain


def test_short_chains_are_too_short_to_judge_not_unconverged():
    from fedhmc.analysis.diagnostics import RELIABLE_DRAWS, summary_rows, warning

    g = np.random.default_rng(1)
    short = convergence_summary(g.normal(size=(RELIABLE_DRAWS - 1, 4, 3)).cumsum(0))
    text = warning(short)
    assert text.startswith("the chains are too short to judge convergence") and "\n" not in text
    assert f"{RELIABLE_DRAWS - 1} draws per chain" in text and "unreliable" in text
    assert "not converged" not in text and "R-hat 1." not in text  # no bare figures
    assert summary_rows(short) == [
        (
            "R-hat, ESS",
            f"not shown: unreliable with {RELIABLE_DRAWS - 1} draws per chain (need ~100)",
        )
    ]
    enough = convergence_summary(g.normal(size=(RELIABLE_DRAWS, 4, 3)))
    assert [k for k, _ in summary_rows(enough)] == ["R-hat max", "ESS min"]
    assert "too short" not in (warning(enough) or "")


def test_constant_draws_have_no_figures_and_say_so():
    from fedhmc.analysis.diagnostics import warning

    diag = convergence_summary(np.ones((200, 3, 4)))
    assert math.isnan(diag["rhat_max"]) and math.isnan(diag["ess_tail_min"])
    assert "did not move" in warning(diag)


def _diagnose(out, capsys, *extra) -> list[str]:
    from fedhmc.cli.main import main

    capsys.readouterr()
    assert main(["diagnose", str(out), *extra]) == 0
    return capsys.readouterr().out.splitlines()


def test_a_short_run_says_it_is_too_short_and_diagnose_names_the_parameters(tmp_path, capsys):
    from fedhmc.cli.main import main

    out = tmp_path / "r"
    argv = ["run", "--chains", "4", "--rounds", "12", "--local-steps", "1", "--quiet"]
    assert main([*argv, "--out", str(out), "--save-samples"]) == 0
    err = capsys.readouterr().err
    assert "warning: the chains are too short to judge convergence" in err
    summary = json.loads((out / "summary.json").read_text())
    assert "draws per chain; R-hat and ESS need about 100" in summary["convergence_warning"]
    lines = _diagnose(out, capsys, "--top", "3")
    assert "figures below are unreliable" in lines[0] and "R-hat max" not in lines[0]
    assert "parameter" in lines[1] and len(lines) == 2 + 3 + 1
    assert lines[2].split()[0].startswith(("weight[", "bias["))
    # The last line says how to get enough draws, with the command.
    assert lines[-1].startswith("warning: the chains are too short")
    assert f"fedhmc run --resume {out} --rounds " in lines[-1]
    # Constant draws: one line, no traceback (they once raised KeyError: 'ess_tail_min').
    draws = np.load(out / "samples.npy")
    np.save(out / "samples.npy", np.ones_like(draws))
    lines = _diagnose(out, capsys)
    assert len(lines) == 1 and "the chains did not move" in lines[0]


def test_diagnose_hints_a_resume_that_names_the_users_model(cli, tmp_path):
    """A run of the user's own model resumes only with --model again: diagnose's hint to run
    more rounds says so."""
    out = tmp_path / "run"
    code, _, err = cli(
        "run", "--model", "torch.nn:Linear", "--model-arg", "in_features=64;out_features=10",
        "--rounds", "3", "--burn-in", "0", "--chains", "2", "--save-samples", "--out", out,
        "--quiet",
    )  # fmt: skip
    assert code == 0, err
    code, _, err = cli("diagnose", out)
    assert code == 2 and f"fedhmc run --resume {out} --model torch.nn:Linear --rounds" in err
