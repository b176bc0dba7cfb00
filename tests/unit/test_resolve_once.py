"""A resolved configuration is a type of its own (``ResolvedConfig``), so that each path of
a run resolves its settings once: ``fedhmc run``, ``fedhmc.run`` on the engine, a sweep's
cell, and the Flower server (its ServerApp, then ``serve``, then ``prepare``).
"""

from __future__ import annotations

import pytest

from fedhmc.errors import ConfigError
from fedhmc.runtime.backends import prepare
from fedhmc.runtime.config import ResolvedConfig, RunConfig

TINY = dict(dataset="gaussian-hetero", num_clients=2, rounds=1, chains=1, local_steps=1)


def _count_resolutions(monkeypatch) -> list:
    """The configs that `RunConfig.resolve` resolves from now on (a ResolvedConfig's own
    ``resolve`` resolves nothing, and is not counted)."""
    calls = []
    real = RunConfig.resolve

    def counted(self):
        calls.append(self)
        return real(self)

    monkeypatch.setattr(RunConfig, "resolve", counted)
    return calls


def test_a_resolved_config_is_not_resolved_again(tmp_path):
    cfg = RunConfig(**TINY)
    resolved = cfg.resolve()
    assert type(cfg) is RunConfig and isinstance(resolved, ResolvedConfig)
    assert resolved.resolve() is resolved
    with_out = resolved.with_out(str(tmp_path))
    assert isinstance(with_out, ResolvedConfig) and with_out.out == str(tmp_path)
    assert prepare(with_out) is with_out  # nothing left to do
    prepared = prepare(resolved)  # the default folder, nothing else
    assert isinstance(prepared, ResolvedConfig) and prepared.out.startswith("runs")
    assert prepared.with_out(None) == resolved
    # A change gives a RunConfig, resolved again where it is used:
    changed = resolved.replace(rounds=20)
    assert type(changed) is RunConfig and changed.rounds == 20
    with pytest.raises(ConfigError, match="--rounds must be ≥ 1"):
        resolved.replace(rounds=0).resolve()
    # Only `resolve` makes one: a mapping read back is a RunConfig.
    back = ResolvedConfig.from_mapping(resolved.to_dict())
    assert type(back) is RunConfig and back.resolve() == resolved


def test_the_engine_paths_resolve_once(tmp_path, monkeypatch):
    import fedhmc
    from fedhmc.cli.main import main
    from fedhmc.sweep.cells import run_cell

    calls = _count_resolutions(monkeypatch)
    fedhmc.run(RunConfig(**TINY, out=str(tmp_path / "api")), progress=False)
    assert len(calls) == 1
    calls.clear()
    args = ["run", "--dataset", "gaussian-hetero", "--num-clients", "2", "--rounds", "1"]
    assert main([*args, "--chains", "1", "--quiet", "--out", str(tmp_path / "cli")]) == 0
    assert len(calls) == 1
    calls.clear()
    assert main(["run", "--resume", str(tmp_path / "cli"), "--rounds", "2", "--quiet"]) == 0
    assert len(calls) == 1
    calls.clear()
    settings = {k.replace("_", "-"): v for k, v in TINY.items()}
    assert run_cell(settings, str(tmp_path / "cell"))["status"] == "completed"
    assert len(calls) == 1


class _Started:
    """What `fedhmc_server.startup.begin` returns, for a server that runs no round."""


def _serve_without_rounds(monkeypatch) -> dict:
    """Stub the Flower server's rounds (its RoundServer and the loop): ``serve`` prepares
    its config and builds its evaluator, then hands the config to the stubs, which keep it
    in the dict returned."""
    import fedhmc_server.loop as server_loop

    seen: dict = {}

    class Rounds:
        def __init__(self, cfg, started, model, dim):
            seen["server"], self.sizes = cfg, {100: (0, 10), 101: (1, 10)}

    def loop(cfg, *args, **kwargs):
        seen["loop"] = cfg
        return "result"

    monkeypatch.setattr(server_loop, "RoundServer", Rounds)
    monkeypatch.setattr("fedhmc.runtime.loop.run_loop", loop)
    return seen


def test_the_flower_server_resolves_once(tmp_path, monkeypatch):
    from fedhmc_server.loop import serve

    seen = _serve_without_rounds(monkeypatch)
    calls = _count_resolutions(monkeypatch)
    cfg = RunConfig(**TINY, backend="flower", out=str(tmp_path / "s"))
    assert serve(None, cfg, started=_Started()) == "result"
    assert len(calls) == 1
    assert isinstance(seen["loop"], ResolvedConfig) and seen["server"] is seen["loop"]
    calls.clear()
    assert serve(None, seen["loop"], started=_Started()) == "result"  # resolved already
    assert calls == []


def test_the_server_app_resolves_once(tmp_path, monkeypatch):
    """The ServerApp resolves its run config (the context's, or the config it was made
    with), and its body takes it as it is; a config resolved already (what the simulation
    gives it, prepared) is not resolved again."""
    import fedhmc_server.app as server_app
    from flwr.app import Context, RecordDict

    seen = _serve_without_rounds(monkeypatch)
    monkeypatch.setattr(server_app, "begin", lambda *args: _Started())
    calls = _count_resolutions(monkeypatch)
    cfg = RunConfig(**TINY, backend="flower", out=str(tmp_path / "a"))
    context = Context(
        run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=cfg.to_run_config()
    )
    for given, resolutions in ((None, 1), (cfg, 1), (prepare(cfg), 0)):
        calls.clear()
        result: dict = {}
        server_app.make_server_app(given, result)(None, context)
        assert "error" not in result, result
        assert result["result"] == "result" and len(calls) == resolutions
        assert isinstance(seen["loop"], ResolvedConfig)
