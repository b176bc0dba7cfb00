"""MkDocs hooks of the documentation site (``hooks:`` in mkdocs.yml).

A page line ``<!-- runconfig-options -->`` becomes the table of every ``RunConfig`` option:
its name in Python and on the command line, its default and its meaning, taken from the
fields' metadata (``help``, ``choices``) and grouped under the section comments of the class
body (``# Sampler``, ``# Run``, ...). The table is built from the code at every build, so it
cannot drift from the options that exist.

The tables that the paper experiments write (``results/paper-*/paper_*.md``) and the
benchmark reports get the whole width of the window, results tables whose cells hold a
spread ("0.8436 ± 0.0007") keep each value on one line, and no table breaks a name
(``--max-failed-rounds``) or a short value (``5e-5``) at its hyphens.
"""

from __future__ import annotations

import dataclasses
import html
import inspect
import re

MARKER = "<!-- runconfig-options -->"


def _sections(cls) -> dict[str, str]:
    """Field name → the section comment above it in the class body."""
    section, out = "", {}
    for line in inspect.getsource(cls).splitlines():
        comment = re.match(r"^    # ([A-Z][A-Za-z ,]*[a-z])\s*$", line)
        if comment:
            section = comment.group(1)
            continue
        name = re.match(r"^    ([a-z_][a-z0-9_]*)\s*:", line)
        if name:
            out[name.group(1)] = section
    return out


def _cell(text: str) -> str:
    """Markdown table cell text: no raw HTML, no column breaks."""
    return html.escape(text, quote=False).replace("|", "\\|")


def _default(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return f"`{value}`"
    return f"`{value!r}`"


def options_table() -> str:
    """The Markdown of the options tables, one per section of ``RunConfig``."""
    from fedhmc.runtime.config import RunConfig

    sections = _sections(RunConfig)
    lines: list[str] = []
    current = None
    for f in dataclasses.fields(RunConfig):
        section = sections.get(f.name, "")
        if section != current:
            current = section
            if lines:
                lines += ["", "</div>"]
            lines += ["", f"#### {section or 'Other'}", ""]
            lines += ['<div class="options" markdown="1">', ""]
            lines += ["| option | default | meaning |", "|---|---|---|"]
        meaning = _cell(f.metadata.get("help", ""))
        choices = f.metadata.get("choices")
        if choices and not all(str(c) in meaning for c in choices):
            meaning += " (one of " + ", ".join(f"`{c}`" for c in choices) + ")"
        option = f"`{f.name}`<br>`--{f.name.replace('_', '-')}`"
        lines.append(f"| {option} | {_default(f.default)} | {meaning} |")
    lines += ["", "</div>"]
    return "\n".join(lines) + "\n"


# Pages written by programs, as they are: the tables of the paper experiments
# (`paper_*.md`) and the benchmark reports. Their tables are as wide as the program makes
# them, so these pages get the whole width of the window.
_GENERATED_TABLE = re.compile(r"^results/(paper-[^/]+/paper_[^/]+|benchmarks/\d{8}T\d{6}Z)\.md$")


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (hook API)
    if _GENERATED_TABLE.match(page.file.src_uri):
        page.meta.setdefault("hide", ["navigation", "toc"])
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, options_table())
    return markdown


_TABLE = re.compile(r"<table>.*?</table>", re.S)
_SPREAD = re.compile(r"\d ± \d")
# In a table, a name in code (`--max-failed-rounds`, `paper-fmnist-K-dirichlet`), short
# code (`--out DIR`) and a cell that is one short word (`5e-5`) are not broken at their
# hyphens; longer code (a command) and prose wrap as usual.
_TOKEN_CODE = re.compile(r"<code>([^\s<]{1,32}|[^<]{1,20})</code>")
_TOKEN_CELL = re.compile(r"<(td|th)((?: [a-z]+=\"[^\"]*\")*)>([^\s<]{1,16})</\1>")


def _table(table: str) -> str:
    table = _TOKEN_CODE.sub(r'<code class="nowrap">\1</code>', table)
    table = _TOKEN_CELL.sub(r'<\1\2 class="nowrap">\3</\1>', table)
    return f'<div class="numbers">{table}</div>' if _SPREAD.search(table) else table


def on_page_content(html_text: str, page, config, files) -> str:  # noqa: ARG001 (hook API)
    """Tables of results (cells with a spread, "0.8436 ± 0.0007") keep each value on one line,
    and every table keeps names and short values whole."""
    return _TABLE.sub(lambda m: _table(m.group(0)), html_text)
