"""One meaning per name: what --step-size is under each algorithm, said in --help,
recorded in config.json and used in sweep cell ids."""

from __future__ import annotations

import json

import pytest

from fedhmc.algorithms import registry
from fedhmc.runtime.config import ALGORITHMS, RunConfig, step_size_meaning, step_size_symbol
from fedhmc.sweep.grid import cell_id


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_has_one_step_size_meaning(algorithm):
    symbol = step_size_symbol(algorithm)
    e = registry.entry(algorithm)
    (option,) = [o for o in e.options if o.name == "step_size"]
    from fedhmc.runtime.config import sampler_options

    assert algorithm in sampler_options()["step_size"].help  # its meaning, in --help
    if symbol == "step":  # its own Settings say what its step is
        assert step_size_meaning(algorithm) == option.help
        return
    euler = algorithm in ("sghmc", "sgld", "async-sghmc", "async-sgld")
    assert symbol == ("h" if euler else "eta")
    assert step_size_meaning(algorithm).startswith("h," if euler else "η,")
    assert option.help.startswith("h," if euler else "η,")


@pytest.mark.parametrize("algorithm, prefix", [("fahmc", "eta0.01"), ("sgld", "h0.01")])
def test_cell_ids_name_the_step_by_its_symbol(algorithm, prefix):
    cid = cell_id({"algorithm": algorithm, "step-size": "0.01"}, {"step-size": "0.01"})
    assert cid.startswith(prefix + "-"), cid


def test_config_json_records_what_the_step_size_means(tmp_path):
    from fedhmc.runtime.engine import run

    cfg = RunConfig(dataset="gaussian-hetero", algorithm="sgld", rounds=2, chains=2,
                    out=str(tmp_path / "r"))  # fmt: skip
    run(cfg, progress=False)
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["step_size_means"] == step_size_meaning("sgld")


def test_config_json_reads_back_as_a_config(tmp_path):
    from fedhmc.runtime.engine import run

    out = tmp_path / "r"
    run(RunConfig(dataset="gaussian-hetero", rounds=2, chains=2, out=str(out)), progress=False)
    saved = json.loads((out / "config.json").read_text())
    assert RunConfig.from_mapping({**saved, "out": str(out)}).step_size == saved["step_size"]
