"""A user's own data (an .npz file or tensors in memory) through runs, resumes and the
command line: recorded truthfully, refused in one line when it cannot be used."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from fedhmc import RunConfig, from_tensors, run, save_npz
from fedhmc.errors import ConfigError


def small_cnn():
    return nn.Sequential(
        nn.Conv2d(1, 2, 3, padding=1), nn.Tanh(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32, 3)
    )


def _arrays(seed=0, n=90):
    g = np.random.default_rng(seed)
    y = g.integers(0, 3, n + 30)
    x = (g.normal(size=(n + 30, 1, 8, 8)) + y[:, None, None, None]).astype(np.float32)
    return dict(
        x_train=x[:n], y_train=y[:n], x_test=x[n:], y_test=y[n:], client_train=np.arange(n) % 4
    )


def _cfg(data, out, **kw):
    base = dict(
        dataset=data,
        model=small_cnn,
        rounds=3,
        local_steps=2,
        leapfrog_steps=2,
        batch_size=8,
        burn_in=1,
        step_size=0.01,
        out=str(out),
    )
    return RunConfig(**{**base, **kw})


def test_tensors_in_memory_run_on_their_own_split_and_are_recorded(tmp_path):
    a = _arrays()
    data = from_tensors(a["x_train"], a["y_train"], a["x_test"], a["y_test"], a["client_train"])
    res = run(_cfg(data, tmp_path / "r"), progress=False)
    assert res.config.num_clients == 4 and res.config.partition == "given"
    saved = json.loads((tmp_path / "r" / "config.json").read_text())
    assert saved["dataset"] == "<in-memory tensors>"
    assert len(saved["data_sha256"]) == 64
    assert saved["model"].endswith("small_cnn")  # its import spec, or its description
    assert res.final["accuracy"] > 0.34  # better than chance on these separable classes


def test_resuming_in_memory_data_needs_the_same_data(tmp_path, cli):
    a = _arrays()
    data = from_tensors(a["x_train"], a["y_train"], a["x_test"], a["y_test"], a["client_train"])
    first = run(_cfg(data, tmp_path / "r", rounds=2), progress=False)
    again = run(_cfg(data, tmp_path / "r", rounds=3, resume=True), progress=False)
    assert again.final["round"] == 3 and first.final["round"] == 2
    b = _arrays(seed=1)
    other = from_tensors(b["x_train"], b["y_train"], b["x_test"], b["y_test"], b["client_train"])
    with pytest.raises(ConfigError, match="data_sha256|SHA-256|data-sha256"):
        run(_cfg(other, tmp_path / "r", rounds=4, resume=True), progress=False)
    code, _, err = cli("run", "--resume", tmp_path / "r", "--rounds", "4")
    assert code == 2 and "in memory" in err and err.count("\n") == 1


def test_in_memory_data_is_refused_by_the_flower_backend_in_one_line(tmp_path):
    a = _arrays()
    data = from_tensors(a["x_train"], a["y_train"], a["x_test"], a["y_test"])
    with pytest.raises(ConfigError, match="save_npz") as e:
        _cfg(data, tmp_path / "r", model="cnn", backend="flower").resolve().to_run_config()
    assert "\n" not in str(e.value)


def test_an_npz_on_the_command_line_keeps_its_split_and_image_shape(tmp_path, cli):
    a = _arrays()
    np.savez(tmp_path / "d.npz", **a)
    out = tmp_path / "r"
    code, _, err = cli(
        "run", "--dataset", tmp_path / "d.npz", "--model", "cnn", "--rounds", "2",
        "--local-steps", "2", "--batch-size", "8", "--quiet", "--out", out,
    )  # fmt: skip
    assert code == 0, err
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["partition"] == "given" and cfg["num_clients"] == 4
    assert cfg["dataset"] == str(tmp_path / "d.npz")
    import hashlib

    assert cfg["data_sha256"] == hashlib.sha256((tmp_path / "d.npz").read_bytes()).hexdigest()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model_parameters"][0] == ["conv1.weight", [6, 1, 5, 5]]
    # A partitioner of the user's choice instead of the file's split
    out2 = tmp_path / "r2"
    code, _, err = cli(
        "run", "--dataset", tmp_path / "d.npz", "--partition", "iid", "--num-clients",
        "3", "--rounds", "1", "--local-steps", "1", "--quiet", "--out", out2,
    )  # fmt: skip
    assert code == 0, err
    assert json.loads((out2 / "config.json").read_text())["num_clients"] == 3


def test_resume_refuses_a_changed_file(tmp_path, cli):
    a = _arrays()
    path = tmp_path / "d.npz"
    np.savez(path, **a)
    run(_cfg(str(path), tmp_path / "r", rounds=2, model="logistic"), progress=False)
    a["y_test"] = a["y_test"][::-1].copy()
    np.savez(path, **a)
    code, _, err = cli("run", "--resume", tmp_path / "r", "--rounds", "3")
    assert code == 2 and "SHA-256" in err and err.count("\n") == 1


def _bad(case: str, a: dict) -> dict:
    a = dict(a)
    if case == "missing":
        del a["y_test"]
    elif case == "lengths":
        a["y_train"] = a["y_train"][:-1]
    elif case == "nonfinite":
        a["x_train"] = a["x_train"].copy()
        a["x_train"][3, 0, 2, 2] = np.nan
    elif case == "labels":
        a["y_test"] = a["y_test"].copy()
        a["y_test"][0] = -1
    elif case == "clients":
        a["client_train"] = a["client_train"][:-5]
    return a


@pytest.mark.parametrize(
    "case, words",
    [
        ("missing", "y_test"),
        ("lengths", "y_train"),
        ("nonfinite", "x_train"),
        ("labels", "y_test"),
        ("clients", "client_train"),
        ("nofile", "no such file"),
        ("given-without-split", "client_train"),
        ("num-clients", "--num-clients"),
    ],
)
def test_bad_data_exits_2_in_one_line_and_writes_nothing(tmp_path, cli, case, words):
    a = _arrays()
    path = tmp_path / "d.npz"
    extra = []
    if case == "given-without-split":
        del a["client_train"]
        extra = ["--partition", "given"]
    elif case == "num-clients":
        extra = ["--num-clients", "3"]
    if case != "nofile":
        np.savez(path, **_bad(case, a))
    out = tmp_path / "r"
    code, _, err = cli("run", "--dataset", path, "--rounds", "1", "--out", out, *extra)
    assert code == 2, err
    assert words in err and err.count("\n") == 1, err
    assert not out.exists()


def test_labels_outside_the_declared_classes_are_refused():
    a = _arrays()
    from fedhmc.errors import DataError

    with pytest.raises(DataError, match="y_train|label") as e:
        from_tensors(a["x_train"], a["y_train"], a["x_test"], a["y_test"], num_classes=2)
    assert "\n" not in str(e.value)


def test_save_npz_round_trips_to_the_command_line_path(tmp_path):
    a = _arrays()
    data = from_tensors(a["x_train"], a["y_train"], a["x_test"], a["y_test"], a["client_train"])
    save_npz(data, tmp_path / "d.npz")
    from fedhmc import load_npz

    back = load_npz(tmp_path / "d.npz")
    assert torch.equal(back.X_train, data.X_train) and torch.equal(
        back.client_train, data.client_train
    )
