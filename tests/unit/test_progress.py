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
    """Where standard error is a pipe, `fedhmc run` writes plain progress lines. With an
    interval of 0 it writes one after every round: what is printed does not depend on how
    fast the machine runs the rounds."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "FEDHMC_PROGRESS_INTERVAL": "0"}
    p = subprocess.run(
        [sys.executable, "-m", "fedhmc", "run", "--rounds", "6", "--local-steps", "2",
         "--out", str(tmp_path / "r")],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    lines = [x for x in p.stderr.splitlines() if x.startswith("rounds: ")]
    assert [x.split(" rounds done")[0] for x in lines] == [f"rounds: {r}/6" for r in range(1, 7)]
    assert all("elapsed" in x for x in lines)
    assert "\r" not in p.stderr


def test_plain_progress_timer_writes_a_line_each_interval(capsys):
    """The timer's loop, driven by a stand-in for its stop event: one line per interval
    that passes, none once the bar is closed; no real time is waited for."""
    import weakref

    from fedhmc.core.progress import PlainProgress

    class Ticks:  # two intervals pass, then the bar is closed
        def __init__(self):
            self.waits = []

        def wait(self, seconds):
            self.waits.append(seconds)
            return len(self.waits) > 2

    b = PlainProgress(10, "cells", "cell", interval=3600)  # its own timer does not fire here
    try:
        b.update(3)
        ticks = Ticks()
        PlainProgress._loop(weakref.ref(b), ticks, 7.5)
    finally:
        b.close()
    err = capsys.readouterr().err.splitlines()
    assert ticks.waits == [7.5, 7.5, 7.5]
    assert len(err) == 2 and all(x.startswith("cells: 3/10 cells done, ") for x in err)


def test_progress_interval_from_the_environment(monkeypatch, capsys):
    from fedhmc.core.progress import PLAIN_INTERVAL, PlainProgress, plain_interval

    monkeypatch.setenv("FEDHMC_PROGRESS_INTERVAL", "0.25")
    assert plain_interval() == 0.25
    for bad in ("soon", "-1", "nan"):
        monkeypatch.setenv("FEDHMC_PROGRESS_INTERVAL", bad)
        assert plain_interval() == PLAIN_INTERVAL  # not a traceback
    monkeypatch.setenv("FEDHMC_PROGRESS_INTERVAL", "0")
    b = PlainProgress(2, "rounds", "round")
    assert b._thread is None  # no timer: a line after each item
    b.update(1)
    b.update(1)
    b.close()
    err = capsys.readouterr().err.splitlines()
    assert [x.split(",")[0] for x in err] == ["rounds: 1/2 rounds done", "rounds: 2/2 rounds done"]


def test_rates_keep_two_significant_digits_below_ten():
    from fedhmc.core.progress import format_rate

    assert format_rate(39_533.2) == "39,533"
    assert format_rate(10.4) == "10"
    assert format_rate(9.94) == "9.9"
    assert format_rate(3.41) == "3.4"
    assert format_rate(1.0) == "1.0"
    assert format_rate(0.2712) == "0.27"
    assert format_rate(0.005349) == "0.0053"
    assert format_rate(0.0) == "0"


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
