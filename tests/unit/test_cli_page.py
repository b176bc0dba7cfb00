"""The command-line page (docs/cli.md) names every subcommand and every option of it.

Its option tables are made from ``fedhmc``'s argparse parsers by the site's hooks
(tools/mkdocs_hooks.py) and committed written out, so that the file reads whole; these
checks make the tables as the build does (no mkdocs needed), check that the committed page
holds them as they are today, and look, in each ``## `fedhmc NAME``` section, for every
option of ``fedhmc NAME``. The built page is checked too, in tests/integration/test_site.py.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "cli.md"
SECTION = re.compile(r"^## `fedhmc ([a-z-]+)`$", re.M)


@pytest.fixture(scope="module")
def hooks():
    spec = importlib.util.spec_from_file_location(
        "fedhmc_site_hooks", ROOT / "tools" / "mkdocs_hooks.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def commands() -> dict[str, argparse.ArgumentParser]:
    from fedhmc.cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def names(parser: argparse.ArgumentParser) -> list[str]:
    """What a page must name of ``parser``: each option's flags (all but -h/--help, which
    the page names once) and each positional argument's name."""
    out = []
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        out += a.option_strings or [a.metavar or a.dest.upper()]
    return out


def sections(markdown: str) -> dict[str, str]:
    """``## `fedhmc NAME``` section → its text, up to the next such heading."""
    heads = list(SECTION.finditer(markdown))
    return {
        m.group(1): markdown[m.end() : heads[i + 1].start() if i + 1 < len(heads) else None]
        for i, m in enumerate(heads)
    }


def missing(markdown: str) -> list[str]:
    """The subcommands without a section, and the options a section does not name (as code,
    `--flag`, in a table cell or in the line of options shared with `fedhmc run`)."""
    found = sections(markdown)
    out = []
    for name, parser in commands().items():
        if name not in found:
            out.append(f"fedhmc {name}: no section")
            continue
        code = set(re.findall(r"`([^`\n]+)`", found[name]))
        out += [f"fedhmc {name} {flag}" for flag in names(parser) if flag not in code]
    return out


def stale(hooks, text: str) -> str | None:
    """What a developer reads when ``text`` (the page) does not hold today's tables: the
    command that writes them anew, and the first lines of the difference; None if current."""
    fresh, _ = hooks.expand_cli(text)
    if fresh == text:
        return None
    diff = difflib.unified_diff(
        text.splitlines(), fresh.splitlines(), "docs/cli.md", "today's options", lineterm=""
    )
    return (
        f"docs/cli.md is out of date with fedhmc's options; write its tables anew with\n\n"
        f"    {hooks.WRITE_CLI}\n\nand commit it. The difference:\n" + "\n".join(list(diff)[:30])
    )


def test_the_committed_page_holds_todays_tables(hooks):
    text = PAGE.read_text(encoding="utf-8")
    assert "| option | meaning |" in text and "<!-- /cli-options -->" in text
    problem = stale(hooks, text)
    assert problem is None, problem


def test_a_page_out_of_date_fails_with_the_command_that_writes_it(hooks):
    text = PAGE.read_text(encoding="utf-8")
    old_help = text.replace("no progress bar or final table", "no progress bar")
    bare = hooks.CLI_BLOCK.sub(lambda m: f"<!-- {m.group(1)} -->", text)  # markers only
    for page in (old_help, bare):
        problem = stale(hooks, page)
        assert problem and "python tools/mkdocs_hooks.py --write-cli" in problem
    assert hooks.expand_cli(bare)[0] == text  # writing the tables makes it current


def test_write_cli_writes_the_page_and_then_finds_it_current(hooks, tmp_path):
    page = tmp_path / "docs" / "cli.md"
    page.parent.mkdir()
    text = PAGE.read_text(encoding="utf-8")
    page.write_text(text.replace("no progress bar or final table", "no bar"), encoding="utf-8")
    assert hooks.write_cli_page(str(tmp_path)) is True
    assert page.read_text(encoding="utf-8") == text
    assert hooks.write_cli_page(str(tmp_path)) is False


def test_the_page_names_every_command_and_option(hooks):
    page, problems = hooks.expand_cli(PAGE.read_text(encoding="utf-8"))
    assert problems == []
    assert missing(page) == []
    for marker in hooks.CLI_BLOCK.finditer(page):  # every marker has its table
        assert marker.group(0).endswith(("<!-- /cli-commands -->", "<!-- /cli-options -->"))
    # The options the page once lacked, and those it must keep.
    run = sections(page)["run"]
    for flag in (
        "--clients-per-round",
        "--participation",
        "--min-client-size",
        "--quantity-sigma",
        "--device",
        "--cuda-graphs",
        "--no-cuda-graphs",
        "--client-gpus",
    ):
        assert f"`{flag}`" in run, flag
    assert "`--device`" in sections(page)["experiment"]
    assert "`fedhmc --version`" in page and "`--help`" in page
    for name in commands():  # the commands table links each section
        assert f"[`fedhmc {name}`](#fedhmc-{name})" in page


def test_the_check_finds_a_missing_option_and_a_missing_section(hooks):
    page, _ = hooks.expand_cli(PAGE.read_text(encoding="utf-8"))
    without = page.replace("`--quantity-sigma`", "`--quantity-sgma`")
    assert "fedhmc run --quantity-sigma" in missing(without)
    assert "fedhmc data --quantity-sigma" in missing(without)
    cut = re.sub(r"^## `fedhmc diagnose`.*", "", page, flags=re.S | re.M)
    assert missing(cut) == ["fedhmc diagnose: no section"]


def test_a_command_without_its_options_line_is_a_build_problem(hooks):
    text = re.sub(
        r"<!-- cli-options: diagnose -->.*?<!-- /cli-options -->",
        "",
        PAGE.read_text(encoding="utf-8"),
        flags=re.S,
    )
    _, problems = hooks.expand_cli(text)
    assert problems == ["fedhmc diagnose has no <!-- cli-options: diagnose --> line"]
    _, problems = hooks.expand_cli(text + "\n<!-- cli-options: nope -->\n")
    assert any("no command 'nope'" in p for p in problems)


def test_options_tables_show_flags_values_choices_and_help(hooks):
    run = hooks.cli_options_table("run")
    assert "| `--resume` `DIR` | continue the stopped" in run
    assert "| `--fresh-gradients` / `--no-fresh-gradients` |" in run
    assert "| `--threads` `N|auto` |" in run  # a pipe in code does not split the row
    assert "%%" not in run and "%(" not in run  # help as --help shows it
    sweep = hooks.cli_options_table("sweep")
    # Options that mean what they mean for `fedhmc run` are named once, not tabled again;
    # --out, whose help differs for a sweep, gets its own row.
    assert "| `--out` `OUT` | sweep directory" in sweep
    assert "| `--dataset`" not in sweep and "`--dataset`" in sweep
    assert "`--help`" not in sweep


def test_help_text_becomes_a_safe_table_cell(hooks):
    parser = argparse.ArgumentParser()
    kind = parser.add_argument("--kind", choices=["a", "b"], help="the kind (100%% sure)")
    named = parser.add_argument("--mode", choices=["x", "y"], help="x or y")
    assert hooks._meaning(parser, kind) == "the kind (100% sure) (one of `a`, `b`)"
    assert hooks._meaning(parser, named) == "x or y"  # the help names the choices already
    assert hooks._option(kind) == "`--kind`"
    assert hooks._option(parser.add_argument("--top", type=int)) == "`--top` `TOP`"
    assert hooks._option(parser.add_argument("run_dir", metavar="RUN_DIR")) == "`RUN_DIR`"
    cell = hooks._text("paper-fmnist-*, x_train, fedhmc[x], a|b, <cell>, `a_b|c`, --burn-in")
    # No emphasis, link, HTML or column break; code spans as they are; no hyphen breaks.
    assert cell == (
        '<span class="nowrap">paper-fmnist-\\*</span>, x\\_train, fedhmc\\[x\\], a\\|b, '
        '&lt;cell&gt;, `a_b|c`, <span class="nowrap">--burn-in</span>'
    )
