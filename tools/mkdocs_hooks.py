"""MkDocs hooks of the documentation site (``hooks:`` in mkdocs.yml).

A page line ``<!-- algorithms -->`` becomes the table of ``--algorithm``'s choices, read
from the algorithm registry. A page line ``<!-- runconfig-options -->`` becomes the table of
every ``RunConfig`` option: its name in Python and on the command line, its default and its
meaning, taken from the fields' metadata (``help``, ``choices``) and grouped under the
section comments of the class body (``# Sampler``, ``# Run``, ...). The table is built from
the code at every build, so it cannot drift from the options that exist.

The command-line page is made the same way from the ``argparse`` parsers of ``fedhmc``
(``fedhmc.cli.main.build_parser``): ``<!-- cli-commands -->`` is followed by the table of
the subcommands, and ``<!-- cli-options: NAME -->`` by the options of ``fedhmc NAME``, one
table per group of its ``--help``, each block up to its end line (``<!-- /cli-commands -->``,
``<!-- /cli-options -->``). A subcommand's option that means the same as ``fedhmc run``'s
(the same help) is named in one line instead of a second row. The page is committed with
its tables written out, so that it reads whole as a file; ``python tools/mkdocs_hooks.py
--write-cli`` writes them anew after an option changes (tests/unit/test_cli_page.py fails
until it is run), and the build writes them anew too. A page that has the commands table
but no ``cli-options`` line for one of the commands fails the (strict) build.

A page line ``<!-- include: FILE -->`` becomes the text of ``FILE``, a path from the
repository root, as it is: the changelog page shows CHANGELOG.md this way, so the site and
the file cannot differ. Its links to ``docs/...`` point to the site's pages; its other
relative links, to files outside the site, point to the repository.

The tables that the paper experiments write (``results/paper-*/paper_*.md``) and the
benchmark reports get the whole width of the window, results tables whose cells hold a
spread ("0.8436 ± 0.0007") keep each value on one line, no table breaks a name
(``--max-failed-rounds``) or a short value (``5e-5``) at its hyphens, and no inline code
anywhere breaks at a hyphen.
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import inspect
import logging
import posixpath
import re

MARKER = "<!-- runconfig-options -->"
ALGORITHMS = "<!-- algorithms -->"
CLI_COMMANDS = "<!-- cli-commands -->"
CLI_OPTIONS = re.compile(r"^<!-- cli-options: ([a-z-]+) -->$", re.M)

log = logging.getLogger("mkdocs.hooks.fedhmc")  # under "mkdocs": a warning fails --strict


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
    lines += ["", "</div>", *sampler_options_table()]
    return "\n".join(lines) + "\n"


def sampler_options_table() -> list[str]:
    """The Markdown lines of the samplers' options: each option once per meaning, with the
    samplers that give it that meaning (read from their Settings)."""
    from fedhmc.runtime.config import option_meanings, sampler_options

    lines = ["", "#### Sampler options", ""]
    lines += [
        "Each sampler declares its options in its own `Settings`; an option that several "
        "samplers declare is one option, and a run refuses the options its sampler lacks.",
        "",
    ]
    lines += ['<div class="options" markdown="1">', ""]
    lines += ["| option | samplers | default | meaning |", "|---|---|---|---|"]
    for name, merged in sampler_options().items():
        for o, who in option_meanings(name).values():
            meaning = _cell(o.help)
            if o.choices and not all(str(c) in meaning for c in o.choices):
                meaning += " (one of " + ", ".join(f"`{c}`" for c in o.choices) + ")"
            samplers = ", ".join(f"`{w}`" for w in who)
            option = f"`{name}`<br>`{merged.flag}`"
            lines.append(f"| {option} | {samplers} | {_default(o.default)} | {meaning} |")
    lines += ["", "</div>"]
    return lines


# ------------------------------------------------------------------ the command-line page
def cli_commands() -> dict[str, argparse.ArgumentParser]:
    """``fedhmc``'s subcommands (name → parser), in the order of ``fedhmc --help``."""
    return dict(_subparsers(_fedhmc_parser()).choices)


def _fedhmc_parser() -> argparse.ArgumentParser:
    from fedhmc.cli.main import build_parser

    return build_parser()


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


# An option or a word with a hyphen in help text (--rounds, rounds-to, paper-fmnist-*):
# one line each.
_HYPHENATED = re.compile(
    r"(?<![\w\\-])(?:--?[A-Za-z][\w.\\*/=:]*|[\w.\\*/=:]+-[\w.\\*/=:]+)(?:-[\w.\\*/=:]+)*"
)


def _text(text: str) -> str:
    """Help text as a Markdown table cell: code spans (`...`) as they are, and in the rest
    no emphasis, link or HTML (``paper-fmnist-*``, ``fedhmc[tensorboard]``, ``<cell>``),
    and no word broken at its hyphens (``--burn-in``)."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # outside code spans
        part = re.sub(r"([*_\[\]|])", r"\\\1", html.escape(parts[i], quote=False))
        parts[i] = _HYPHENATED.sub(r'<span class="nowrap">\g<0></span>', part)
    return "`".join(parts)  # a pipe in code does not split a row; escaped, it would show


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The action's help as ``--help`` shows it (``%(default)s`` and ``%%`` expanded)."""
    return parser._get_formatter()._expand_help(action) if action.help else ""


def _option(action: argparse.Action) -> str:
    """The option column: its flags, and its value's name where it takes one."""
    if not action.option_strings:  # a positional argument
        return f"`{action.metavar or action.dest.upper()}`"
    flags = " / ".join(f"`{flag}`" for flag in action.option_strings)
    if action.nargs == 0 or action.choices is not None:  # a flag; choices: in the meaning
        return flags
    metavar = action.metavar or action.dest.upper()
    return f"{flags} `{metavar}`"


def _meaning(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    meaning = _text(_help(parser, action))
    choices = [str(c) for c in action.choices or ()]
    if choices and not all(c in meaning for c in choices):
        listed = ", ".join(f"`{c}`" for c in choices)
        meaning = f"{meaning} (one of {listed})" if meaning else f"one of {listed}"
    return meaning


def _shown(action: argparse.Action) -> bool:
    return not isinstance(action, argparse._HelpAction) and action.help != argparse.SUPPRESS


def cli_commands_table() -> str:
    """The Markdown table of ``fedhmc``'s subcommands, each linked to its section."""
    sub = _subparsers(_fedhmc_parser())
    helps = {a.dest: a.help or "" for a in sub._choices_actions}
    lines = ["| command | what it does |", "|---|---|"]
    for name in sub.choices:
        lines.append(f"| [`fedhmc {name}`](#fedhmc-{name}) | {_text(helps.get(name, ''))} |")
    return "\n".join(lines) + "\n"


def cli_options_table(name: str) -> str:
    """The Markdown of ``fedhmc NAME``'s options: a table per group of its ``--help`` (the
    positional arguments with the ungrouped options), then the options it shares with
    ``fedhmc run``, named in one line."""
    commands = cli_commands()
    parser = commands[name]
    run = commands.get("run")
    same_as_run = set()
    if run is not None and name != "run":
        run_help = {a.option_strings[0]: _help(run, a) for a in run._actions if a.option_strings}
        for a in parser._actions:
            if (
                _shown(a)
                and a.option_strings
                and run_help.get(a.option_strings[0]) == _help(parser, a)
            ):
                same_as_run.add(a)
    groups: list[tuple[str, list[argparse.Action]]] = []
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if _shown(a) and a not in same_as_run]
        general = group.title in ("positional arguments", "options", "optional arguments")
        if general and groups and groups[0][0] == "":
            groups[0][1].extend(actions)
        elif actions:
            groups.append(("" if general else group.title, actions))
    lines: list[str] = []
    for title, actions in groups:
        if len(groups) > 1:
            lines += ["", f"**{(title or 'general').capitalize()}**", ""]
        lines += ["| option | meaning |", "|---|---|"]
        lines += [f"| {_option(a)} | {_meaning(parser, a)} |" for a in actions]
    shared = [a for a in parser._actions if a in same_as_run]
    if shared:
        names = ", ".join(" / ".join(f"`{f}`" for f in a.option_strings) for a in shared)
        lines += [
            "",
            f"{'It also takes' if groups else 'It takes'} these options of "
            f"[`fedhmc run`](#fedhmc-run), which mean the same here: {names}.",
        ]
    return "\n".join(lines).strip("\n") + "\n"


# A marker line and, when the page has been written out, its generated block up to its end
# line (a block holds no other marker).
CLI_BLOCK = re.compile(
    r"^<!-- (cli-(commands)|cli-(options): ([a-z-]+)) -->$"
    r"(?:\n(?:(?!<!-- cli-).)*?^<!-- /cli-(?:commands|options) -->$)?",
    re.M | re.S,
)
CLI_PAGE = "docs/cli.md"
WRITE_CLI = "python tools/mkdocs_hooks.py --write-cli"
"""The command that writes the command-line page's tables anew (from the repository root)."""


def expand_cli(markdown: str) -> tuple[str, list[str]]:
    """The page with the block after each ``cli-commands`` and ``cli-options`` line written
    anew from the parsers, and the problems: a line naming no command, or (on the page with
    the commands table) a command without its options line."""
    problems: list[str] = []
    commands = cli_commands()
    named = CLI_OPTIONS.findall(markdown)
    for name in named:
        if name not in commands:
            problems.append(f"<!-- cli-options: {name} -->: fedhmc has no command {name!r}")
    if CLI_COMMANDS in markdown:
        for name in commands:
            if name not in named:
                problems.append(f"fedhmc {name} has no <!-- cli-options: {name} --> line")

    def block(m: re.Match) -> str:
        marker, kind, name = m.group(1), m.group(2) or m.group(3), m.group(4)
        if kind == "options" and name not in commands:
            return m.group(0)
        table = cli_commands_table() if kind == "commands" else cli_options_table(name)
        return f"<!-- {marker} -->\n\n{table}\n<!-- /cli-{kind} -->"

    return CLI_BLOCK.sub(block, markdown), problems


def write_cli_page(root: str = ".") -> bool:
    """Write the command-line page's tables anew; whether the page changed."""
    from pathlib import Path

    page = Path(root) / CLI_PAGE
    text = page.read_text(encoding="utf-8")
    new, problems = expand_cli(text)
    for problem in problems:
        print(f"{CLI_PAGE}: {problem}")
    if new != text:
        page.write_text(new, encoding="utf-8")
    return new != text


# Pages written by programs, as they are: the tables of the paper experiments
# (`paper_*.md`) and the benchmark reports. Their tables are as wide as the program makes
# them, so these pages get the whole width of the window.
_GENERATED_TABLE = re.compile(r"^results/(paper-[^/]+/paper_[^/]+|benchmarks/\d{8}T\d{6}Z)\.md$")


def algorithms_table() -> str:
    """The table of ``--algorithm``'s choices, from ``fedhmc.algorithms.registry``: what each
    is, where it runs, and its protocols and partial participation."""
    from fedhmc.algorithms import registry

    rows = [
        "| `--algorithm` | what | where it runs | `--protocol` | partial participation |",
        "|---|---|---|---|---|",
    ]
    where = {"engine": "engine", "flower": "Flower"}
    for e in registry.ENTRIES:
        name = f"`{e.name}`" + (" (default)" if e.name == registry.DEFAULT_ALGORITHM else "")
        runs = ", ".join(where[b] for b in e.backends)
        protocols = ", ".join(f"`{p}`" for p in e.protocols)
        partial = "yes" if e.partial_participation else "no"
        rows.append(f"| {name} | {_cell(e.summary)} | {runs} | {protocols} | {partial} |")
    return "\n".join(rows)


INCLUDE = re.compile(r"^<!-- include: ([\w./-]+) -->$", re.M)
_LINK = re.compile(r"\]\((?![a-z]+:|#|/)([^)\s]+)\)")


def include(markdown: str, page_uri: str, root, repo_url: str | None) -> str:
    """``markdown`` with each ``<!-- include: FILE -->`` line replaced by the text of
    ``root/FILE``; the included links to ``docs/X`` made relative to the page at
    ``page_uri`` (a path under docs/), and its other relative links into the repository."""
    from pathlib import Path

    def link(m: re.Match) -> str:
        target = m.group(1)
        if target.startswith("docs/"):
            here = posixpath.dirname(page_uri) or "."
            return f"]({posixpath.relpath(target.removeprefix('docs/'), here)})"
        if repo_url:
            return f"]({repo_url.rstrip('/')}/blob/main/{target})"
        return m.group(0)

    def text(m: re.Match) -> str:
        return _LINK.sub(link, (Path(root) / m.group(1)).read_text(encoding="utf-8"))

    return INCLUDE.sub(text, markdown)


def _repo_url(config) -> str | None:
    """The repository's address, from the site's footer link (``extra.social``)."""
    for item in (config.get("extra") or {}).get("social") or []:
        if "github" in str(item.get("icon", "")):
            return item.get("link")
    return None


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (hook API)
    if INCLUDE.search(markdown):
        root = posixpath.dirname(config["config_file_path"])
        markdown = include(markdown, page.file.src_uri, root, _repo_url(config))
    if _GENERATED_TABLE.match(page.file.src_uri):
        page.meta.setdefault("hide", ["navigation", "toc"])
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, options_table())
    if ALGORITHMS in markdown:
        markdown = markdown.replace(ALGORITHMS, algorithms_table())
    if CLI_COMMANDS in markdown or CLI_OPTIONS.search(markdown):
        markdown, problems = expand_cli(markdown)
        for problem in problems:
            log.warning("%s: %s", page.file.src_uri, problem)
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


# Inline code elsewhere (running text, lists, headings, the rest of a table's code): never
# broken at a hyphen. Code without spaces (`--max-failed-rounds`) stays on one line; code
# with spaces (a command) may still wrap at its spaces, but each word of it that has a
# hyphen stays whole. Code blocks (<pre>) are left as they are.
_PRE = re.compile(r"(<pre\b.*?</pre>)", re.S)
_INLINE_CODE = re.compile(r"<code>([^<]*-[^<]*)</code>")
_HYPHENATED_WORD = re.compile(r"\S*-\S*")


def _inline_code(m: re.Match) -> str:
    text = m.group(1)
    if not re.search(r"\s", text):
        return f'<code class="nowrap">{text}</code>'
    return "<code>" + _HYPHENATED_WORD.sub(r'<span class="nowrap">\g<0></span>', text) + "</code>"


def keep_hyphens(html_text: str) -> str:
    """``html_text`` with its inline code (outside <pre>) marked so that no hyphen breaks."""
    parts = _PRE.split(html_text)
    for i in range(0, len(parts), 2):  # the parts between code blocks
        parts[i] = _INLINE_CODE.sub(_inline_code, parts[i])
    return "".join(parts)


def on_page_content(html_text: str, page, config, files) -> str:  # noqa: ARG001 (hook API)
    """Tables of results (cells with a spread, "0.8436 ± 0.0007") keep each value on one line,
    every table keeps names and short values whole, and no inline code breaks at a hyphen."""
    return keep_hyphens(_TABLE.sub(lambda m: _table(m.group(0)), html_text))


if __name__ == "__main__":  # python tools/mkdocs_hooks.py --write-cli
    import sys
    from pathlib import Path

    if sys.argv[1:] != ["--write-cli"]:
        sys.exit(f"usage: {WRITE_CLI}  (writes the tables of {CLI_PAGE} anew)")
    changed = write_cli_page(str(Path(__file__).resolve().parents[1]))
    print(f"{CLI_PAGE}: {'written anew' if changed else 'already current'}")
