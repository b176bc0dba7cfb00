"""``python -m benchmarks --only deploy``: what a deployed round costs, against Flower's floor.

One loopback deployment through the deploy/ recipe (TLS, SuperNode authentication,
2 SuperNodes with their warm workers), then three runs on it, one after the other:

- **echo floor**: a bare Flower app (``benchmarks/echo_app``) whose ClientApp sends back
  what it receives, θ-sized, with fedhmc's own message exchange;
- **fedhmc tiny**: digits, T = 1, K = 1 (the sampling takes milliseconds);
- **fedhmc digits defaults**: T = 10, K = 10.

Seconds per round are the median over rounds 2 … R (round 1 includes start-up); start-up
is the time from ``flwr run`` to the end of round 1 (the echo app: its first round trip).
The report gives the machine's load average before and after: on a busy machine every
figure grows (the echo floor too), so compare a report's ratios, not its seconds, with
those of a report measured on an idle machine.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

# deploy/ is a folder of scripts without __init__.py: run from the repository root (as
# python -m benchmarks is), it is found as a namespace package.
from deploy.loopback import Deployment, metrics_rows, missing_tools, summary, wait_until

ROOT = Path(__file__).resolve().parents[1]
ECHO_APP = ROOT / "benchmarks" / "echo_app"


def _echo_rows(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def _median_gap(times: list[float]) -> float:
    """The median time between consecutive events (rounds 2 … R from their end times)."""
    return statistics.median(b - a for a, b in zip(times[:-1], times[1:], strict=True))


def _run(
    dep: Deployment, app: Path | None, run_config: str, log: Path, first, done, timeout: float
):
    """Submit, wait until ``done()``; returns seconds from submission to ``first()``."""
    t0 = time.monotonic()
    proc = dep.submit(run_config, log, app=app)
    seen = {}

    def check():
        if "first" not in seen and first():
            seen["first"] = time.monotonic() - t0
        if proc.poll() is not None and not done():
            raise RuntimeError(f"flwr run ended early: {log.read_text()[-600:]}")
        return done()

    try:
        wait_until(check, timeout, f"the run in {log.name}", poll=0.1)
    finally:
        try:
            proc.wait(timeout=60)
        except Exception:  # noqa: BLE001
            proc.kill()
    return seen.get("first", float("nan"))


def bench_deploy(rounds: int = 6) -> dict:
    """Seconds per round and start-up of the echo floor and of fedhmc; their ratios."""
    missing = missing_tools()
    if missing:
        return {"skipped": f"not found on PATH: {', '.join(missing)}"}
    work = Path(tempfile.mkdtemp(prefix="fedhmc-bench-deploy-"))
    dep = Deployment(work, num_nodes=2, conn="fedhmc-bench")
    out: dict = {"rounds": rounds, "nodes": 2, "load_before": list(os.getloadavg())}
    try:
        t = time.monotonic()
        dep.setup()
        dep.start_nodes()
        out["setup_s"] = time.monotonic() - t

        echo = work / "echo.jsonl"
        startup = _run(
            dep,
            ECHO_APP,
            f'rounds={rounds} num-clients=2 out="{echo}"',
            work / "echo.log",
            lambda: len(_echo_rows(echo)) >= 2,
            lambda: len(_echo_rows(echo)) >= rounds + 1,
            600,
        )
        times = [r["t"] for r in _echo_rows(echo)]
        out["echo"] = {
            "round_s": _median_gap(times[1:]),
            "startup_s": startup,
        }
        for name, extra in (("tiny", "local-steps=1 leapfrog-steps=1"), ("digits", "")):
            run_dir = work / name
            startup = _run(
                dep,
                None,  # this repository's app, staged as deploy/run.sh does
                f'num-clients=2 rounds={rounds} {extra} out="{run_dir}"',
                work / f"{name}.log",
                lambda d=run_dir: len(metrics_rows(d)) >= 1,
                lambda d=run_dir: summary(d).get("status") not in (None, "running"),
                900,
            )
            wall = [float(r["wall_s"]) for r in metrics_rows(run_dir)]
            out[name] = {
                "status": summary(run_dir).get("status"),
                "round_s": _median_gap(wall),
                "startup_s": startup,
            }
        out["ratio_tiny_round"] = out["tiny"]["round_s"] / out["echo"]["round_s"]
        out["ratio_startup"] = out["tiny"]["startup_s"] / out["echo"]["startup_s"]
    finally:
        out["load_after"] = list(os.getloadavg())
        left = dep.stop_all()
        if left:
            out["left_running"] = len(left)
    return out


def render(r: dict) -> str:
    if "skipped" in r:
        return f"deployment: skipped ({r['skipped']})\n"
    lines = [
        f"Deployment on loopback (TLS, node authentication, {r['nodes']} SuperNodes with "
        f"warm workers; median over rounds 2–{r['rounds']})",
        "",
        "| run | s per round | start-up to round 1 (s) |",
        "|---|---|---|",
    ]
    for key, label in (
        ("echo", "echo ClientApp (Flower's floor)"),
        ("tiny", "fedhmc, T = 1, K = 1"),
        ("digits", "fedhmc, digits defaults (T = 10, K = 10)"),
    ):
        lines.append(f"| {label} | {r[key]['round_s']:.2f} | {r[key]['startup_s']:.1f} |")
    lines += [
        "",
        f"fedhmc tiny / echo: {r['ratio_tiny_round']:.2f}× per round (goal ≤ 1.2), "
        f"{r['ratio_startup']:.2f}× start-up (goal ≤ 1.5)",
    ]
    if "load_before" in r:  # reports before 2026-11-28 did not record it
        lines += [
            "",
            f"Load average (1 min) {r['load_before'][0]:.1f} before and "
            f"{r['load_after'][0]:.1f} after, on {os.cpu_count()} cores",
        ]
    return "\n".join(lines) + "\n"
