"""Cross-device scale: ``python -m benchmarks --only scale``.

Fashion-MNIST logistic regression split by quantity skew (log-normal sizes, σ = 1.5, so
that at N = 10,000 a client holds from one to about 300 examples), FA-HMC with T = 2,
K = 5, B = 32, one chain, S = 100 clients drawn a round (``uniform``):

1. **Rounds against N.** ``fedhmc.algorithms.fahmc.step`` at N = 100, 1,000 and 10,000,
   timed interleaved in one process (median seconds a round over the repeats). Only the
   drawn clients compute, so a round should cost the same at any N; the ratio
   N = 10,000 / N = 100 is held to ≤ 1.5. The gradient evaluations a round differ a little
   with N (a client smaller than B uses its whole data), and the table says by how much.
2. **Whole runs.** ``fedhmc run`` at N = 100 and N = 10,000 (a subprocess each, evaluation
   and files included): peak memory of the process (held to ≤ 4 GB at N = 10,000) and
   seconds a round.
3. **Flower simulation.** 1,000 virtual clients, S = 50, through Flower's simulation
   against the engine: the same chain (θ̄ equal), seconds a round and the peak memory of
   each run's whole process tree (Ray's workers included), sampled every 0.2 s.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time

import torch

from benchmarks.common import child_env, fmnist_available, interleaved, quiet_env

SETTING = dict(
    dataset="fashion-mnist",
    partition="quantity",
    quantity_sigma=1.5,
    local_steps=2,
    leapfrog_steps=5,
    batch_size=32,
    chains=1,
    participation="uniform",
)
ROUND_SIZES = (100, 1_000, 10_000)
RUN_SIZES = (100, 10_000)
CLIENTS_PER_ROUND = 100
MEMORY_BOUND_GB = 4.0
TIME_BOUND = 1.5


def _config(num_clients: int, clients_per_round: int, **kw):
    from fedhmc.runtime.config import RunConfig

    return RunConfig(
        **SETTING, num_clients=num_clients, clients_per_round=clients_per_round, **kw
    ).resolve()


def bench_rounds(sizes=ROUND_SIZES, S: int = CLIENTS_PER_ROUND, rounds: int = 5, repeats: int = 3):
    """Median seconds of ``rounds`` FA-HMC rounds at each N (interleaved), per round."""
    from fedhmc.algorithms import fahmc
    from fedhmc.runtime.loop import sampler_settings
    from fedhmc.runtime.problem import build_problem
    from fedhmc.runtime.threads import apply_threads, round_work

    fns, evals, sizes_seen, work = {}, {}, {}, {}
    for N in sizes:
        cfg = _config(N, S)
        target = build_problem(cfg).target
        work[N] = round_work(target, cfg)
        settings = sampler_settings(cfg)
        counts = target.counts
        sizes_seen[N] = (int(counts.min()), int(counts.max()))

        def engine(target=target, settings=settings, N=N):
            state = fahmc.init(torch.zeros(1, target.dim), settings)
            total = 0
            for _ in range(rounds):
                state, info = fahmc.step(0, state, target, settings)
                total += info.grad_evals
            evals[N] = total / rounds

        fns[N] = engine
    # The thread count --threads auto picks for these rounds (the same S at every N), so
    # that they are timed as a run makes them.
    apply_threads("auto", work[sizes[0]])
    secs = interleaved(fns, repeats)
    rows = [
        {
            "num_clients": N,
            "clients_per_round": S,
            "client_sizes": sizes_seen[N],
            "grad_evals_per_round": evals[N],
            "s_per_round": secs[N] / rounds,
        }
        for N in sizes
    ]
    base = rows[0]["s_per_round"]
    for r in rows:
        r["ratio"] = r["s_per_round"] / base
    return rows


# A whole run in a child process: its peak RSS is the run's alone.
_RUN_CHILD = """
import json, sys, time
from benchmarks.common import peak_rss_mb
from benchmarks.scale import _config
from fedhmc.runtime.engine import run
N, S, rounds, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
t0 = time.perf_counter()
res = run(_config(N, S, rounds=rounds, burn_in=0, out=out), progress=False)
wall = time.perf_counter() - t0
h = res.history
print(json.dumps({"peak_rss_mb": peak_rss_mb(),
                  "wall_s": wall, "loop_s": h[-1]["wall_s"],
                  "s_per_round": (h[-1]["wall_s"] - h[0]["wall_s"]) / max(len(h) - 1, 1),
                  "clients": h[-1].get("clients"), "accuracy": h[-1].get("accuracy")}))
"""


def _child(args: list[str]) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _RUN_CHILD, *args],
        capture_output=True,
        text=True,
        check=False,
        env=child_env(),
    )
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"skipped": f"the run failed: {tail}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_runs(sizes=RUN_SIZES, S: int = CLIENTS_PER_ROUND, rounds: int = 6) -> list[dict]:
    """Peak memory and seconds a round of whole ``fedhmc run`` s, one subprocess each."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for N in sizes:
            res = _child([str(N), str(S), str(rounds), os.path.join(tmp, f"n{N}")])
            rows.append({"num_clients": N, "clients_per_round": S, "rounds": rounds, **res})
    return rows


class _Collect(logging.Handler):
    """Keeps the messages of the warnings logged to it."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


class _TreeMemory:
    """The peak of the summed RSS of this process and all its descendants, sampled."""

    def __init__(self, every: float = 0.2):
        import threading

        import psutil

        self.peak, self._stop = 0, threading.Event()
        me = psutil.Process()

        def sample():
            while not self._stop.is_set():
                total = 0
                for p in [me, *me.children(recursive=True)]:
                    try:
                        total += p.memory_info().rss
                    except psutil.Error:
                        pass
                self.peak = max(self.peak, total)
                self._stop.wait(every)

        self._thread = threading.Thread(target=sample, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def bench_flower_clients(N: int = 1_000, S: int = 50, rounds: int = 4) -> dict:
    """A Flower simulation of ``N`` virtual clients, S a round, against the engine."""
    from fedhmc.runtime.engine import run

    quiet_env()
    try:
        from fedhmc_server.simulation import run_flower
    except ImportError as exc:  # pragma: no cover - the server package is part of the repo
        return {"skipped": f"Flower backend unavailable: {exc}"}
    out: dict = {"shape": f"N={N:,} S={S} T=2 K=5 B=32, {rounds} rounds"}
    with tempfile.TemporaryDirectory() as tmp:
        runs = {}
        for backend in ("engine", "flower"):
            cfg = _config(N, S, rounds=rounds, burn_in=0, out=os.path.join(tmp, backend))
            t0 = time.perf_counter()
            with _TreeMemory() as mem:
                if backend == "engine":
                    res = run(cfg, progress=False, threads="auto")  # as `fedhmc run` does
                else:
                    # The server's warnings (a client dropped at start-up changes the draws,
                    # and so the chain) are kept for the report; Flower's own output is not.
                    log = logging.getLogger("fedhmc.server")
                    handler = _Collect()
                    log.addHandler(handler)
                    with open(os.devnull, "w") as devnull:
                        stderr, sys.stderr = sys.stderr, devnull
                        try:
                            res = run_flower(cfg.replace(backend="flower"), progress=False)
                        finally:
                            sys.stderr = stderr
                            log.removeHandler(handler)
                    out["server_warnings"] = handler.messages[:5]
                    out["server_warning_count"] = len(handler.messages)
            h = res.history
            runs[backend] = res
            out[backend] = {
                "total_s": time.perf_counter() - t0,
                "s_per_round": (h[-1]["wall_s"] - h[0]["wall_s"]) / max(len(h) - 1, 1),
                "peak_tree_mb": mem.peak / 2**20,
                "clients": [r.get("clients") for r in h],
            }
    out["same_theta"] = bool(torch.equal(runs["engine"].theta_bar, runs["flower"].theta_bar))
    out["flower/engine"] = out["flower"]["s_per_round"] / out["engine"]["s_per_round"]
    return out


def bench_scale(smoke: bool = False, stage=lambda label: None) -> dict:
    """The three measurements (``smoke``: tiny sizes, digits, no Flower)."""
    if not fmnist_available():
        return {"skipped": "no Fashion-MNIST on disk (Debian's dataset-fashion-mnist)"}
    res: dict = {}
    if smoke:
        stage("scale: rounds at N = 100 and 1,000 (smoke)")
        res["rounds"] = bench_rounds((100, 1_000), S=10, rounds=1, repeats=1)
        return res
    stage("scale: rounds at N = 100, 1,000, 10,000")
    res["rounds"] = bench_rounds()
    stage("scale: whole runs at N = 100 and 10,000")
    res["runs"] = bench_runs()
    stage("scale: Flower simulation of 1,000 clients")
    res["flower"] = bench_flower_clients()
    return res


def targets(res: dict):
    """(name, value, bound, reached) of the scale results."""
    rounds = res.get("rounds") or []
    last = next((r for r in rounds if r["num_clients"] == 10_000), None)
    if last is not None:
        yield (
            "s/round at N=10,000 / N=100 (S=100)",
            last["ratio"],
            f"<= {TIME_BOUND:g}",
            last["ratio"] <= TIME_BOUND,
        )
    run = next((r for r in res.get("runs", []) if r["num_clients"] == 10_000), None)
    if run is not None and "peak_rss_mb" in run:
        gb = run["peak_rss_mb"] / 1024
        yield (
            "peak memory of a 10,000-client run (GB)",
            gb,
            f"<= {MEMORY_BOUND_GB:g}",
            gb <= MEMORY_BOUND_GB,
        )
    fl = res.get("flower")
    if fl and "same_theta" in fl:
        yield (
            "Flower 1,000 clients S=50: θ̄ equals the engine's",
            float(fl["same_theta"]),
            "= 1",
            fl["same_theta"],
        )


def render(res: dict) -> str:
    if "skipped" in res:
        return f"Scale: skipped ({res['skipped']}).\n"
    lines = [
        "Cross-device scale (Fashion-MNIST logistic, quantity skew σ = 1.5, T = 2, K = 5, "
        "B = 32, one chain; `uniform` participation):",
        "",
        "| N | S | client sizes | gradient evals / round | s / round | vs N = 100 |",
        "|---:|---:|---|---:|---:|---:|",
    ]
    for r in res.get("rounds", []):
        lo, hi = r["client_sizes"]
        lines.append(
            f"| {r['num_clients']:,} | {r['clients_per_round']} | {lo}–{hi:,} "
            f"| {r['grad_evals_per_round']:,.0f} | {r['s_per_round']:.3f} | {r['ratio']:.2f} |"
        )
    if res.get("runs"):
        lines += [
            "",
            "Whole runs (`fedhmc run`, evaluation and files included):",
            "",
            "| N | S | rounds | peak memory (MB) | s / round | total (s) |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for r in res["runs"]:
            if "skipped" in r:
                lines.append(f"| {r['num_clients']:,} | — | — | {r['skipped']} | — | — |")
                continue
            lines.append(
                f"| {r['num_clients']:,} | {r['clients_per_round']} | {r['rounds']} "
                f"| {r['peak_rss_mb']:,.0f} | {r['s_per_round']:.3f} | {r['wall_s']:.1f} |"
            )
    fl = res.get("flower")
    if fl and "skipped" not in fl:
        e, f = fl["engine"], fl["flower"]
        lines += [
            "",
            f"Flower simulation against the engine ({fl['shape']}): "
            f"{f['s_per_round']:.2f} s against {e['s_per_round']:.2f} s a round "
            f"({fl['flower/engine']:.1f} ×), peak memory of the process tree "
            f"{f['peak_tree_mb']:,.0f} MB against {e['peak_tree_mb']:,.0f} MB, whole run "
            f"{f['total_s']:.0f} s against {e['total_s']:.0f} s; clients a round "
            f"{f['clients'][-1]}; the same θ̄: {fl['same_theta']}."
            + (
                f" The server warned {fl['server_warning_count']} times, first: "
                f"{fl['server_warnings'][0]}."
                if fl.get("server_warning_count")
                else ""
            ),
        ]
    elif fl:
        lines += ["", f"Flower simulation: skipped ({fl['skipped']})."]
    return "\n".join(lines) + "\n"
