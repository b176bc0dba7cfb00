"""Progress bars: an ETA on long work, and one ``--quiet`` switch for the process."""

import io

from fedhmc.core import progress


def test_bar_shows_elapsed_and_remaining_time():
    out = io.StringIO()
    b = progress.bar(4, "cells", "cell", file=out, disable=False, mininterval=0)
    for _ in range(2):
        b.update(1)
    b.close()
    text = out.getvalue()
    assert "cells" in text and "2/4" in text and "<" in text  # elapsed<remaining


def test_quiet_turns_every_bar_off_and_track_still_iterates():
    progress.set_quiet(True)
    try:
        assert progress.bar(3, "x", "it") is None
        assert list(progress.track([1, 2, 3], "x", "it")) == [1, 2, 3]
        progress.bar_or_null(3, "x", "it").update(1)  # does nothing, raises nothing
    finally:
        progress.set_quiet(False)
    b = progress.bar(3, "x", "it", disable=True)  # back on once the switch is off
    assert b is not None
    b.close()


def test_experiment_quiet_prints_no_table(tmp_path, capsys):
    from fedhmc.cli.main import main

    try:
        assert (
            main(["experiment", "stale-gaussian", "--quick", "--quiet", "--out", str(tmp_path)])
            == 0
        )
    finally:
        progress.set_quiet(False)
    out = capsys.readouterr().out
    assert "mse" not in out and "files in" in out
    assert (tmp_path / "stale_gaussian.csv").exists()


def test_plain_lines_where_standard_error_is_not_a_terminal(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "FEDHMC_PROGRESS_INTERVAL": "0.5"}
    p = subprocess.run(
        [sys.executable, "-m", "fedhmc", "run", "--rounds", "40", "--local-steps", "5",
         "--out", str(tmp_path / "r")],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    lines = [x for x in p.stderr.splitlines() if x.startswith("rounds: ")]
    assert lines, p.stderr
    assert all("/40 rounds done" in x and "elapsed" in x for x in lines)
    assert "\r" not in p.stderr


def test_plain_progress_estimates_what_is_left():
    from fedhmc.core.progress import PlainProgress

    b = PlainProgress(10, "cells", "cell", interval=3600)
    try:
        assert "time left not known yet" in b.line()
        b._clock = lambda: b._t0 + 20.0
        b.update(2)
        b.set_postfix({"nll": "0.31"})
        assert b.line() == "cells: 2/10 cells done, 20 s elapsed, about 1 min 20 s left (nll 0.31)"
    finally:
        b.close()
