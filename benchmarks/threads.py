"""How many intra-op threads the engine should use: ``python -m benchmarks --only threads``.

For each shape it times the engine's rounds with one thread and with one thread per core,
interleaved in one process, twice: on the machine as it is, and with one busy-looping
process per core started beside it (a machine shared with other jobs). Small ops on
oversubscribed cores wait for the scheduler, so several threads can lose badly under load
where they gain nothing when idle; ``fedhmc run --threads auto`` follows these numbers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import torch

from benchmarks.common import engine_fn, interleaved, shape_config
from fedhmc.algorithms import fahmc
from fedhmc.runtime.problem import build_problem


def _engine(shape, T: int, K: int, rounds: int):
    cfg = shape_config(shape)
    target = build_problem(cfg).target
    settings = fahmc.Settings(cfg.step_size, K, T, rho=1.0)
    evals = rounds * T * (K + 1) * target.num_clients
    return engine_fn(target, settings, rounds), evals, target


def _rates(engine, evals: int, counts: tuple[int, ...], repeats: int) -> dict[int, float]:
    """Evaluations per second at each thread count, medians of interleaved repeats."""

    def at(n: int):
        def fn():
            torch.set_num_threads(n)
            engine()

        return fn

    secs = interleaved({n: at(n) for n in counts}, repeats)
    return {n: evals / s for n, s in secs.items()}


class _Load:
    """``n`` busy-looping processes for the duration of a ``with`` block."""

    def __init__(self, n: int):
        self.n = n
        self.procs: list[subprocess.Popen] = []

    def __enter__(self):
        for _ in range(self.n):
            self.procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        time.sleep(0.5)
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()


def bench_threads(shapes, repeats: int = 3, smoke: bool = False) -> list[dict]:
    """One row per shape: evaluations per second at 1 and at all threads, idle and loaded."""
    cores = os.cpu_count() or 1
    counts = (1, cores) if cores > 1 else (1,)
    old = torch.get_num_threads()
    rows = []
    try:
        for shape in shapes:
            big = shape.dataset == "fashion-mnist"
            T, K, rounds = (1, 2, 1) if smoke else ((1, 10, 1) if big else (5, 10, 1))
            engine, evals, target = _engine(shape, T, K, rounds)
            row = {"shape": f"{shape.label} D={target.dim}", "cores": cores}
            for label, load in (("idle", 0), ("loaded", cores)):
                with _Load(0 if smoke else load):
                    rate = _rates(engine, evals, counts, 1 if smoke else repeats)
                row[f"{label}_1"] = rate[1]
                row[f"{label}_all"] = rate[counts[-1]]
                row[f"{label}_all/1"] = rate[counts[-1]] / rate[1]
            rows.append(row)
    finally:
        torch.set_num_threads(old)
    return rows


def render(rows: list[dict]) -> str:
    if not rows:
        return ""
    cores = rows[0]["cores"]
    lines = [
        f"Engine evaluations per second with 1 thread and with {cores} threads, on the machine "
        f"as it is (idle) and beside {cores} busy-looping processes (loaded):",
        "",
        f"| shape | idle, 1 | idle, {cores} | ratio | loaded, 1 | loaded, {cores} | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['shape']} | {r['idle_1']:,.0f} | {r['idle_all']:,.0f} | "
            f"{r['idle_all/1']:.2f} | {r['loaded_1']:,.0f} | {r['loaded_all']:,.0f} | "
            f"{r['loaded_all/1']:.2f} |"
        )
    return "\n".join(lines) + "\n"
