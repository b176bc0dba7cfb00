"""A round is written once, and what clients keep travels the same way on every path.

Every federated sampler of the registry gives the engine's chain (its clients batched, what
they keep in the State's ``ClientStore``) on Flower with each client alone (what it keeps in
its node state) and with the clients co-located in one process (batched again, in the
process's store), to 1e-9.
"""

from __future__ import annotations

import pytest
from _grids import InProcessGrid, assert_same_chain
from fedhmc_clients import task
from fedhmc_clients.app import KEPT_RECORD, make_client_app
from fedhmc_clients.compute import COLOCATED_KEY
from fedhmc_server.loop import serve

from fedhmc.algorithms import registry
from fedhmc.runtime import checkpoint
from fedhmc.runtime.config import RunConfig
from fedhmc.runtime.engine import run

pytestmark = pytest.mark.slow  # Flower

SAMPLERS = [e.name for e in registry.ENTRIES if e.federated and "flower" in e.backends]
KEEPING = ("fahmc-debiased", "qlsd-star", "qlsd-pp", "fsgld", "dglmc")
OWN = {  # small settings that keep each sampler's test short
    "fsgld": {"surrogate_steps": 20, "local_steps": 3},
    "dglmc": {"local_steps": 3},
    # (3 of 5 clients, 2 chains: the clients that recompute a reference gradient make a
    # round's count uneven over them, which the co-located replies must still sum to)
    "qlsd-pp": {"clients_per_round": 3, "reference_refresh": 2, "num_clients": 5},
    "qlsd": {"clients_per_round": 2},
    "fahmc": {"clients_per_round": 2, "local_steps": 3},
}


def _cfg(tmp_path, name: str, folder: str) -> RunConfig:
    base = dict(dataset="gaussian-hetero", algorithm=name, rounds=4, num_clients=3, dim=3,
                chains=2, burn_in=0, out=str(tmp_path / folder))  # fmt: skip
    return RunConfig(**{**base, **OWN.get(name, {})})


def _flower(cfg: RunConfig, colocated: bool):
    app = make_client_app({COLOCATED_KEY: True} if colocated else None)
    grid = InProcessGrid(app, cfg.num_clients, cfg.to_run_config())
    return serve(grid, cfg), grid


@pytest.mark.parametrize("name", SAMPLERS)
def test_every_path_gives_the_engines_chain(tmp_path, name):
    engine = run(_cfg(tmp_path, name, "engine"), progress=False)
    alone, grid = _flower(_cfg(tmp_path, name, "alone"), colocated=False)
    together, _ = _flower(_cfg(tmp_path, name, "together"), colocated=True)
    batched = task._COLOCATED["store"]  # the co-located clients' last round, batched
    assert batched[1] == 4 and batched[0][1] == registry.entry(name).module.__name__
    columns = ("w2", "grad_evals", "clients")
    assert_same_chain(engine, alone, columns)
    assert_same_chain(engine, together, columns)
    # What the clients keep: the engine's store (in its checkpoint) holds it batched, each
    # node's state its own rows.
    saved, _ = checkpoint.load(tmp_path / "engine")
    store = saved["backend"]["fields"].get("clients")
    kept = [set(c.state.get(KEPT_RECORD, {})) for c in grid.contexts.values()]
    if store is None:  # (FA-HMC's clients, QLSD's without a reference, keep nothing)
        assert kept == [set()] * len(kept) and name not in KEEPING
    else:
        assert set(store["fields"]["arrays"]) == set().union(*kept) != set()
