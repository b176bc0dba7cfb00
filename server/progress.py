"""One log line per round from the ServerApp, so that ``flwr run --stream`` and ``flwr log``
show a deployed run as it goes (the in-process simulation shows a progress bar instead)."""

from __future__ import annotations

import logging
import math
import sys
import time

log = logging.getLogger("fedhmc.server")
SHOWN = ("accuracy", "nll_mean", "ece", "w2", "mean_error")


def _ensure_handler() -> None:
    """INFO lines to stderr (which Flower streams), unless logging is configured."""
    if not log.handlers and not logging.getLogger().handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("fedhmc: %(message)s"))
        log.addHandler(h)
    if log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)


def round_logger(total_rounds: int, chain=None):
    """An ``on_round`` callback that logs one line per round, then calls ``chain``."""
    _ensure_handler()
    last = [time.monotonic()]

    def on_round(row: dict) -> None:
        now = time.monotonic()
        head = f"round {row['round']}/{total_rounds}: {row.get('clients', '?')} clients"
        parts = [head, f"{row.get('failed', 0)} failed"]
        for k in SHOWN:
            v = row.get(k)
            if isinstance(v, int | float) and math.isfinite(v):
                parts.append(f"{k} {v:.4g}")
        parts.append(f"{now - last[0]:.1f} s")
        last[0] = now
        log.info(", ".join(parts))
        if chain is not None:
            chain(row)

    return on_round


def log_final(result) -> None:
    s = result.summary
    final = s.get("final") or {}
    shown = ", ".join(f"{k} {final[k]:.4g}" for k in SHOWN if isinstance(final.get(k), int | float))
    log.info(
        "%s: %s of %s rounds in %.1f s%s; files in %s",
        s.get("status"),
        s.get("rounds_completed"),
        s.get("rounds"),
        s.get("wall_s", float("nan")),
        f" ({shown})" if shown else "",
        result.config.out,
    )
