"""Partial participation's options: refused in one line when wrong, nothing written."""

from __future__ import annotations

import pytest

from fedhmc.runtime.config import RunConfig


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--clients-per-round", "0"], "must be ≥ 1"),
        (["--clients-per-round", "11"], "more than the 10 clients"),
        (["--participation", "bogus"], "invalid choice"),
        (["--algorithm", "sgld", "--participation", "uniform"], "fahmc or fald"),
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
