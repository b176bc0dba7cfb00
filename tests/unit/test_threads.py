"""``--threads N|auto``: the choice, its record in summary.json, and bad values."""

import json

import pytest
import torch

from fedhmc.cli.main import main
from fedhmc.errors import ConfigError
from fedhmc.runtime.threads import AUTO_WORK, auto_threads, gradient_work, parse_threads


def test_parse_threads(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    assert parse_threads("auto") == "auto"
    assert parse_threads(None) is None
    assert parse_threads("3") == 3 and parse_threads(4) == 4
    for bad in ("0", "-1", "many", 0):
        with pytest.raises(ConfigError, match="--threads"):
            parse_threads(bad)
    with pytest.raises(ConfigError, match=r"^--threads 100000: this machine has 4 cores; use at"):
        parse_threads("100000")  # (torch would try to start them: out of memory)


def test_auto_is_one_thread_for_small_work_and_every_core_for_large():
    digits = gradient_work(num_clients=10, chains=1, batch=32, dim=650)
    fmnist = gradient_work(num_clients=10, chains=1, batch=1000, dim=7850)
    assert digits < AUTO_WORK <= fmnist
    assert auto_threads(digits, cores=8) == 1
    assert auto_threads(fmnist, cores=8) == 8
    assert auto_threads(fmnist, cores=1) == 1


@pytest.mark.parametrize("flag,expected", [("auto", 1), ("2", 2)])
def test_run_records_its_threads(tmp_path, flag, expected):
    old = torch.get_num_threads()
    try:
        out = tmp_path / "run"
        argv = ["run", "--rounds", "2", "--quiet", "--threads", flag, "--out", str(out)]
        assert main(argv) == 0
        assert json.loads((out / "summary.json").read_text())["threads"] == expected
    finally:
        torch.set_num_threads(old)


def test_bad_threads_is_one_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "--rounds", "2", "--threads", "0", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--threads must be a positive integer or 'auto'" in err[0]
    assert not out.exists()


def test_python_api_chooses_threads_as_the_command_line_does(tmp_path):
    """`run(RunConfig(...))` without ``threads`` picks ``auto`` like `fedhmc run`: one thread
    for digits' small gradient evaluations, whatever torch was set to before."""
    from fedhmc.runtime.config import RunConfig
    from fedhmc.runtime.engine import run

    old = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        res = run(RunConfig(rounds=2, out=str(tmp_path / "api")), progress=False)
        assert res.summary["threads"] == 1
        assert main(["run", "--rounds", "2", "--quiet", "--out", str(tmp_path / "cli")]) == 0
        cli = json.loads((tmp_path / "cli" / "summary.json").read_text())
        assert cli["threads"] == res.summary["threads"]
        torch.set_num_threads(3)  # a number given is used as it is
        res = run(RunConfig(rounds=2, out=str(tmp_path / "two")), progress=False, threads=2)
        assert res.summary["threads"] == 2
    finally:
        torch.set_num_threads(old)


def test_default_threads_is_auto_and_the_command_line_can_change_it():
    from fedhmc.runtime.threads import apply_threads, set_default_threads

    old = torch.get_num_threads()
    try:
        assert apply_threads(None, work=1) == 1  # auto: small work, one thread
        set_default_threads("2")  # what `fedhmc experiment --threads 2` does
        assert apply_threads(None, work=1) == 2
        set_default_threads(None)
        assert apply_threads(None, work=1) == 1
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("threads", ["auto", 2, None])
def test_fedhmc_run_leaves_the_callers_threads_as_they_were(tmp_path, threads):
    """`fedhmc.run` sets torch's threads for its run only: the caller's count (3 here, which
    no choice of the run gives on digits) is back when it returns, and so is torch's
    global random state."""
    import fedhmc

    old = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        rng = torch.get_rng_state()
        cfg = fedhmc.RunConfig(rounds=2, model="mlp", out=str(tmp_path / "r"))
        res = fedhmc.run(cfg, progress=False, threads=threads)
        assert res.summary["threads"] == (2 if threads == 2 else 1)
        assert torch.get_num_threads() == 3
        assert torch.equal(torch.get_rng_state(), rng)
    finally:
        torch.set_num_threads(old)


def test_a_backend_that_raises_leaves_the_callers_threads_too(monkeypatch):
    import fedhmc_server.simulation as sim

    from fedhmc.runner import run_config
    from fedhmc.runtime.config import RunConfig

    def fails(cfg, progress=True, on_round=None):
        torch.set_num_threads(1)  # what a backend's own choice does
        raise RuntimeError("the backend failed")

    monkeypatch.setattr(sim, "run_flower", fails)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        with pytest.raises(RuntimeError, match="the backend failed"):
            run_config(RunConfig(backend="flower"), progress=False, threads=2)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(old)
