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
