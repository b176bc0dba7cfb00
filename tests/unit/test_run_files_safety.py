"""A run folder's files are never written through a symbolic link planted there, the files
that may reveal the data (checkpoints, samples, the ArviZ export) are readable by their
owner alone whatever the umask, and a refusal by a folder's lock names what holds it
(issue 37, items 6 and 7)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from fedhmc.errors import ConfigError
from fedhmc.runtime.lock import FolderLock

RUN = ["--dataset", "breast-cancer", "--num-clients", "3", "--rounds", "3", "--local-steps",
       "1", "--leapfrog-steps", "2", "--quiet"]  # fmt: skip


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask():
    """Every file created under umask 000, as a careless shell would: 0600 must hold."""
    old = os.umask(0)
    yield
    os.umask(old)


@pytest.fixture
def victim(tmp_path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text("precious\n")
    return path


PLANTED = [
    ".lock",
    "metrics.csv",
    "config.json",
    "summary.json",
    "samples.npy",
    "checkpoint.pt",
    "checkpoint.prev.pt",
    "checkpoint.pt.tmp",
    "summary.json.tmp",
]


@pytest.mark.parametrize("name", PLANTED)
@pytest.mark.parametrize("how", ["new", "overwrite"])
def test_a_link_planted_in_a_run_folder_is_refused_not_followed(tmp_path, cli, victim, name, how):
    out = tmp_path / "r"
    out.mkdir()
    (out / name).symlink_to(victim)
    extra = ["--overwrite"] if how == "overwrite" else []
    code, _, err = cli("run", *RUN, "--save-samples", "--chains", "2", "--out", out, *extra)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert f"{name} is a symbolic link" in lines[0], lines[0]
    assert victim.read_text() == "precious\n"
    assert sorted(p.name for p in out.iterdir()) == [name]  # nothing else written
    assert (out / name).is_symlink()


@pytest.mark.parametrize("name", ["metrics.csv", "checkpoint.pt", ".lock"])
def test_a_link_planted_before_a_resume_is_refused(tmp_path, cli, victim, name):
    out = tmp_path / "r"
    assert cli("run", *RUN, "--out", out)[0] == 0
    (out / name).unlink(missing_ok=True)
    (out / name).symlink_to(victim)
    code, _, err = cli("run", "--resume", out, "--rounds", "5", "--quiet")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "symbolic link" in err and "extending" not in err, err
    assert victim.read_text() == "precious\n"


def test_open_nofollow_refuses_a_link_and_atomic_write_replaces_one(tmp_path, victim):
    from fedhmc.runtime.output import atomic_write, open_nofollow

    link = tmp_path / "metrics.csv"
    link.symlink_to(victim)
    with pytest.raises(ConfigError, match="is a symbolic link"):
        open_nofollow(link, os.O_WRONLY | os.O_APPEND, binary=False)
    # A link at the temporary name is removed, never written through; the rename replaces
    # a link at the target itself.
    (tmp_path / "summary.json.tmp").symlink_to(victim)
    (tmp_path / "summary.json").symlink_to(victim)
    atomic_write(tmp_path / "summary.json", lambda p: p.write_text("{}"))
    assert victim.read_text() == "precious\n"
    assert not (tmp_path / "summary.json").is_symlink()
    assert (tmp_path / "summary.json").read_text() == "{}"


def test_checkpoints_samples_and_the_export_are_private_whatever_the_umask(
    tmp_path, cli, open_umask
):
    out = tmp_path / "r"
    args = ["run", *RUN, "--chains", "2", "--save-samples", "--checkpoint-every", "1"]
    assert cli(*args, "--out", out)[0] == 0
    assert mode(out / "checkpoint.pt") == 0o600
    assert mode(out / "checkpoint.prev.pt") == 0o600
    assert mode(out / "samples.npy") == 0o600
    assert mode(out / "metrics.csv") == 0o666  # the tables follow the umask
    # A resume rewrites them 0600 too, even over a file someone opened up.
    os.chmod(out / "checkpoint.pt", 0o644)
    assert cli("run", "--resume", out, "--rounds", "5", "--quiet")[0] == 0
    assert mode(out / "checkpoint.pt") == 0o600 and mode(out / "samples.npy") == 0o600
    pytest.importorskip("arviz")
    pytest.importorskip("h5netcdf")
    code, _, err = cli("export", out)
    assert code == 0, err
    assert mode(out / "posterior.nc") == 0o600


def test_a_checkpoint_save_never_follows_a_link(tmp_path, victim):
    from fedhmc.runtime import checkpoint

    (tmp_path / "checkpoint.pt.tmp").symlink_to(victim)
    with pytest.raises(ConfigError, match="symbolic link"):
        checkpoint.save(tmp_path, {"round": 1, "config": {}})
    assert victim.read_text() == "precious\n"


# ---------------------------------------------------------------- the lock's refusal


def test_a_sweep_refused_by_a_running_run_names_the_run(tmp_path, cli):
    out = tmp_path / "folder"
    with FolderLock(out, "a run"):
        code, _, err = cli("sweep", *RUN, "--grid", "seed=1,2", "--out", out)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"in use by process {os.getpid()} (a run still going)" in err, err
    assert "sweep still going" not in err
    assert not any(out.iterdir())  # the sweep wrote nothing (the run's lock is gone)


def test_a_run_refused_by_a_sweep_names_the_sweep(tmp_path):
    with FolderLock(tmp_path / "d", "a sweep"):
        with pytest.raises(ConfigError, match=r"\(a sweep still going\)"):
            FolderLock(tmp_path / "d", "a run").acquire()


def test_a_lock_file_of_the_old_form_still_names_its_process(tmp_path):
    import fcntl

    folder = tmp_path / "d"
    folder.mkdir()
    with open(folder / ".lock", "w") as f:
        f.write("process 4242")
        f.flush()
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ConfigError, match=r"in use by process 4242 \(a fedhmc command"):
            FolderLock(folder, "a sweep").acquire()
