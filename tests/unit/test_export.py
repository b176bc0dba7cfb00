"""`fedhmc export RUN_DIR --to arviz`: the draws as an ArviZ InferenceData (netCDF)."""

from __future__ import annotations

import builtins
import json

import numpy as np
import pytest

from fedhmc.analysis.diagnostics import ess, split_rhat
from fedhmc.cli.main import main
from fedhmc.errors import ConfigError
from fedhmc.runtime.config import RunConfig
from fedhmc.runtime.engine import run
from fedhmc.runtime.export import export_arviz, param_layout

az = pytest.importorskip("arviz", reason="the optional extra fedhmc[arviz] is not installed")


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "run"
    cfg = RunConfig(chains=4, rounds=40, burn_in=8, save_samples=True, out=str(out))
    run(cfg, progress=False)
    return out


def test_export_names_the_parameters_and_keeps_the_draws(digits_run, capsys):
    assert main(["export", str(digits_run), "--to", "arviz"]) == 0
    assert "posterior.nc" in capsys.readouterr().out
    idata = az.from_netcdf(str(digits_run / "posterior.nc"))
    post = idata.posterior
    assert dict(post["weight"].sizes) == {"chain": 4, "draw": 32, "class": 10, "feature": 64}
    assert dict(post["bias"].sizes) == {"chain": 4, "draw": 32, "class": 10}
    samples = np.load(digits_run / "samples.npy")  # (draws, chains, d), θ = W[(F+1), C]
    W = samples.reshape(32, 4, 65, 10)
    np.testing.assert_array_equal(post["weight"].values, W[:, :, :64, :].transpose(1, 0, 3, 2))
    np.testing.assert_array_equal(post["bias"].values, W[:, :, 64, :].transpose(1, 0, 2))
    # Sample stats: the metrics of each draw's round; the config as attributes.
    stats = idata.sample_stats
    np.testing.assert_array_equal(stats["round"].values[0], np.arange(9, 41))
    rows = {int(r.split(",")[0]): r for r in (digits_run / "metrics.csv").read_text().split()[1:]}
    assert set(stats["accuracy"].values[:, -1]) == {float(rows[40].split(",")[2])}
    cfg = json.loads(idata.attrs["fedhmc_config"])
    assert cfg["chains"] == 4 and idata.attrs["fedhmc_dataset"] == "digits"
    assert idata.attrs["fedhmc_status"] == "completed" and idata.attrs["fedhmc_chains"] == 4


def test_az_summary_agrees_with_fedhmcs_rhat_and_ess(digits_run):
    export_arviz(digits_run)
    idata = az.from_netcdf(str(digits_run / "posterior.nc"))
    s = az.summary(idata, kind="diagnostics")
    samples = np.load(digits_run / "samples.npy")
    F, C = 64, 10
    idx = {f"weight[{c}, {f}]": f * C + c for c in range(C) for f in range(F)}
    idx.update({f"bias[{c}]": F * C + c for c in range(C)})
    ours_rhat, ours_ess = split_rhat(samples), ess(samples)
    names = list(s.index)
    assert len(names) == 650
    want_rhat = np.array([ours_rhat[idx[n]] for n in names])
    want_ess = np.array([ours_ess[idx[n]] for n in names])
    # az.summary rounds to 2 decimals (R-hat) and to whole draws (ESS).
    np.testing.assert_allclose(s["r_hat"].values, want_rhat, atol=0.0051)
    np.testing.assert_allclose(s["ess_bulk"].values, want_ess, atol=0.51)
    # Unrounded, they are the same numbers.
    np.testing.assert_allclose(
        az.rhat(idata)["weight"].values.reshape(-1)[:5],
        [ours_rhat[idx[f"weight[0, {f}]"]] for f in range(5)],
        rtol=1e-12,
    )
    np.testing.assert_allclose(
        az.ess(idata, method="bulk")["bias"].values, ours_ess[F * C :], rtol=1e-10
    )
    summary = json.loads((digits_run / "summary.json").read_text())["diagnostics"]
    assert summary["rhat_max"] == pytest.approx(float(az.rhat(idata).to_array().max()), rel=1e-10)
    assert summary["ess_min"] == pytest.approx(
        float(az.ess(idata, method="bulk").to_array().min()), rel=1e-10
    )


def test_layouts():
    mlp = param_layout(
        {"model": "mlp", "hidden": "5,4"},
        {"model": "mlp", "model_shapes": {"num_features": 3, "num_classes": 2}},
        3 * 5 + 5 + 5 * 4 + 4 + 4 * 2 + 2,
    )
    assert [(n, d, i.shape) for n, d, i in mlp] == [
        ("layer0_weight", ("hidden1", "input"), (5, 3)),
        ("layer0_bias", ("hidden1",), (5,)),
        ("layer1_weight", ("hidden2", "hidden1"), (4, 5)),
        ("layer1_bias", ("hidden2",), (4,)),
        ("layer2_weight", ("class", "hidden2"), (2, 4)),
        ("layer2_bias", ("class",), (2,)),
    ]
    flat = np.concatenate([i.reshape(-1) for _, _, i in mlp])
    np.testing.assert_array_equal(flat, np.arange(flat.size))  # state_dict order
    gauss = param_layout({"model": "logistic"}, {"dim": 7}, 7)
    assert [(n, d) for n, d, _ in gauss] == [("theta", ("parameter",))]


def test_clear_errors(tmp_path, monkeypatch, capsys):
    out = tmp_path / "nosamples"
    run(RunConfig(rounds=2, out=str(out)), progress=False)
    assert main(["export", str(out)]) == 2
    assert "--save-samples" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "missing")]) == 2
    assert "not a fedhmc run directory" in capsys.readouterr().err.replace("is it a", "not a")

    real_import = builtins.__import__

    def no_arviz(name, *args, **kwargs):
        if name == "arviz":
            raise ImportError("no arviz")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_arviz)
    with pytest.raises(ConfigError, match=r"fedhmc\[arviz\]"):
        export_arviz(out)
