"""Files that are not what they claim to be end in one line, exit status 2, and nothing left
behind (issue 37, items 1 and 6): an ``.npy`` or a text file given as ``--dataset x.npz``, a
zip of garbage, an ``.npz`` that would expand beyond memory, a truncated ``samples.npy``,
a checkpoint whose header is JSON of the wrong type, a CSV whose header is cut; and the
messages that say what is wrong (too few draws asks for rounds; a refused resume prints
only its refusal and names the folder's setting when the user gave none)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fedhmc.errors import ConfigError, DataError

RUN = ["--rounds", "3", "--local-steps", "1", "--leapfrog-steps", "2", "--quiet"]


def one_line(code: int, err: str) -> str:
    assert code == 2, err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def arrays(n: int = 30) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "x_train": rng.normal(size=(n, 4)).astype(np.float32),
        "y_train": np.arange(n) % 2,
        "x_test": rng.normal(size=(10, 4)).astype(np.float32),
        "y_test": np.arange(10) % 2,
    }


def npy_as_npz(folder: Path) -> Path:
    path = folder / "x.npz"
    with open(path, "wb") as f:
        np.save(f, np.zeros((10, 3)))
    return path


def text_as_npz(folder: Path) -> Path:
    path = folder / "t.npz"
    path.write_text("x_train,y_train\n1,2\n")
    return path


def garbage_zip(folder: Path) -> Path:
    path = folder / "g.npz"
    with zipfile.ZipFile(path, "w") as z:
        for name in ("x_train", "y_train", "x_test", "y_test"):
            z.writestr(f"{name}.npy", b"not an array at all")
    return path


def expanding_npz(folder: Path) -> Path:
    """A 1 kB .npz whose x_train declares 10^6 × 10^6 float64 (8 TB once read): only the
    .npy headers are written, as a compressed file that expands would hold them."""
    path = folder / "huge.npz"
    layouts = {
        "x_train": ((10**6, 10**6), "<f8"),
        "y_train": ((10**6,), "<i8"),
        "x_test": ((2, 10**6), "<f8"),
        "y_test": ((2,), "<i8"),
    }
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, (shape, descr) in layouts.items():
            with z.open(f"{name}.npy", "w", force_zip64=True) as f:
                header = {"descr": descr, "fortran_order": False, "shape": shape}
                np.lib.format.write_array_header_1_0(f, header)
                f.write(b"\0" * 64)
    return path


BAD_FILES = [
    (npy_as_npz, "single .npy array"),
    (text_as_npz, "text file"),
    (garbage_zip, "member x_train.npy is not a NumPy array"),
    (expanding_npz, "of memory"),
]


@pytest.mark.parametrize("make,says", BAD_FILES, ids=lambda x: getattr(x, "__name__", None))
@pytest.mark.parametrize("command", ["run", "data", "sweep"])
def test_a_file_that_is_no_npz_is_one_line_for_every_command(tmp_path, cli, make, says, command):
    path = make(tmp_path)
    out = tmp_path / "out"
    argv = {
        "run": ["run", "--dataset", path, "--out", out, *RUN],
        "data": ["data", "--dataset", path],
        "sweep": ["sweep", "--dataset", path, "--grid", "seed=1,2", "--out", out, *RUN],
    }[command]
    code, _, err = cli(*argv)
    line = one_line(code, err)
    assert says in line, line
    assert "pickled" not in line and "has shape ()" not in line, line
    assert not out.exists()


def test_load_npz_names_what_the_file_is(tmp_path):
    from fedhmc_datasets.user import load_npz

    with pytest.raises(DataError, match="text file") as e:
        load_npz(text_as_npz(tmp_path))
    assert "pickled" not in str(e.value)
    with pytest.raises(DataError, match="not a NumPy array") as e:
        load_npz(garbage_zip(tmp_path))
    assert "shape ()" not in str(e.value)
    obj = tmp_path / "obj.npz"
    np.savez(obj, **{**arrays(), "x_train": np.array([object()] * 30, dtype=object)})
    with pytest.raises(DataError, match="x_train holds Python objects"):
        load_npz(obj)
    empty = tmp_path / "empty.npz"
    empty.write_bytes(b"")
    with pytest.raises(DataError, match="empty"):
        load_npz(empty)
    # A member whose data are cut short: its header reads, its array does not.
    good = tmp_path / "good.npz"
    np.savez(good, **arrays())
    cut = tmp_path / "cut.npz"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(cut, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            dst.writestr(
                info.filename, data[: len(data) // 2] if "x_train" in info.filename else data
            )
    with pytest.raises(DataError, match="not a readable .npz"):
        load_npz(cut)
    assert load_npz(good).X_train.shape == (30, 4)  # a good file still loads


def test_an_npz_that_expands_beyond_memory_is_refused_before_it_is_read(tmp_path):
    from fedhmc_datasets.user import load_npz, npz_client_count

    path = expanding_npz(tmp_path)
    with pytest.raises(DataError, match=r"needs about 12 TB of memory, more than"):
        load_npz(path)
    with pytest.raises(DataError, match="of memory"):
        npz_client_count(path)


# ---------------------------------------------------------------- run folders


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A small finished run with 3 chains and 4 kept draws (samples.npy)."""
    from fedhmc import RunConfig, run

    out = tmp_path_factory.mktemp("runs") / "r"
    cfg = RunConfig(
        dataset="breast-cancer",
        num_clients=3,
        rounds=6,
        burn_in=2,
        chains=3,
        local_steps=1,
        leapfrog_steps=2,
        save_samples=True,
        out=str(out),
    )
    run(cfg, progress=False)
    return out


def copy_run(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("command", ["diagnose", "export"])
def test_a_truncated_samples_file_is_one_line(tmp_path, cli, finished_run, command):
    if command == "export":  # without ArviZ, export refuses first for want of it
        pytest.importorskip("arviz")
    run = copy_run(finished_run, tmp_path / "r")
    data = (run / "samples.npy").read_bytes()
    (run / "samples.npy").write_bytes(data[: len(data) - 9])
    code, _, err = cli(command, run)
    line = one_line(code, err)
    assert "samples.npy is damaged" in line, line
    assert not (run / "posterior.nc").exists() and not (run / "posterior.nc.tmp").exists()


def test_samples_of_the_wrong_shape_are_one_line(tmp_path, cli, finished_run):
    run = copy_run(finished_run, tmp_path / "r")
    np.save(run / "samples.npy", np.zeros(5, dtype=np.float32))
    line = one_line(*cli("diagnose", run)[::2])
    assert "samples.npy has shape (5,)" in line, line


@pytest.mark.parametrize(
    "header",
    [b"[1, 2, 3]", b"42", b'"checkpoint"', b"null", b'{"format": 2, "version": 7}', b"{not json"],
    ids=["list", "number", "string", "null", "wrong-field-type", "not-json"],
)
def test_a_checkpoint_header_of_the_wrong_type_is_one_line(tmp_path, cli, finished_run, header):
    from fedhmc.runtime import checkpoint

    run = copy_run(finished_run, tmp_path / "r")
    for name in (checkpoint.NAME, checkpoint.PREVIOUS):
        path = run / name
        if path.exists():
            payload = path.read_bytes().split(b"\n", 1)[1]
            path.write_bytes(header + b"\n" + payload)
    with pytest.raises(ConfigError, match="cannot resume") as e:
        checkpoint.load(run)
    assert "\n" not in str(e.value)
    assert checkpoint.peek(run) is None
    before = (run / "metrics.csv").read_text()
    line = one_line(*cli("run", "--resume", run, "--rounds", "8", "--quiet")[::2])
    assert "cannot resume" in line and "unusable" in line, line
    assert (run / "metrics.csv").read_text() == before


def test_diagnose_with_enough_chains_but_few_draws_asks_for_rounds(tmp_path, cli):
    from fedhmc import RunConfig, run

    out = tmp_path / "few"
    cfg = RunConfig(
        dataset="breast-cancer", num_clients=3, rounds=5, burn_in=3, chains=3,
        local_steps=1, leapfrog_steps=2, save_samples=True, out=str(out),
    )  # fmt: skip
    run(cfg, progress=False)
    line = one_line(*cli("diagnose", out)[::2])
    assert "only 2 draws per chain (3 chains)" in line, line
    assert "--chains" not in line and f"--resume {out} --rounds 7" in line, line
    # One chain: that is what is missing, and it says so.
    one = tmp_path / "one"
    run(cfg.replace(chains=1, out=str(one)), progress=False)
    line = one_line(*cli("diagnose", one)[::2])
    assert "1 chain" in line and "--chains" in line, line


@pytest.mark.parametrize("where", ["file", "run-folder"])
def test_plot_of_a_csv_whose_header_is_cut_says_so(tmp_path, cli, finished_run, where):
    run = copy_run(finished_run, tmp_path / "r")
    text = (run / "metrics.csv").read_text()
    header, rest = text.split("\n", 1)
    (run / "metrics.csv").write_text(header[:20] + "\n" + rest)
    line = one_line(*cli("plot", run / "metrics.csv" if where == "file" else run)[::2])
    assert "header" in line and "is cut" in line, line
    assert not list(run.glob("plot-*"))
    # Only part of a header line, no row at all.
    alone = tmp_path / "alone.csv"
    alone.write_text(header[:20])
    line = one_line(*cli("plot", alone)[::2])
    assert "header" in line and "is cut" in line, line


def test_plot_of_a_whole_csv_still_works(tmp_path, cli, finished_run):
    run = copy_run(finished_run, tmp_path / "r")
    code, out, err = cli("plot", run / "metrics.csv")
    assert code == 0, err
    assert any(p.suffix == ".png" for p in run.glob("plot-*"))


# ---------------------------------------------------------------- resume refusals


def test_a_refused_resume_prints_only_its_refusal(tmp_path, cli, finished_run):
    run = copy_run(finished_run, tmp_path / "r")
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    code, out, err = cli("run", "--resume", run, "--rounds", "12", "--step-size", "0.5")
    line = one_line(code, err)
    assert "--step-size" in line and "drop --step-size" in line, line
    assert "extending" not in err and out == ""
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    # Accepted, the same extension prints its note.
    code, _, err = cli("run", "--resume", run, "--rounds", "8", "--quiet")
    assert code == 0 and "extending" in err, err


def test_a_resume_refused_over_a_setting_never_given_names_the_folder(tmp_path, cli, finished_run):
    run = copy_run(finished_run, tmp_path / "r")
    config = json.loads((run / "config.json").read_text())
    config["model"] = "cnn"  # the folder's config.json no longer matches its checkpoint
    (run / "config.json").write_text(json.dumps(config))
    line = one_line(*cli("run", "--resume", run, "--rounds", "8", "--quiet")[::2])
    assert "drop --model" not in line, line
    assert "the run's folder holds another --model" in line, line


def test_check_compatible_words_the_refusal_by_what_was_given():
    from fedhmc import __version__
    from fedhmc.runtime.checkpoint import check_compatible

    saved, now = {"model": "logistic", "rounds": 5}, {"model": "mlp", "rounds": 5}
    with pytest.raises(ConfigError, match="drop --model"):
        check_compatible(saved, now, __version__, given={"model", "rounds"})
    with pytest.raises(ConfigError, match="folder holds another --model") as e:
        check_compatible(saved, now, __version__, given={"rounds"})
    assert "drop" not in str(e.value)
    with pytest.raises(ConfigError, match="only the rounds and the device may change") as e:
        check_compatible(saved, now, __version__)
    assert "drop" not in str(e.value)
