"""The performance suite: every target measured as a ratio in one process.

For each problem shape it times, interleaved in one process with a warm-up and repeats,
the client-gradient evaluations per second of

- ``engine``: ``fedhmc.algorithms.fahmc.step`` (FA-HMC: T local iterations of K leapfrog steps,
  counter-based minibatches, momentum, averaging), counting T·(K+1)·N evaluations a round;
- ``batched``: a bare batched-gradient loop of the same shapes: a random minibatch gather
  and the gradient of every client at once (closed form by two ``bmm`` for logistic
  regression; autograd through ``bmm`` for the MLP) and one axpy; no momentum, no RNG
  streams, no averaging: the least work a batched sampler does;
- ``loop``: a Python loop over clients, each an ``nn.Module`` with autograd;
- ``posteriors``: the ``posteriors`` library's SGHMC, one chain per client (only when the
  package is installed: ``pip install -e '.[bench]'``).

The ``models`` group (``benchmarks.models``, several minutes) measures the generic
``nn.Module`` path against the hand-written logistic regression and MLP, and LeNet-5
against a per-client autograd loop and posteriors' SGHMC.

It then measures the Flower simulation against the engine (Fashion-MNIST logistic
regression, N = 10, T = 50, K = 10; Ray start-up reported apart from the round loop), the
peak resident memory of 1,000 simulated clients on digits (in a subprocess), the BMA
evaluation time as a share of a round, and estimates the paper-scale Fashion-MNIST run time.
Every ratio is printed beside the threshold the benchmark sets for it and whether it is
reached, and the results are written to ``docs/results/benchmarks/<UTC time>.json`` and ``.md``.

Usage::

    python -m benchmarks                   # everything but deploy (a few minutes, and
                                           # 10-20 more for the models group on 2 cores)
    python -m benchmarks --only digits     # a subset: digits, blr, fmnist, mlp, threads,
                                           # flower, memory, eval, paper, models
                                           # (comma-separated)
    python -m benchmarks --only deploy     # a loopback deployment against Flower's floor
    python -m benchmarks --only models     # the generic nn.Module path (benchmarks.models)
    python -m benchmarks --only scale      # 10,000 clients, S = 100 a round (benchmarks.scale)
    python -m benchmarks --only models --device cuda   # the same on a GPU
    python -m benchmarks --only gpu        # on a GPU: the same-chain matrix (pytest -m gpu)
                                           # and fedhmc's step against a plain captured
                                           # step (benchmarks.gpu; --device cpu checks it
                                           # without a GPU)
    python -m benchmarks --smoke           # tiny sizes, seconds, no targets (what CI runs)
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import (
    Shape,
    child_env,
    engine_fn,
    fmnist_available,
    fmnist_missing,
    interleaved,
    posteriors_fn,
    quiet_env,
    shape_config,
    use_data_dir,
)
from fedhmc.algorithms import fahmc
from fedhmc.core.progress import bar, set_quiet
from fedhmc.errors import ConfigError
from fedhmc.runtime.config import RunConfig
from fedhmc.runtime.problem import build_problem
from fedhmc.runtime.threads import auto_threads, gradient_work

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results" / "benchmarks"
PAPER_EVALS = 200 * 50 * 11 * 10  # rounds × T × (K + 1) × N: about 1.1M
GROUPS = (
    "digits",
    "blr",
    "fmnist",
    "mlp",
    "threads",
    "flower",
    "memory",
    "eval",
    "paper",
    "deploy",
    "models",
    "scale",
    "gpu",
)
# deploy and scale (minutes each, a Flower run in both) and gpu (a GPU's check): only with
# --only. A smoke run includes gpu, on the CPU where there is no GPU (seconds).
DEFAULT_GROUPS = tuple(g for g in GROUPS if g not in ("deploy", "scale", "gpu"))
SMOKE_GROUPS = (*DEFAULT_GROUPS, "gpu")


SHAPES = (
    Shape("digits", "digits N=10 B=32", "digits", 10, 32, loop_target=20.0),
    Shape("digits", "digits N=100 B=32", "digits", 100, 32, loop_target=20.0),
    Shape("blr", "BLR 20x50 d=1000 full", "blr-synthetic", 20, 0, loop_target=4.0),
    Shape("fmnist", "F-MNIST N=10 B=1000", "fashion-mnist", 10, 1000, posteriors_target=2.0),
    Shape("mlp", "F-MNIST MLP N=10 B=1000", "fashion-mnist", 10, 1000, model="mlp"),
)


def _client_data(target):
    N = target.num_clients
    return [target.X[c, : int(target.counts[c])] for c in range(N)], [
        target.y[c, : int(target.counts[c])] for c in range(N)
    ]


def _nn_model(target) -> torch.nn.Module:
    model = target.model
    if model.name == "logistic":
        return torch.nn.Linear(model.num_features, model.num_classes)
    layers: list[torch.nn.Module] = []
    widths = (model.num_features, *model.hidden, model.num_classes)
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def bench_shape(
    shape: Shape, T: int, K: int, rounds: int, repeats: int, with_posteriors: bool = True
) -> dict:
    """Evaluations per second of every strategy on one shape, and the ratios.

    Every strategy runs at the thread count that ``--threads auto`` picks for the shape
    (one thread for the small ones), so that the engine is timed as a run would use it
    and the plain kernels get the same cores."""
    cfg = shape_config(shape)
    target = build_problem(cfg).target
    N, D = target.num_clients, target.dim
    batch = target.X.shape[1] if shape.batch <= 0 else shape.batch
    before = torch.get_num_threads()
    threads = auto_threads(gradient_work(N, 1, batch, D))
    torch.set_num_threads(threads)
    try:
        row = _bench_shape(shape, target, cfg, T, K, rounds, repeats, with_posteriors)
    finally:
        torch.set_num_threads(before)
    return {**row, "threads": threads}


def _bench_shape(shape, target, cfg, T, K, rounds, repeats, with_posteriors) -> dict:
    N, D = target.num_clients, target.dim
    settings = fahmc.Settings(cfg.step_size, K, T, rho=1.0)
    steps = rounds * T * (K + 1)
    evals = steps * N
    model = target.model
    logistic = model.name == "logistic"
    X, y = target.X, target.y  # (N, n_max, F(+1)), (N, n_max)
    n_max, F = X.shape[1], X.shape[2]
    b = int(target.counts.min()) if shape.batch <= 0 else min(shape.batch, int(target.counts.min()))
    full = shape.batch <= 0 or shape.batch >= n_max
    cid = torch.arange(N).view(N, 1)
    gen = torch.Generator().manual_seed(0)
    counts = target.counts.view(N, 1)
    lr = 1e-6

    engine = engine_fn(target, settings, rounds)

    def minibatch():
        if full:
            return X, y
        idx = torch.randint(0, n_max, (N, b), generator=gen) % counts
        return X[cid, idx], y[cid, idx]

    if logistic:
        C = model.num_classes

        def batched():
            W = torch.zeros(N, F, C)
            for _ in range(steps):
                Xb, yb = minibatch()
                P = torch.softmax(torch.bmm(Xb, W), -1)
                P.scatter_add_(-1, yb.unsqueeze(-1), torch.full((N, Xb.shape[1], 1), -1.0))
                W.add_(torch.bmm(Xb.transpose(1, 2), P), alpha=-lr)

    else:
        widths = (model.num_features, *model.hidden, model.num_classes)
        params = []
        for i in range(len(widths) - 1):
            params.append(torch.randn(N, widths[i], widths[i + 1]) / widths[i] ** 0.5)
            params.append(torch.zeros(N, 1, widths[i + 1]))
        for p in params:
            p.requires_grad_(True)

        def batched():
            for _ in range(steps):
                Xb, yb = minibatch()
                h = Xb
                for i in range(0, len(params), 2):
                    h = torch.baddbmm(params[i + 1], h, params[i])
                    if i < len(params) - 2:
                        h = torch.relu(h)
                loss = torch.nn.functional.cross_entropy(
                    h.reshape(-1, h.shape[-1]), yb.reshape(-1), reduction="sum"
                )
                grads = torch.autograd.grad(loss, params)
                with torch.no_grad():
                    for p, g in zip(params, grads, strict=True):
                        p.add_(g, alpha=-lr)

    Xc, yc = _client_data(target)
    if logistic:
        Xc = [x[:, :-1] for x in Xc]  # nn.Linear has its own bias
    torch.manual_seed(0)
    modules = [_nn_model(target) for _ in range(N)]

    def loop():
        for _ in range(steps):
            for c in range(N):
                if full:
                    xb, yb = Xc[c], yc[c]
                else:
                    idx = torch.randint(0, Xc[c].shape[0], (b,), generator=gen)
                    xb, yb = Xc[c][idx], yc[c][idx]
                m = modules[c]
                m.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(m(xb), yb, reduction="sum").backward()
                with torch.no_grad():
                    for p in m.parameters():
                        p.add_(p.grad, alpha=-lr)

    fns = {"engine": engine, "batched": batched, "loop": loop}
    post = posteriors_fn(modules, Xc, yc, b, full, steps, gen) if with_posteriors else None
    if post is not None:
        fns["posteriors"] = post
    secs = interleaved(fns, repeats)
    rate = {k: evals / s for k, s in secs.items()}
    best = max(rate["batched"], rate["loop"])
    row = {
        "group": shape.key,
        "shape": f"{shape.label} D={D}",
        "T": T,
        "K": K,
        "rounds": rounds,
        "repeats": repeats,
        **{f"{k}_evals_per_s": v for k, v in rate.items()},
        "engine/best": rate["engine"] / best,
        "engine/batched": rate["engine"] / rate["batched"],
        "engine/loop": rate["engine"] / rate["loop"],
        "batched/loop": rate["batched"] / rate["loop"],
    }
    if "posteriors" in rate:
        row["engine/posteriors"] = rate["engine"] / rate["posteriors"]
    return row


# ---------------------------------------------------------------------------------------
# Whole runs: Flower against the engine, memory at 1,000 clients, evaluation share.


def bench_flower(rounds: int, T: int, K: int, dataset: str = "fashion-mnist") -> dict:
    """Wall time of the same run through the engine and through Flower's simulation.

    The round loop's time is the run's own ``wall_s`` (from the first round's start to the
    last round's end, evaluation included, in both backends); Flower's start-up (Ray,
    SuperNodes, app loading) is its total wall time minus that.
    """
    quiet_env()
    from fedhmc.runtime.engine import run

    try:
        from fedhmc_server.simulation import run_flower
    except ImportError as exc:  # pragma: no cover - the server package is part of the repo
        return {"skipped": f"Flower backend unavailable: {exc}"}
    with tempfile.TemporaryDirectory() as tmp:
        base = dict(
            dataset=dataset,
            num_clients=10,
            partition="iid",
            local_steps=T,
            leapfrog_steps=K,
            rounds=rounds,
            burn_in=0,
            chains=1,
        )
        cfg_e = RunConfig(**base, out=os.path.join(tmp, "engine"))
        t0 = time.perf_counter()
        res_e = run(cfg_e, progress=False)
        engine_total = time.perf_counter() - t0
        cfg_f = RunConfig(**base, backend="flower", out=os.path.join(tmp, "flower"))
        t0 = time.perf_counter()
        with open(os.devnull, "w") as devnull:
            stderr, sys.stderr = sys.stderr, devnull
            try:
                res_f = run_flower(cfg_f, progress=False)
            finally:
                sys.stderr = stderr
        flower_total = time.perf_counter() - t0
    engine_loop = float(res_e.history[-1]["wall_s"])
    flower_loop = float(res_f.history[-1]["wall_s"])
    same = bool(torch.allclose(res_e.theta_bar, res_f.theta_bar, rtol=1e-4, atol=1e-5))
    return {
        "shape": f"{dataset} logistic N=10 T={T} K={K}, {rounds} rounds",
        "engine_loop_s": engine_loop,
        "engine_total_s": engine_total,
        "flower_loop_s": flower_loop,
        "flower_startup_s": flower_total - flower_loop,
        "flower_total_s": flower_total,
        "flower/engine": flower_loop / engine_loop,
        "same_theta": same,
    }


_MEMORY_CHILD = """
import json, sys, tempfile, time
from benchmarks.common import peak_rss_mb
from fedhmc.runtime.config import RunConfig
from fedhmc.runtime.engine import run
n, rounds = int(sys.argv[1]), int(sys.argv[2])
with tempfile.TemporaryDirectory() as tmp:
    t0 = time.perf_counter()
    cfg = RunConfig(dataset="digits", num_clients=n, partition="iid", rounds=rounds,
                    burn_in=0, out=tmp)
    res = run(cfg, progress=False)
    wall = time.perf_counter() - t0
print(json.dumps({"peak_rss_mb": peak_rss_mb(),
                  "wall_s": wall, "chains": res.config.chains,
                  "T": res.config.local_steps, "K": res.config.leapfrog_steps}))
"""


def bench_memory(num_clients: int, rounds: int) -> dict:
    """Peak resident memory of a whole digits run with ``num_clients`` clients (subprocess)."""
    out = subprocess.run(
        [sys.executable, "-c", _MEMORY_CHILD, str(num_clients), str(rounds)],
        capture_output=True,
        text=True,
        check=False,
        env=child_env(),
    )
    if out.returncode != 0:
        return {"skipped": "the memory run failed: " + out.stderr.strip().splitlines()[-1]}
    res = json.loads(out.stdout.strip().splitlines()[-1])
    return {"shape": f"digits N={num_clients} iid, {rounds} rounds", **res}


def bench_paper(model: str, measure_rounds: int, confirm: bool) -> dict:
    """The authors' protocol at the paper's Fashion-MNIST scale: 10 iid clients, batch 1000,
    T = 50 leapfrog steps per round, K = 10, two gradients per step, 200 rounds.

    The rate comes from ``measure_rounds`` real rounds after one warm-up round (the whole
    run loop: sampling, the per-round evaluation, the files); with ``confirm`` the full
    200-round run is made too and compared with the estimate.
    """
    import tempfile

    from fedhmc.runtime.engine import run

    def cfg(rounds: int, out: str) -> RunConfig:
        return RunConfig(
            dataset="fashion-mnist",
            model=model,
            num_clients=10,
            partition="iid",
            protocol="authors",
            leapfrog_steps=10,
            local_steps=50,
            step_size=1e-4 if model == "logistic" else 2e-5,
            rounds=rounds,
            out=out,
        )

    with tempfile.TemporaryDirectory() as tmp:
        res = run(cfg(1 + measure_rounds, f"{tmp}/m"), progress=False)
        walls = [r["wall_s"] for r in res.history]
        per_round = (walls[-1] - walls[0]) / measure_rounds
        out = {
            "model": model,
            "evals_per_round": res.history[0]["grad_evals"],
            "s_per_round": per_round,
            "estimate_min": 200 * per_round / 60,
        }
        if confirm:
            t0 = time.perf_counter()
            run(cfg(200, f"{tmp}/full"), progress=False)
            out["measured_min"] = (time.perf_counter() - t0) / 60
            out["measured/estimate"] = out["measured_min"] / out["estimate_min"]
    return out


def bench_eval(dataset: str, repeats: int, T: int | None = None, K: int | None = None) -> dict:
    """Seconds of one BMA evaluation (a collected round) against one round, same config."""
    cfg = RunConfig(dataset=dataset, num_clients=10, partition="iid")
    if T is not None:
        cfg = cfg.replace(local_steps=T)
    if K is not None:
        cfg = cfg.replace(leapfrog_steps=K)
    cfg = cfg.resolve()
    problem = build_problem(cfg)
    from fedhmc.runtime.loop import sampler_settings
    from fedhmc.runtime.problem import initial_position

    settings = sampler_settings(cfg)
    theta = initial_position(problem.model, problem.dim, cfg)
    state = {"fahmc": fahmc.init(theta, settings)}

    def one_round():
        state["fahmc"], _ = fahmc.step(0, state["fahmc"], problem.target, settings)

    def evaluate():
        problem.evaluator(state["fahmc"].position, True)

    secs = interleaved({"round": one_round, "eval": evaluate}, repeats)
    return {
        "shape": f"{dataset} N=10 chains={cfg.chains} T={cfg.local_steps} K={cfg.leapfrog_steps}",
        "round_s": secs["round"],
        "eval_s": secs["eval"],
        "eval/round": secs["eval"] / secs["round"],
    }


# ---------------------------------------------------------------------------------------
# Targets and report.


def _mark(ok: bool) -> str:
    return "yes" if ok else "no"


def targets(results: dict) -> list[dict]:
    """Every threshold these results measure: value, bound, whether it is reached."""
    out = []

    def add(name, value, bound, ok):
        out.append({"target": name, "value": value, "bound": bound, "status": _mark(ok)})

    for row in results.get("shapes", []):
        add(
            f"{row['shape']}: engine / best plain kernel",
            row["engine/best"],
            ">= 0.9",
            row["engine/best"] >= 0.9,
        )
        shape = next(s for s in SHAPES if row["shape"].startswith(s.label))
        if shape.loop_target:
            add(
                f"{row['shape']}: engine / per-client loop",
                row["engine/loop"],
                f">= {shape.loop_target:g}",
                row["engine/loop"] >= shape.loop_target,
            )
        if shape.posteriors_target and "engine/posteriors" in row:
            add(
                f"{row['shape']}: engine / posteriors SGHMC",
                row["engine/posteriors"],
                f">= {shape.posteriors_target:g}",
                row["engine/posteriors"] >= shape.posteriors_target,
            )
    if results.get("scale"):
        from benchmarks.scale import targets as scale_targets

        for name, value, bound, ok in scale_targets(results["scale"]):
            add(name, value, bound, ok)
    if results.get("models"):
        from benchmarks.models import targets as model_targets

        for name, value, bound, ok in model_targets(results["models"]):
            add(name, value, bound, ok)
    if results.get("gpu"):
        from benchmarks.gpu import targets as gpu_targets

        for name, value, bound, ok in gpu_targets(results["gpu"]):
            add(name, value, bound, ok)
    fl = results.get("flower")
    if fl and "flower/engine" in fl:
        add(
            "Flower round loop / engine (F-MNIST N=10 T=50 K=10)",
            fl["flower/engine"],
            "<= 1.05",
            fl["flower/engine"] <= 1.05,
        )
    for p in results.get("paper", []):
        bound = 6.0 if p["model"] == "logistic" else 20.0
        value = p.get("measured_min", p["estimate_min"])
        what = "measured" if "measured_min" in p else "estimated"
        add(
            f"authors' protocol, paper-scale F-MNIST {p['model']} (min, {what})",
            value,
            f"<= {bound:g}",
            value <= bound,
        )
        if "measured/estimate" in p:
            r = p["measured/estimate"]
            add(f"  its measured / estimated time ({p['model']})", r, "0.8-1.2", 0.8 <= r <= 1.2)
    est = results.get("paper_estimate")
    if est:
        add(
            "paper-scale F-MNIST run (min, estimated)",
            est["minutes"],
            "<= 30",
            est["minutes"] <= 30,
        )
    mem = results.get("memory")
    if mem and "peak_rss_mb" in mem:
        add(
            "1,000 digits clients: peak RSS (MB)",
            mem["peak_rss_mb"],
            "<= 4096",
            mem["peak_rss_mb"] <= 4096,
        )
    dep = results.get("deploy")
    if dep and "ratio_tiny_round" in dep:
        r = dep["ratio_tiny_round"]
        add("deployed round, fedhmc T=K=1 / echo floor", r, "<= 1.2", r <= 1.2)
        r = dep["ratio_startup"]
        add("deployed start-up, fedhmc / echo floor", r, "<= 1.5", r <= 1.5)
    for ev in results.get("eval", []):
        add(
            f"BMA evaluation / round ({ev['shape']})",
            ev["eval/round"],
            "<= 0.05",
            ev["eval/round"] <= 0.05,
        )
    return out


def render(results: dict) -> str:
    """The results as markdown tables."""
    lines = [
        f"# Benchmarks {results['time']}",
        "",
        f"{results['machine']}; torch {results['torch']}, {results['threads']} threads"
        + ("; SMOKE (tiny sizes, no targets)" if results["smoke"] else ""),
    ]
    if results.get("shapes"):
        lines += [
            "",
            "Client-gradient evaluations per second (median of the repeats):",
            "",
            "| shape | threads | engine | batched | loop | posteriors | eng/best | eng/loop "
            "| batched/loop | eng/post |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
    for r in results.get("shapes", []):
        post = r.get("posteriors_evals_per_s")
        lines.append(
            f"| {r['shape']} | {r.get('threads', '—')} | {r['engine_evals_per_s']:,.0f} "
            f"| {r['batched_evals_per_s']:,.0f} | {r['loop_evals_per_s']:,.0f} | "
            + (f"{post:,.0f}" if post else "—")
            + f" | {r['engine/best']:.2f} | {r['engine/loop']:.1f} | "
            + (f"{r['batched/loop']:.1f}" if "batched/loop" in r else "—")
            + " | "
            + (f"{r['engine/posteriors']:.1f}" if post else "—")
            + " |"
        )
    for note in results.get("notes", []):
        lines += ["", f"Note: {note}"]
    fl = results.get("flower")
    if fl and "flower/engine" in fl:
        lines += [
            "",
            f"Flower vs engine ({fl['shape']}): round loop {fl['flower_loop_s']:.1f} s vs "
            f"{fl['engine_loop_s']:.1f} s (ratio {fl['flower/engine']:.2f}); Flower start-up "
            f"(Ray, SuperNodes) {fl['flower_startup_s']:.1f} s; same θ̄: {fl['same_theta']}.",
        ]
    if results.get("thread_counts"):
        from benchmarks.threads import render as render_threads

        lines += ["", render_threads(results["thread_counts"]).rstrip()]
    mem = results.get("memory")
    if mem and "peak_rss_mb" in mem:
        lines += [
            "",
            f"Memory ({mem['shape']}): peak RSS {mem['peak_rss_mb']:,.0f} MB, "
            f"{mem['wall_s']:.1f} s.",
        ]
    for ev in results.get("eval", []):
        lines += [
            "",
            f"BMA evaluation ({ev['shape']}): {1e3 * ev['eval_s']:.2f} ms vs a round "
            f"of {1e3 * ev['round_s']:.1f} ms ({100 * ev['eval/round']:.1f}%).",
        ]
    est = results.get("paper_estimate")
    if est:
        lines += [
            "",
            f"Paper-scale Fashion-MNIST run ({est['evals']:,} evaluations at "
            f"{est['evals_per_s']:,.0f}/s + 200 evaluations): about "
            f"{est['minutes']:.1f} min.",
        ]
    for p in results.get("paper", []):
        line = (
            f"Authors' protocol at paper scale ({p['model']}, 200 rounds of T = 50, K = 10, "
            f"{p['evals_per_round']:,} client gradients a round): {p['s_per_round']:.2f} s a "
            f"round, about {p['estimate_min']:.1f} min estimated"
        )
        if "measured_min" in p:
            line += (
                f"; measured {p['measured_min']:.1f} min "
                f"({p['measured/estimate']:.2f} × the estimate)"
            )
        lines += ["", line + "."]
    if results.get("models"):
        from benchmarks.models import render as render_models

        lines += ["", render_models(results["models"]).rstrip()]
    if results.get("scale"):
        from benchmarks.scale import render as render_scale

        lines += ["", render_scale(results["scale"]).rstrip()]
    if results.get("gpu"):
        from benchmarks.gpu import render as render_gpu

        lines += ["", render_gpu(results["gpu"]).rstrip()]
    if results.get("deploy"):
        from benchmarks.deploy import render as render_deploy

        lines += ["", render_deploy(results["deploy"]).rstrip()]
    tg = results.get("targets", [])
    if tg:
        lines += ["", "| measure | value | threshold | reached |", "|---|---:|---:|---|"]
        for t in tg:
            lines.append(f"| {t['target']} | {t['value']:.3g} | {t['bound']} | {t['status']} |")
    return "\n".join(lines) + "\n"


class _Stages:
    """The benchmark's progress: one bar over its stages, with the one running named."""

    def __init__(self, total: int):
        self.bar = bar(total, "benchmark", "stage")
        self.started = False

    def next(self, label: str) -> None:
        if self.bar is None:
            return
        if self.started:
            self.bar.update(1)
        self.started = True
        # No terminal (tqdm disabled, or fedhmc's plain progress): one line a stage, as a
        # log would want.
        if getattr(self.bar, "disable", True):
            print(f"... {label}", file=sys.stderr, flush=True)
        self.bar.set_description(label)

    def close(self) -> None:
        if self.bar is not None:
            if self.started:
                self.bar.update(1)
            self.bar.close()


def _count_stages(groups: set[str]) -> int:
    """About how many stages a run of ``groups`` has (the progress bar's total)."""
    n = sum(1 for s in SHAPES if s.key in groups)
    n += sum(1 for g in ("threads", "eval", "flower", "deploy", "memory") if g in groups)
    n += 3 if "scale" in groups else 0
    n += 2 if "paper" in groups else 0
    if "models" in groups:
        from benchmarks.models import GENERIC_SHAPES

        n += len(GENERIC_SHAPES) + 1
    if "gpu" in groups:
        from benchmarks.gpu import STAGES

        n += STAGES
    return max(1, n)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, seconds, no targets (CI)")
    ap.add_argument(
        "--only",
        default=None,
        help=f"comma-separated subset of {', '.join(GROUPS)} (default: all)",
    )
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats per strategy")
    ap.add_argument("--flower-rounds", type=int, default=6, help="rounds of the Flower run")
    ap.add_argument("--memory-rounds", type=int, default=5, help="rounds of the memory run")
    ap.add_argument("--deploy-rounds", type=int, default=6, help="rounds of each deployed run")
    ap.add_argument(
        "--confirm-paper",
        action="store_true",
        help="also make the 200-round paper-scale runs and compare them with the estimates",
    )
    ap.add_argument(
        "--out",
        default=None,
        help="directory for <time>.json and .md "
        "(default docs/results/benchmarks; --smoke writes nothing unless given)",
    )
    ap.add_argument(
        "--device",
        default=None,
        help="torch device of the models group (cpu, cuda, cuda:N; default cpu) and of the "
        "gpu group (default cuda; cpu checks it without a GPU); the other groups run on the "
        "CPU",
    )
    ap.add_argument(
        "--data-dir",
        default=None,
        metavar="DIR",
        help="folder holding the data sets' files, looked in first (as fedhmc run "
        "--data-dir; default: $FEDHMC_DATA, then the usual places)",
    )
    ap.add_argument("--quiet", action="store_true", help="no progress; only the report")
    args = ap.parse_args(argv)
    use_data_dir(args.data_dir)
    if args.only is not None:
        groups = {g.strip() for g in args.only.split(",")}
    else:
        groups = set(SMOKE_GROUPS if args.smoke else DEFAULT_GROUPS)
    unknown = groups - set(GROUPS)
    if unknown:
        raise ConfigError(
            f"--only: unknown group(s) {', '.join(sorted(unknown))}; choose from "
            f"{', '.join(GROUPS)}"
        )
    try:
        if args.device is not None and torch.device(args.device).type not in ("cpu", "cuda"):
            raise RuntimeError
    except RuntimeError:
        raise ConfigError(f"--device {args.device!r}: use cpu, cuda or cuda:N") from None
    gpu_device = None
    if "gpu" in groups:  # refuse before anything runs when the device is not here
        from benchmarks.gpu import resolve_device

        gpu_device = str(resolve_device(args.device, args.smoke))
    set_quiet(args.quiet)
    stages = _Stages(_count_stages(groups))
    torch.manual_seed(0)
    now = _dt.datetime.now(_dt.timezone.utc)
    results: dict = {
        "time": now.strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()} {os.cpu_count()} cores ({platform.node()})",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "smoke": args.smoke,
        "shapes": [],
        "eval": [],
        "notes": [],
    }
    have_fmnist = fmnist_available()
    for shape in SHAPES:
        if shape.key not in groups:
            continue
        if shape.dataset == "fashion-mnist" and not have_fmnist:
            results["notes"].append(f"{shape.label} skipped: {fmnist_missing()}")
            continue
        if args.smoke and (shape.dataset == "fashion-mnist" or shape.num_clients > 20):
            continue
        big = shape.dataset == "fashion-mnist"
        if args.smoke:
            T, K, rounds, repeats = 1, 2, 1, 1
        elif big:
            T, K, rounds, repeats = 1, 10, 1, 3
        else:  # 4 rounds: each timing lasts tens of milliseconds, not a few
            T, K, rounds, repeats = 5, 10, 4, 3
        if args.repeats is not None:
            repeats = args.repeats
        stages.next(f"{shape.label}")
        results["shapes"].append(
            bench_shape(shape, T, K, rounds, repeats, with_posteriors=not args.smoke)
        )
    if "threads" in groups:
        from benchmarks.threads import bench_threads

        stages.next("thread counts, idle and loaded")
        picked = [s for s in SHAPES if s.num_clients <= 20 and s.dataset == "digits"]
        if have_fmnist and not args.smoke:
            picked += [s for s in SHAPES if s.dataset == "fashion-mnist"]
        results["thread_counts"] = bench_threads(picked, smoke=args.smoke)
    if "eval" in groups:
        stages.next("BMA evaluation")
        results["eval"].append(bench_eval("digits", 1 if args.smoke else 5))
        if have_fmnist and not args.smoke:
            results["eval"].append(bench_eval("fashion-mnist", 3, T=5))
    fm = next((r for r in results["shapes"] if r["shape"].startswith("F-MNIST N=10")), None)
    if fm is not None and not args.smoke:
        eval_s = next((e["eval_s"] for e in results["eval"] if "fashion" in e["shape"]), 0.0)
        secs = PAPER_EVALS / fm["engine_evals_per_s"] + 200 * eval_s
        results["paper_estimate"] = {
            "evals": PAPER_EVALS,
            "evals_per_s": fm["engine_evals_per_s"],
            "eval_s": eval_s,
            "minutes": secs / 60,
        }
    if "paper" in groups and have_fmnist and not args.smoke:
        results["paper"] = []
        for model, rounds in (("logistic", 3), ("mlp", 1)):
            stages.next(f"authors' protocol at paper scale ({model})")
            results["paper"].append(bench_paper(model, rounds, args.confirm_paper))
    if "flower" in groups:
        if args.smoke:
            pass  # Ray start-up alone takes longer than a smoke run may
        elif not have_fmnist:
            results["notes"].append(f"Flower vs engine skipped: {fmnist_missing()}")
        else:
            stages.next("Flower vs engine")
            results["flower"] = bench_flower(args.flower_rounds, 50, 10)
    if "deploy" in groups and not args.smoke:
        from benchmarks.deploy import bench_deploy

        stages.next("deployment on loopback (a few minutes)")
        results["deploy"] = bench_deploy(args.deploy_rounds)
    if "models" in groups:
        from benchmarks.models import bench_models

        results["models"] = bench_models(
            smoke=args.smoke, repeats=args.repeats, device=args.device or "cpu", stage=stages.next
        )
    if "scale" in groups:
        from benchmarks.scale import bench_scale

        results["scale"] = bench_scale(smoke=args.smoke, stage=stages.next)
    if "gpu" in groups:
        from benchmarks.gpu import bench_gpu

        results["gpu"] = bench_gpu(
            device=gpu_device, smoke=args.smoke, repeats=args.repeats, stage=stages.next
        )
    if "memory" in groups:
        stages.next("memory")
        n, r = (20, 1) if args.smoke else (1000, args.memory_rounds)
        results["memory"] = bench_memory(n, r)
    stages.close()
    if not args.smoke:
        results["targets"] = targets(results)
    text = render(results)
    print(text, end="")
    out_dir = Path(args.out) if args.out else (None if args.smoke else RESULTS)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        stem = now.strftime("%Y%m%dT%H%M%SZ") + ("-smoke" if args.smoke else "")
        (out_dir / f"{stem}.json").write_text(json.dumps(results, indent=2, default=str))
        (out_dir / f"{stem}.md").write_text(text)
        print(f"wrote {out_dir / stem}.json and .md", file=sys.stderr)
    return 0


def cli(argv=None) -> int:
    try:
        return main(argv)
    except ConfigError as exc:
        print(f"python -m benchmarks: error: {exc}", file=sys.stderr)
        return 2
