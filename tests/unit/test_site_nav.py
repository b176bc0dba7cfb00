"""The site's benchmark entries against the reports themselves (no mkdocs build needed).

Every run of ``python -m benchmarks`` leaves a report in docs/results/benchmarks/
(``<UTC time>.md`` and its numbers in ``<UTC time>.json``). What a report measured is read
from its JSON, and for each kind of measurement the site's nav (mkdocs.yml) and the kinds
table of the benchmarks page must link the latest report of that kind, under the kind's
name; the earlier reports are ``not_in_nav`` and listed on the benchmarks page, so that
every report is one click away.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
REPORTS = ROOT / "docs" / "results" / "benchmarks"
PREFIX = "results/benchmarks/"

KINDS = {
    "Engine throughput": lambda d: bool(d.get("shapes")),
    "Full suite and memory": lambda d: "memory" in d,
    "Threads": lambda d: "thread_counts" in d,
    "Paper scale": lambda d: "paper" in d,
    "Deployed rounds": lambda d: "deploy" in d,
    "Generic models": lambda d: "models" in d,
    "Thousands of clients": lambda d: "scale" in d,
    "GPU": lambda d: bool(d.get("gpu")),
}
"""Kind of measurement (its name in the nav and on the benchmarks page) → whether a
report's JSON holds it."""


def reports() -> dict[str, dict]:
    """Report file name (``<UTC time>.md``) → its JSON."""
    return {j.with_suffix(".md").name: json.loads(j.read_text()) for j in REPORTS.glob("2*.json")}


def latest_of_each_kind(found: dict[str, dict]) -> dict[str, str]:
    """Kind → the latest report that holds it (the names sort by time)."""
    out = {}
    for name in sorted(found):
        for kind, holds in KINDS.items():
            if holds(found[name]):
                out[kind] = name
    return out


class _Loader(yaml.SafeLoader):
    """mkdocs.yml's own tags (``!ENV``) read as plain values."""


_Loader.add_multi_constructor("!", lambda loader, suffix, node: None)


def nav_benchmarks(mkdocs_text: str) -> tuple[dict[str, str], set[str]]:
    """The nav's Benchmarks entries (title → report file) and the reports ``not_in_nav``."""
    config = yaml.load(mkdocs_text, Loader=_Loader)

    def find(items):
        for item in items:
            if isinstance(item, dict):
                for title, value in item.items():
                    if title == "Benchmarks":
                        return value
                    if isinstance(value, list) and (hit := find(value)) is not None:
                        return hit
        return None

    entries = {}
    for item in find(config["nav"]) or []:
        if isinstance(item, dict):
            ((title, path),) = item.items()
            if path.startswith(PREFIX) and path != PREFIX + "index.md":
                entries[title] = path.removeprefix(PREFIX)
    hidden = {
        line.strip().removeprefix(PREFIX)
        for line in (config.get("not_in_nav") or "").splitlines()
        if line.strip().startswith(PREFIX)
    }
    return entries, hidden


def kinds_table(index_text: str) -> dict[str, str]:
    """The benchmarks page's kinds table: kind → the report it links."""
    head = index_text.split("## Every report", 1)[0]
    rows = re.findall(r"^\| \[([^\]]+)\]\((\d{8}T\d{6}Z\.md)\) \|", head, re.M)
    return {kind: name for kind, name in rows if kind in KINDS}


def problems(mkdocs_text: str, index_text: str, found: dict[str, dict]) -> list[str]:
    out = [
        f"{name}: no kind of KINDS (add its kind here, to the nav and to the page)"
        for name, d in sorted(found.items())
        if not any(holds(d) for holds in KINDS.values())
    ]
    want = latest_of_each_kind(found)
    nav, hidden = nav_benchmarks(mkdocs_text)
    for kind, name in want.items():
        if nav.get(kind) != name:
            out.append(f"nav: {kind!r} opens {nav.get(kind)}, the latest of its kind is {name}")
        if kinds_table(index_text).get(kind) != name:
            got = kinds_table(index_text).get(kind)
            out.append(f"benchmarks page: {kind!r} links {got}, the latest of its kind is {name}")
    out += [f"nav: {title!r} is no kind of report" for title in set(nav) - set(want)]
    if hidden != set(found) - set(nav.values()):
        out.append(f"not_in_nav should list {sorted(set(found) - set(nav.values()))}")
    every = index_text.split("## Every report", 1)[-1]
    for name, d in found.items():
        kinds = ", ".join(k for k, holds in KINDS.items() if holds(d))
        if f"]({name}) | {kinds} |" not in every:
            out.append(f"benchmarks page, Every report: no row for {name} ({kinds})")
    return out


def test_every_report_has_its_json_and_the_other_way_round():
    md = {p.name for p in REPORTS.glob("2*.md")}
    assert md == set(reports()), md ^ set(reports())


def test_the_nav_and_the_page_link_the_latest_report_of_each_kind():
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    index = (REPORTS / "index.md").read_text(encoding="utf-8")
    assert problems(text, index, reports()) == []


def test_the_check_finds_a_superseded_report_and_an_unlisted_one():
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    index = (REPORTS / "index.md").read_text(encoding="utf-8")
    found = reports()
    latest = latest_of_each_kind(found)["Generic models"]
    older = sorted(n for n, d in found.items() if "models" in d)[-2]
    stale = text.replace(f"Generic models: {PREFIX}{latest}", f"Generic models: {PREFIX}{older}")
    got = problems(stale, index, found)
    assert any(p.startswith("nav: 'Generic models' opens " + older) for p in got), got
    assert any(p.startswith("not_in_nav should list") for p in got), got
    unlisted = "\n".join(line for line in index.splitlines() if f"]({older}) |" not in line)
    got = problems(text, unlisted, found)
    assert got == [f"benchmarks page, Every report: no row for {older} (Generic models)"]
    new = {**found, "20991231T000000Z.md": {"memory": {}}}
    assert any("Full suite and memory" in p for p in problems(text, index, new))
