"""The registry of algorithms: the only code that knows an algorithm by its name, and facts
that agree with what the config, the engine and the wire format do."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from fedhmc.algorithms import fahmc, registry
from fedhmc.errors import ConfigError
from fedhmc.runtime import wire
from fedhmc.runtime.config import ALGORITHMS, RunConfig, step_size_symbol, unused_settings
from fedhmc.runtime.problem import bytes_per_round

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("fedhmc", "server", "clients")
REGISTRY = Path("fedhmc/algorithms/registry.py")

# Comparisons against a string that happens to be an algorithm's name, and why they stay.
ALLOWED = {
    # The stale-gradient and asynchronous samplers' own update rule, ``method`` ("sghmc" or
    # "sgld"): a setting of the module, chosen for it by its registry entry, not a dispatch
    # on ``--algorithm``.
    ("fedhmc/algorithms/stale.py", 'self.method == "sghmc"'),
    ("fedhmc/algorithms/stale.py", 'method == "sghmc"'),
    # The sampler comparison (`fedhmc experiment samplers`) states each sampler's cost a
    # round and the settings it tunes: a table of the samplers it compares, by design.
    *(
        ("fedhmc/experiments/samplers.py", code)
        for code in (
            'sampler in ("fahmc", "fald")',
            'sampler == "fsgld"',
            'sampler == "dglmc"',
            'sampler in ("fahmc", "fald", "fahmc-debiased", "fsgld", "dglmc")',
            'sampler == "fald"',
            'sampler == "fahmc-debiased"',
            'sampler != "qlsd"',
            'sampler == "qlsd-pp"',
            'sampler == "qlsd-star"',
        )
    ),
}


def _names_in(node: ast.AST) -> set[str]:
    """The algorithm names a comparison operand is, or holds (a tuple, set or list)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & set(registry.NAMES)
    if isinstance(node, (ast.Tuple, ast.Set, ast.List)):
        return set().union(*(_names_in(e) for e in node.elts)) if node.elts else set()
    if isinstance(node, ast.Starred):
        return _names_in(node.value)
    return set()


def _name_comparisons(path: Path, root: Path = ROOT) -> list[tuple[str, int, str]]:
    """(file, line, code) of each comparison against an algorithm's name in ``path``."""
    source = path.read_text()
    tree = ast.parse(source, filename=str(path))
    rel = path.relative_to(root).as_posix()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            ops_ok = all(
                isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot))
                for op in node.ops
            )
            if ops_ok and any(_names_in(x) for x in (node.left, *node.comparators)):
                found.append((rel, node.lineno, ast.get_source_segment(source, node)))
        elif isinstance(node, ast.match_case):
            for sub in ast.walk(node.pattern):
                if isinstance(sub, ast.MatchValue) and _names_in(sub.value):
                    found.append((rel, sub.lineno, ast.get_source_segment(source, sub)))
    return found


def test_only_the_registry_compares_algorithm_names():
    found = [
        hit
        for top in SOURCES
        for path in sorted((ROOT / top).rglob("*.py"))
        if path.relative_to(ROOT) != REGISTRY
        for hit in _name_comparisons(path)
    ]
    unexplained = [(p, line, code) for p, line, code in found if (p, code) not in ALLOWED]
    assert not unexplained, "compare an algorithm's name outside the registry:\n" + "\n".join(
        f"{p}:{line}: {code}" for p, line, code in unexplained
    )
    stale = ALLOWED - {(p, code) for p, _, code in found}
    assert not stale, f"exceptions that no longer occur (drop them): {sorted(stale)}"


def test_the_scan_sees_a_comparison(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        'if cfg.algorithm in ("fahmc", "fald"):\n    pass\n'
        'match cfg.algorithm:\n    case "sgld":\n        pass\n'
        'ok = cfg.algorithm == "fahmc-debiased"\n'
    )
    assert len(_name_comparisons(bad, tmp_path)) == 3


def test_the_choices_are_the_registry():
    assert ALGORITHMS == registry.NAMES
    assert len(set(registry.NAMES)) == len(registry.ENTRIES)
    assert registry.DEFAULT_ALGORITHM == RunConfig().algorithm


def _cfg(name: str, **kw) -> RunConfig:
    return RunConfig(dataset="gaussian-hetero", algorithm=name, rounds=2, **kw)


def _refused(name: str, **kw) -> str | None:
    try:
        _cfg(name, **kw).resolve()
    except ConfigError as e:
        return str(e)
    return None


@pytest.mark.parametrize("name", registry.NAMES)
def test_each_entrys_facts_agree_with_behaviour(name):
    e = registry.entry(name)
    cfg = _cfg(name).resolve()
    # Its settings are its module's.
    settings = e.build_settings(cfg)
    assert isinstance(settings, e.module.Settings)
    # Partial participation.
    why = _refused(name, clients_per_round=1)
    assert (why is None) == e.partial_participation, why
    if why is not None:
        assert e.no_partial_reason in why and "its options: " in why
    # Protocols.
    for protocol in ("algorithm3", "authors"):
        assert (_refused(name, protocol=protocol) is None) == (protocol in e.protocols)
    # The trajectory options.
    assert (_refused(name, sync_unit="leapfrog") is None) == e.trajectory_options
    # Backends: the config refuses Flower, the engine refuses to run, where not supported.
    assert (_refused(name, backend="flower") is None) == ("flower" in e.backends)
    if "engine" not in e.backends:
        from fedhmc.runtime.engine import run

        with pytest.raises(ConfigError, match="add --backend flower"):
            run(cfg)
    # Leapfrog steps: fixed by the name (fald), refused where the Settings have none.
    k = e.fixed_value("leapfrog_steps")
    if k is not None:
        assert cfg.leapfrog_steps == k
    assert (_refused(name, leapfrog_steps=3) is None) == ("leapfrog_steps" in e.own)
    assert e.leapfrog == ("leapfrog_steps" in e.field_names)
    assert step_size_symbol(name) == e.step_symbol
    # Every option the sampler lacks is refused, naming its own; its own are recorded.
    for option in registry_options():
        if option not in e.own and option not in dict(e.fixed):
            why = _refused(name, **{option: _a_value(option)})
            assert why is not None and "its options: " in why, (option, why)
    recorded = cfg.recorded()
    for o in e.options:  # (a value left None by the sampler is not recorded)
        assert recorded.get(o.name) == getattr(cfg, o.name), o.name
    # Settings of the run that play no part.
    unused = unused_settings(cfg.to_dict())
    assert ("clients_per_round" in unused) == (not e.partial_participation)
    assert ("max_worker_failures" in unused) == (not e.asynchronous)
    # Messages: none for the pooled samplers, the anchor's arrays for debiased FA-HMC.
    down, up = bytes_per_round(cfg, 3, 2)
    if not e.federated:
        assert (down, up) == (0, 0)
    elif "engine" in e.backends:
        per = cfg.num_clients * cfg.chains * 3 * (8 if cfg.dtype == "float64" else 4)
        if e.module in (fahmc,):  # (FA-HMC's family: θ and momentum-free replies)
            assert (down, up) == (per, per)
        layout = e.module.layout(e.build_settings(cfg), 2)
        assert (down, up) == (len(layout.down) * per, len(layout.up) * per)
    # What a round's message says, a client decodes to the same settings.
    if e.federated and not e.asynchronous:
        decoded = wire.decode_sampler(wire.encode_round(cfg, 1, 100))
        assert decoded == e.build_settings(cfg)
        assert wire.algorithm_entry(wire.encode_round(cfg, 1, 100)) is e


def test_fald_is_fahmc_with_k_1():
    fald, fahmc_ = registry.entry("fald"), registry.entry("fahmc")
    same = dict(name="fahmc", fixed=(), summary=fahmc_.summary)
    assert dataclasses.replace(fald, **same) == fahmc_
    a = fald.build_settings(_cfg("fald").resolve())
    b = fahmc_.build_settings(_cfg("fahmc", leapfrog_steps=1).resolve())
    assert a == b and a.leapfrog_steps == 1
    assert _refused("fald", leapfrog_steps=1) is None  # (what its name means anyway)


def registry_options() -> list[str]:
    """Every sampler option (the union of all samplers' Settings)."""
    from fedhmc.runtime.config import sampler_options

    return list(sampler_options())


def _a_value(option: str):
    """A valid value of ``option`` for a sampler that has it (a refusal must name the
    sampler, not the value)."""
    from fedhmc.runtime.config import sampler_options

    o = sampler_options()[option]
    if o.choices:
        return o.choices[-1]
    return {bool: True, int: 2, float: 0.5, str: "x"}[o.type]


def test_an_entry_is_small():
    names = [f.name for f in dataclasses.fields(registry.Entry)]
    assert names == ["name", "module_path", "summary", "kind", "backends", "fixed"]
