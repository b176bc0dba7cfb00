"""Partial participation's options: refused in one line when wrong, nothing written."""

from __future__ import annotations

import pytest

from fedhmc.runtime.config import RunConfig


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--clients-per-round", "0"], "must be an integer ≥ 1"),
        (["--clients-per-round", "11"], "more than the 10 clients"),
        (["--participation", "bogus"], "invalid choice"),
        (
            ["--algorithm", "sgld", "--participation", "uniform"],
            "not an option of --algorithm sgld",
        ),
        (["--algorithm", "fahmc-debiased", "--clients-per-round", "3"], "anchor"),
        (["--min-client-size", "0"], "--min-client-size must be ≥ 1"),
    ],
)
def test_bad_participation_input_is_one_line_and_writes_nothing(cli, tmp_path, args, needle):
    out = tmp_path / "run"
    code, _, err = cli("run", "--dataset", "gaussian-hetero", "--rounds", "2",
                       "--out", str(out), *args)  # fmt: skip
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_the_dirichlet_minimum_is_an_option():
    from fedhmc.errors import DataError
    from fedhmc.runtime.problem import build_problem

    def counts(size):
        cfg = RunConfig(dataset="digits", num_clients=100, partition="dirichlet",
                        dirichlet_alpha=0.3, min_client_size=size).resolve()  # fmt: skip
        return build_problem(cfg).target.counts

    assert int(counts(1).min()) >= 1 and len(counts(1)) == 100
    with pytest.raises(DataError, match="min_size=14"):
        counts(14)


def test_quantity_sigma_is_an_option_and_refused_when_negative(cli, tmp_path):
    from fedhmc.runtime.problem import build_problem

    def counts(sigma):
        cfg = RunConfig(dataset="digits", num_clients=30, partition="quantity",
                        quantity_sigma=sigma).resolve()  # fmt: skip
        return build_problem(cfg).target.counts

    equal = counts(0.0)
    assert int(equal.max() - equal.min()) <= 1  # σ = 0: equal sizes
    spread = counts(2.0)
    assert int(spread.min()) >= 1 and int(spread.max()) > 5 * int(equal.max())
    out = tmp_path / "run"
    code, _, err = cli("run", "--dataset", "digits", "--partition", "quantity",
                       "--quantity-sigma", "-1", "--out", str(out))  # fmt: skip
    assert code == 2 and "--quantity-sigma must be" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_idle_clients_hold_only_their_data():
    """A target whose rounds draw some of its clients never builds the padded
    (N, n_max, …) tensors of all of them (its round views gather their minibatches from
    the data's rows), and the subsets' gradients are those the full target gives its
    clients."""
    import torch

    from fedhmc.algorithms import fahmc
    from fedhmc.runtime.loop import sampler_settings
    from fedhmc.runtime.problem import build_problem

    cfg = RunConfig(dataset="digits", num_clients=200, partition="quantity", rounds=3,
                    clients_per_round=7, participation="uniform", chains=2,
                    dtype="float64").resolve()  # fmt: skip
    target = build_problem(cfg).target
    settings = sampler_settings(cfg)
    state = fahmc.init(torch.zeros(2, target.dim, dtype=torch.float64), settings)
    for _ in range(3):
        state, info = fahmc.step(cfg.seed, state, target, settings)
        assert info.clients == 7
    assert "padded" not in target._store  # idle clients cost only their data's rows
    ids = [3, 150, 17]
    sub = target.subset(ids)
    theta = torch.randn(2, 3, target.dim, dtype=torch.float64)
    keys = torch.arange(6).view(2, 3)
    g_sub, e_sub = sub.grad(theta, keys, 0)
    assert sub._store and "padded" not in target._store
    full = torch.zeros(2, target.num_clients, target.dim, dtype=torch.float64)
    full[:, ids] = theta
    fkeys = torch.zeros(2, target.num_clients, dtype=torch.int64)
    fkeys[:, ids] = keys
    g_full, e_full = target.grad(full, fkeys, 0)
    torch.testing.assert_close(g_sub, g_full[:, ids])
    torch.testing.assert_close(e_sub, e_full[:, ids])
