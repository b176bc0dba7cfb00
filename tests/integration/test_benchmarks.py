"""The benchmark suite runs (smoke mode) and the engine's fast kernels give the same numbers."""

from __future__ import annotations

import json

import pytest
import torch

from fedhmc.models.nets import LogisticRegression
from fedhmc.models.targets import DataTarget


def reference_loss_grad(model, theta, X, y, sw):
    """The textbook form: X̃ᵀ (sw ⊙ (softmax(X̃W) − onehot(y))) and the weighted NLL."""
    W = theta.view(theta.shape[0], model.num_features + 1, model.num_classes)
    logp = torch.log_softmax(torch.bmm(X, W), -1)
    onehot = torch.nn.functional.one_hot(y, model.num_classes).to(X.dtype)
    resid = (logp.exp() - onehot) * sw.unsqueeze(-1)
    nll = -(logp.gather(-1, y.unsqueeze(-1)).squeeze(-1) * sw).sum(-1)
    return torch.bmm(X.transpose(1, 2), resid).reshape(theta.shape), nll


def _prepare_rows(model, X):
    """``model.prepare`` of every row of X (M, B, F): prepare takes examples (n, *features)
    and flattens feature shapes, so the rows are folded into the examples and back."""
    M, B, F = X.shape
    return model.prepare(X.reshape(M * B, F)).view(M, B, -1)


@pytest.mark.parametrize("M,B,F,C", [(3, 7, 5, 4), (2, 50, 30, 2), (10, 32, 64, 10)])
@pytest.mark.parametrize("need_value", [True, False])
def test_logistic_kernel_matches_textbook_form(M, B, F, C, need_value):
    gen = torch.Generator().manual_seed(M * B + F)
    model = LogisticRegression(F, C)
    X = _prepare_rows(model, torch.randn(M, B, F, generator=gen, dtype=torch.float64))
    y = torch.randint(0, C, (M, B), generator=gen)
    sw = torch.rand(M, B, generator=gen, dtype=torch.float64) * 3
    theta = torch.randn(M, model.dim, generator=gen, dtype=torch.float64)
    g, nll = model.loss_grad(theta, X, y, sw, need_value)
    g_ref, nll_ref = reference_loss_grad(model, theta, X, y, sw)
    torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-12)
    if need_value:
        torch.testing.assert_close(nll, nll_ref, rtol=1e-12, atol=1e-12)
    else:
        assert nll is None


def test_minibatch_rows_are_the_indexed_rows():
    """The flat index_select (reused buffers) gives X[c, idx] for every chain and client."""
    gen = torch.Generator().manual_seed(1)
    model = LogisticRegression(3, 2)
    parts = [
        (torch.randn(n, 3, generator=gen), torch.randint(0, 2, (n,), generator=gen))
        for n in (9, 5, 12)
    ]
    target = DataTarget(model, parts, batch_size=4, prior_std=1.0)
    keys = torch.arange(6, dtype=torch.int64).view(2, 3) * 7919 + 3
    for index in (0, 1, 5):
        X, y, _ = target._batch(keys, index, 2)
        idx = target._flat_indices(keys, index) - target._row_offsets  # clients' own rows
        cid = torch.arange(3).view(1, 3, 1)
        assert torch.equal(X, target.X[cid, idx]) and torch.equal(y, target.y[cid, idx])
    # A buffer reused by the next call must not have leaked into an earlier result's use.
    X0 = target._batch(keys, 0, 2)[0].clone()
    target._batch(keys, 1, 2)
    assert torch.equal(target._batch(keys, 0, 2)[0], X0)


def test_smoke_suite_runs_and_writes_results(tmp_path, capsys):
    from benchmarks.suite import main

    assert main(["--smoke", "--only", "digits", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "digits N=10 B=32" in text and "engine" in text
    (js,) = tmp_path.glob("*.json")
    rows = json.loads(js.read_text())["shapes"]
    assert [r["shape"].split(" D=")[0] for r in rows] == ["digits N=10 B=32"]
    assert all(r["engine_evals_per_s"] > 0 and r["engine/best"] > 0 for r in rows)
    assert list(tmp_path.glob("*.md"))


def test_unknown_group_is_one_clear_line(capsys):
    from benchmarks.suite import cli

    assert cli(["--smoke", "--only", "nonsense"]) == 2
    err = capsys.readouterr().err
    assert "unknown group" in err and "digits" in err and "Traceback" not in err


@pytest.mark.parametrize("S,N,n,F,C", [(1, 3, 6, 4, 2), (3, 2, 9, 5, 4)])
@pytest.mark.parametrize("need_value", [True, False])
def test_shared_full_batch_kernel_matches_textbook_form(S, N, n, F, C, need_value):
    gen = torch.Generator().manual_seed(S * 100 + n)
    model = LogisticRegression(F, C)
    X = _prepare_rows(model, torch.randn(N, n, F, generator=gen, dtype=torch.float64))
    y = torch.randint(0, C, (N, n), generator=gen)
    sw = torch.rand(N, n, generator=gen, dtype=torch.float64) * 3
    theta = torch.randn(S, N, model.dim, generator=gen, dtype=torch.float64)
    g, nll = model.shared_loss_grad(theta, X, y, sw, need_value)
    for s in range(S):
        g_ref, nll_ref = reference_loss_grad(model, theta[s], X, y, sw)
        torch.testing.assert_close(g[s], g_ref, rtol=1e-12, atol=1e-12)
        if need_value:
            torch.testing.assert_close(nll[s], nll_ref, rtol=1e-12, atol=1e-12)


def test_smoke_models_group_runs_and_reports(tmp_path, capsys):
    """``--only models`` (smoke): the generic path against the built-ins, and LeNet-5."""
    from benchmarks.suite import main

    assert main(["--smoke", "--only", "models", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "generic / hand-written" in text and "LeNet-5" in text
    assert "CUDA: " in text
    (js,) = tmp_path.glob("*.json")
    models = json.loads(js.read_text())["models"]
    assert {r["model"] for r in models["generic"]} == {"logistic", "mlp"}
    for row in models["generic"]:
        assert row["evals_per_s"]["hand-written"] > 0
        assert all(r > 0 for r in row["ratios"].values())
        assert set(row["batching"].values()) == {"vmap"}
    cnn = models["cnn"]
    assert cnn["auto_batching"] in ("vmap", "loop")
    (row,) = cnn["rows"]
    assert {"fedhmc vmap", "fedhmc loop", "autograd loop"} <= set(row["evals_per_s"])
    assert row["fedhmc/autograd loop"] > 0


def test_generic_logistic_modules_match_the_builtin():
    """The benchmark's nn.Module twins compute the built-in logistic regression's numbers."""
    from benchmarks.models import affine, linear
    from fedhmc.models.module import TorchModel

    gen = torch.Generator().manual_seed(3)
    F, C, M, B = 6, 4, 3, 5
    builtin = LogisticRegression(F, C)
    X = torch.randn(M, B, F, generator=gen, dtype=torch.float64)
    y = torch.randint(0, C, (M, B), generator=gen)
    sw = torch.rand(M, B, generator=gen, dtype=torch.float64)
    theta = torch.randn(M, builtin.dim, generator=gen, dtype=torch.float64)
    g_ref, nll_ref = builtin.loss_grad(theta, _prepare_rows(builtin, X), y, sw)
    twin = TorchModel(affine, C, X[0], {"num_features": F, "num_classes": C}, dtype=torch.float64)
    g, nll = twin.loss_grad(theta, X, y, sw)
    torch.testing.assert_close(g, g_ref)
    torch.testing.assert_close(nll, nll_ref)
    lin = TorchModel(linear, C, X[0], {"num_features": F, "num_classes": C}, dtype=torch.float64)
    W = theta.view(M, F + 1, C)
    theta_lin = torch.cat([W[:, :F].transpose(1, 2).reshape(M, -1), W[:, F]], dim=1)
    g, nll = lin.loss_grad(theta_lin, X, y, sw)
    torch.testing.assert_close(nll, nll_ref)
    g_W = torch.cat([g[:, : F * C].view(M, C, F).transpose(1, 2), g[:, F * C :].view(M, 1, C)], 1)
    torch.testing.assert_close(g_W.reshape(M, -1), g_ref)


def test_smoke_scale_group_runs_and_reports(tmp_path, capsys):
    """``--only scale`` (smoke): rounds at N = 100 and 1,000 with the same S."""
    from benchmarks.common import fmnist_available
    from benchmarks.suite import main

    if not fmnist_available():
        pytest.skip("needs Fashion-MNIST (Debian's dataset-fashion-mnist)")
    assert main(["--smoke", "--only", "scale", "--out", str(tmp_path)]) == 0
    assert "Cross-device scale" in capsys.readouterr().out
    (js,) = tmp_path.glob("*.json")
    rows = json.loads(js.read_text())["scale"]["rounds"]
    assert [r["num_clients"] for r in rows] == [100, 1000]
    assert all(r["clients_per_round"] == 10 and r["s_per_round"] > 0 for r in rows)
    assert rows[0]["ratio"] == 1.0
