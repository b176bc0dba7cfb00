"""The one-command GPU check: ``python -m benchmarks --only gpu [--device cuda]``.

Two parts, in under 8 minutes on one GPU:

1. **The matrix** (issue 35, point 3): ``pytest -m gpu tests/gpu`` in a child process with
   ``FEDHMC_TEST_DEVICE`` set to the device: every algorithm, both protocols, every
   participation scheme and the logistic, MLP, CNN and user models in float64 on the
   device against the CPU (1e-10 relative after 5 rounds), the float32 metrics within their
   stated tolerance, the asynchronous samplers, the MHMC reference, the participation draw,
   the random numbers and the metrics on the device, and checkpoints resumed across
   devices. The cells are defined once, in ``tests/gpu/gpu_cells.py``; the report lists
   each test's outcome, time and largest relative difference.
2. **Speed**: for logistic regression and LeNet-5 (fedhmc's ``cnn``) on Fashion-MNIST's
   shapes (1×28×28, 10 classes; uniform noise of that shape where the data is not
   installed), 10 clients, B = 32 and B = 1000, the time of fedhmc's batched leapfrog step
   (an FA-HMC round, ``fedhmc.algorithms.fahmc.step``, divided by its gradient evaluations)
   against a plain batched leapfrog step written here: draw every client's minibatch
   indices, the gradient of every client at once, the momentum and position updates. On
   CUDA the plain step is captured once in a CUDA graph (``torch.cuda.graphs``) and
   replayed; on the CPU it runs eagerly. The report gives the ratio fedhmc / plain (issue
   35's goal: ≤ 1.5 on a GPU) and client-gradient evaluations per second of both, with the
   device's name.

Without a GPU, ``--only gpu`` refuses in one line (``--device cpu`` checks it on the CPU);
``--smoke`` makes both parts tiny (a few cells and toy shapes: seconds), and on a machine
without a GPU runs them on the CPU, so that ``python -m benchmarks --smoke`` checks this
group too.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from fedhmc.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
TEST_FILE = "tests/gpu/test_same_chain.py"
GPU_TESTS = (
    "tests/gpu",
    "tests/unit/test_device_resume.py",
    "tests/integration/test_flower_gpu.py",
)
"""Where the tests marked ``gpu`` are (the Flower ones skip themselves without Flower)."""
SMOKE_TESTS = (
    f"{TEST_FILE}::test_float64_run_equals_cpu[fahmc-logistic]",
    f"{TEST_FILE}::test_float32_metrics_agree[f32-fahmc-logistic]",
    f"{TEST_FILE}::test_participation_draw_on_device",
    f"{TEST_FILE}::test_metric_functions_on_device",
    "tests/gpu/test_determinism.py::test_ece_is_the_same_in_every_run_and_on_every_device",
)
EMPTY_GRAPH_IS_AN_ERROR = ("-W", "error:The CUDA Graph is empty:UserWarning")
"""A capture that recorded nothing fails the test that made it."""
"""What ``--smoke`` runs of the matrix: one cell of each kind that takes under a second."""
MATRIX_TIMEOUT_S = 360
"""The matrix is stopped after this long (a few minutes on a GPU is expected; the report
keeps the tests that finished)."""
RATIO_GOAL = 1.5
"""Issue 35, point 5: fedhmc's leapfrog step within 1.5× of a plain captured step."""
NUM_CLIENTS = 10


@dataclass(frozen=True)
class SpeedShape:
    model: str  # "logistic" or "cnn" (LeNet-5)
    batch: int


SPEED_SHAPES = tuple(SpeedShape(m, b) for m in ("logistic", "cnn") for b in (32, 1000))
SMOKE_SHAPES = (SpeedShape("logistic", 4), SpeedShape("cnn", 4))


# ---------------------------------------------------------------------------------------
# The device.


def resolve_device(requested: str | None, smoke: bool = False) -> torch.device:
    """The device the group runs on: ``--device`` (default ``cuda``), or the CPU for a
    smoke run on a machine without a GPU. Raises ``ConfigError`` (one line) when the device
    is not here."""
    if requested is None:
        if smoke and not torch.cuda.is_available():
            return torch.device("cpu")
        requested = "cuda"
    try:
        dev = torch.device(requested)
    except (RuntimeError, ValueError):
        raise ConfigError(f"--device {requested!r}: use cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"the gpu group needs a GPU: torch sees no CUDA device here (--device "
                f"{requested}); add --device cpu to check it here"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(
                f"the gpu group needs a GPU: --device {requested}, but this machine has "
                f"{torch.cuda.device_count()} (cuda:0 … cuda:{torch.cuda.device_count() - 1}); "
                "add --device cpu to check it here"
            )
    elif dev.type != "cpu":
        raise ConfigError(f"--device {requested}: the gpu group runs on cuda, cuda:N or cpu")
    return dev


def device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    cpu = platform.processor() or platform.machine()
    return f"CPU ({cpu}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()})"


def _sync_fn(dev: torch.device):
    if dev.type == "cuda":
        return lambda: torch.cuda.synchronize(dev)
    return lambda: None


# ---------------------------------------------------------------------------------------
# 1. The matrix.


def run_matrix(dev: torch.device, smoke: bool, timeout_s: float = MATRIX_TIMEOUT_S) -> dict:
    """``pytest -m gpu`` on tests/gpu with ``FEDHMC_TEST_DEVICE`` = ``dev``, in a child
    process; its per-test lines (tests/gpu/conftest.py) summarised."""
    from benchmarks.common import child_env

    try:
        import pytest  # noqa: F401
    except ImportError:
        return {"skipped": "pytest is not installed (pip install -e '.[test]')"}
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "matrix.jsonl"
        env = child_env()
        env.update(FEDHMC_TEST_DEVICE=str(dev), FEDHMC_GPU_REPORT=str(report))
        env.setdefault("FLWR_TELEMETRY_ENABLED", "0")
        argv = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"]
        argv += ["-o", "addopts=", "--basetemp", str(Path(tmp) / "pytest")]
        argv += [*EMPTY_GRAPH_IS_AN_ERROR, *(SMOKE_TESTS if smoke else GPU_TESTS)]
        t0 = time.perf_counter()
        timed_out = False
        try:
            proc = subprocess.run(
                argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s
            )
            code, output = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:
            timed_out, code = True, None
            got = exc.stdout or ""
            output = got.decode(errors="replace") if isinstance(got, bytes) else got
        wall = time.perf_counter() - t0
        lines = report.read_text().splitlines() if report.exists() else []
    tests = [json.loads(line) for line in lines if line.strip()]
    out = {
        "device": str(dev),
        "command": f"FEDHMC_TEST_DEVICE={dev} python -m pytest -m gpu "
        + " ".join((*EMPTY_GRAPH_IS_AN_ERROR, *(SMOKE_TESTS if smoke else GPU_TESTS))),
        "wall_s": wall,
        "exit_code": code,
        "timed_out": timed_out,
        "tests": [_test_row(t) for t in tests],
    }
    for k in ("passed", "failed", "skipped"):
        out[k] = sum(1 for t in tests if t["outcome"] == k)
    f64 = [
        t["properties"]["max_rel"]
        for t in tests
        if t["outcome"] == "passed" and "float32" not in t["test"] and "max_rel" in t["properties"]
    ]
    out["max_rel_float64"] = max(f64) if f64 else None
    if not tests or (code not in (0, None) and out["failed"] == 0):
        out["error"] = "the matrix did not run: " + " | ".join(output.strip().splitlines()[-5:])
    if timed_out:
        out["error"] = f"stopped after {timeout_s:.0f} s with {len(tests)} test(s) reported"
    return out


def _test_row(t: dict) -> dict:
    name = t["test"].split("::", 1)[-1]
    row = {"test": name, "outcome": t["outcome"], "seconds": round(float(t["seconds"]), 3)}
    props = t.get("properties") or {}
    for k in ("max_rel", "theta_rel", "checks"):
        if k in props:
            row[k] = props[k]
    if t["outcome"] != "passed" and t.get("message"):
        row["message"] = t["message"]
    return row


# ---------------------------------------------------------------------------------------
# 2. Speed: fedhmc's step against a plain (captured) batched leapfrog step.


def _synthetic_fmnist(folder: str, per_client: int, test: int) -> str:
    """Uniform noise of Fashion-MNIST's shape (1×28×28, 10 classes): ``per_client``
    training images for each of the 10 clients, and ``test`` test images."""
    import numpy as np

    rng = np.random.default_rng(0)
    n = NUM_CLIENTS * per_client
    path = Path(folder) / "synthetic-fmnist.npz"
    np.savez(
        path,
        x_train=rng.random((n, 1, 28, 28), dtype=np.float32),
        y_train=rng.integers(0, 10, n),
        x_test=rng.random((test, 1, 28, 28), dtype=np.float32),
        y_test=rng.integers(0, 10, test),
    )
    return str(path)


def _problem(dataset: str, model: str, batch: int, dev: torch.device):
    from fedhmc.runtime.config import RunConfig
    from fedhmc.runtime.problem import build_problem

    cfg = RunConfig(
        dataset=dataset,
        model=model,
        num_clients=NUM_CLIENTS,
        partition="iid",
        batch_size=batch,
        chains=1,
        device=str(dev),
        compile=False if dev.type == "cpu" else None,  # (on the CPU: a check, not a timing)
    ).resolve()
    return cfg, build_problem(cfg, dev)


def _fedhmc_fn(cfg, problem, dev, T: int, K: int, rounds: int):
    """``rounds`` FA-HMC rounds as a run makes them (the run's sampler settings with
    T and K set): returns (fn, leapfrog steps per call, per client)."""
    from fedhmc.algorithms import fahmc
    from fedhmc.runtime.loop import sampler_settings
    from fedhmc.runtime.problem import initial_position

    settings = sampler_settings(cfg.replace(local_steps=T, leapfrog_steps=K))
    theta0 = initial_position(problem.model, problem.dim, cfg, dev)
    target = problem.target
    sync = _sync_fn(dev)
    state = fahmc.init(theta0.clone(), settings)
    _, info = fahmc.step(0, state, target, settings)
    per_round = info.grad_evals // (theta0.shape[0] * target.num_clients)

    def fn():
        s = fahmc.init(theta0.clone(), settings)
        for _ in range(rounds):
            s, _ = fahmc.step(0, s, target, settings)
        sync()

    return fn, rounds * per_round


def _plain_step(problem, batch: int, step_size: float, dev: torch.device):
    """One plain batched leapfrog step of every client (closure over static tensors that
    it updates in place): draw B indices per client, the minibatch gradient of every
    client at once (scaled to the client's data, plus a N(0, I) prior), then the momentum
    and position updates. The same data and model as fedhmc's target."""
    target = problem.target
    X, y = target.X.to(dev), target.y.to(dev)  # (N, n_max, F), (N, n_max)
    N = X.shape[0]
    n = int(target.counts.min())
    B = min(batch, n)
    scale = n / B
    cid = torch.arange(N, device=dev).view(N, 1)
    eta = float(step_size)
    dtype = X.dtype
    if problem.model.name == "logistic":
        F, C = X.shape[-1], problem.model.num_classes
        W = torch.zeros(N, F, C, dtype=dtype, device=dev)
        P_mom = torch.zeros_like(W)
        minus = torch.full((N, B, 1), -1.0, dtype=dtype, device=dev)

        def step():
            idx = torch.randint(0, n, (N, B), device=dev)
            Xb, yb = X[cid, idx], y[cid, idx]
            P = torch.softmax(torch.bmm(Xb, W), -1)
            P.scatter_add_(-1, yb.unsqueeze(-1), minus)
            g = torch.baddbmm(W, Xb.transpose(1, 2), P, alpha=scale)  # prior N(0, I): + W
            P_mom.add_(g, alpha=-eta)
            W.add_(P_mom, alpha=eta)

        return step

    from torch.func import functional_call, grad, vmap

    from fedhmc.models.cnn import lenet5

    shape = tuple(problem.model.kwargs["in_shape"])
    net = lenet5(shape, problem.model.num_classes).to(dev, dtype)
    params = {
        k: v.detach().unsqueeze(0).repeat(N, *[1] * v.dim()) for k, v in net.named_parameters()
    }
    moms = {k: torch.zeros_like(v) for k, v in params.items()}
    keys = list(params)

    def loss(p, xb, yb):
        logits = functional_call(net, p, (xb.view(-1, *shape),))
        return torch.nn.functional.cross_entropy(logits, yb, reduction="sum")

    grads = vmap(grad(loss))

    def step():
        idx = torch.randint(0, n, (N, B), device=dev)
        g = grads(params, X[cid, idx], y[cid, idx])
        ps, ms = [params[k] for k in keys], [moms[k] for k in keys]
        gs = torch._foreach_add([g[k] for k in keys], ps, alpha=1 / scale)  # prior
        torch._foreach_add_(ms, gs, alpha=-eta * scale)
        torch._foreach_add_(ps, ms, alpha=eta)

    return step


def _captured(step, dev: torch.device):
    """``step`` captured once in a CUDA graph: returns (replay, note)."""
    if dev.type != "cuda":
        return step, "eager (CPU)"
    try:
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream):
            for _ in range(3):  # warm-up (cuDNN and cuBLAS handles, the allocator)
                step()
        torch.cuda.current_stream(dev).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        return graph.replay, "CUDA graph"
    except Exception as exc:  # the report says why and times the eager step
        torch.cuda.synchronize(dev)
        return step, f"eager (capture failed: {type(exc).__name__}: {str(exc)[:120]})"


def bench_speed_shape(
    dataset: str, shape: SpeedShape, dev: torch.device, T: int, K: int, rounds: int, repeats: int
) -> dict:
    """fedhmc's leapfrog step and the plain one on one shape: times, evaluations per
    second (client gradients), and the ratio fedhmc / plain."""
    cfg, problem = _problem(dataset, shape.model, shape.batch, dev)
    B = min(shape.batch, int(problem.target.counts.min()))
    fed, steps = _fedhmc_fn(cfg, problem, dev, T, K, rounds)
    plain_step = _plain_step(problem, shape.batch, cfg.step_size, dev)
    replay, how = _captured(plain_step, dev)
    sync = _sync_fn(dev)

    def plain():
        for _ in range(steps):
            replay()
        sync()

    from benchmarks.common import interleaved

    secs = interleaved({"fedhmc": fed, "plain": plain}, repeats)
    fed_step, plain_step_s = secs["fedhmc"] / steps, secs["plain"] / steps
    return {
        "shape": f"{'LeNet-5' if shape.model == 'cnn' else 'logistic'} N={NUM_CLIENTS} B={B} "
        f"D={problem.dim}",
        "model": shape.model,
        "batch": B,
        "T": T,
        "K": K,
        "rounds": rounds,
        "steps": steps,
        "repeats": repeats,
        "plain": how,
        "fedhmc_step_ms": 1e3 * fed_step,
        "plain_step_ms": 1e3 * plain_step_s,
        "fedhmc_evals_per_s": NUM_CLIENTS / fed_step,
        "plain_evals_per_s": NUM_CLIENTS / plain_step_s,
        "fedhmc/plain": fed_step / plain_step_s,
    }


def bench_speed(dev: torch.device, smoke: bool, repeats: int | None, stage) -> dict:
    from benchmarks.common import FMNIST_DIR, fmnist_available

    out: dict = {"rows": [], "notes": []}
    with tempfile.TemporaryDirectory() as tmp:
        if smoke:
            dataset, out["data"] = _synthetic_fmnist(tmp, 16, 20), "synthetic (smoke)"
        elif fmnist_available():
            dataset, out["data"] = "fashion-mnist", "Fashion-MNIST"
        else:
            dataset, out["data"] = _synthetic_fmnist(tmp, 2000, 1000), "synthetic"
            out["notes"].append(
                f"Fashion-MNIST is not in {FMNIST_DIR}: timed on uniform noise of its shape "
                "(1×28×28, 10 classes, 2,000 images per client)"
            )
        for shape in SMOKE_SHAPES if smoke else SPEED_SHAPES:
            if smoke:
                T, K, rounds, r = 1, 2, 1, 1
            elif dev.type == "cuda":  # each timed call lasts 0.05–0.5 s
                T, K, rounds, r = 1, 10, (10 if shape.model == "logistic" else 2), 5
            elif shape.model == "cnn":  # the CPU: a check, not the goal's measurement
                T, K, rounds, r = 1, 2, 1, 2
            else:
                T, K, rounds, r = 1, 10, 2, 3
            stage(f"gpu speed: {shape.model} B={shape.batch} on {dev}")
            try:
                row = bench_speed_shape(dataset, shape, dev, T, K, rounds, repeats or r)
            except Exception as exc:  # one shape's failure is reported
                row = {
                    "shape": f"{shape.model} N={NUM_CLIENTS} B={shape.batch}",
                    "model": shape.model,
                    "batch": shape.batch,
                    "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                }
            out["rows"].append(row)
    return out


AUTHORS_CELL = ROOT / "docs" / "results" / "paper-fmnist-T" / "cells" / "authors_T=50_seed=0"
"""The paper's Fashion-MNIST logistic regression under the authors' protocol (T = 50
leapfrog steps a round, K = 10, B = 1000 reshuffled, η = 1e-4, 200 rounds), as run on the
CPU for the results page: its ``config.json`` is rerun on the device and its ``metrics.csv``
is the reference."""
AUTHORS_RTOL = 1e-2
"""The float32 tolerance of the smooth metrics (tests/gpu: RTOL_F32_SMOOTH)."""
AUTHORS_GOAL_S = 8.0
"""Issue 35, point 5: the 200 rounds in at most 8 s on one H100."""


def bench_authors(dev: torch.device, smoke: bool) -> dict:
    """`AUTHORS_CELL` rerun on ``dev`` (200 rounds on CUDA; 10 on the CPU, 2 in a smoke
    run): the run's wall time, and its metrics against the CPU's at the same round."""
    import csv

    import fedhmc
    from benchmarks.common import fmnist_available, fmnist_missing
    from fedhmc.runtime.config import RunConfig, recorded_settings

    if not fmnist_available():
        return {"skipped": fmnist_missing()}
    rounds = 200 if dev.type == "cuda" and not smoke else (2 if smoke else 10)
    saved = json.loads((AUTHORS_CELL / "config.json").read_text())
    with open(AUTHORS_CELL / "metrics.csv", newline="") as f:
        reference = {int(r["round"]): r for r in csv.DictReader(f)}
    with tempfile.TemporaryDirectory() as tmp:
        settings = {**recorded_settings(saved), "rounds": rounds, "device": str(dev)}
        cfg = RunConfig.from_mapping({**settings, "out": tmp, "data_dir": None}).resolve()
        t0 = time.perf_counter()
        result = fedhmc.run(cfg, progress=False)
        elapsed = time.perf_counter() - t0
    final, ref = result.final, reference[rounds]
    metrics = ("accuracy", "brier", "ece", "nll_sum")
    return {
        "rounds": rounds,
        "wall_s": elapsed,
        "rounds_s": float(final["wall_s"]),
        "cuda_graphs": bool(cfg.cuda_graphs),
        "metrics": {m: float(final[m]) for m in metrics},
        "cpu_metrics": {m: float(ref[m]) for m in metrics},
        # The smooth metrics (float32 on another device rounds differently: the tolerance
        # of tests/gpu's float32 cells).
        "max_rel": max(
            abs(float(final[m]) - float(ref[m])) / max(abs(float(ref[m])), 1e-300)
            for m in ("brier", "nll_sum")
        ),
    }


# ---------------------------------------------------------------------------------------
# The group.


def bench_gpu(
    device: str | None = None, smoke: bool = False, repeats: int | None = None, stage=None
) -> dict:
    """The matrix and the speed report on ``device`` (default ``cuda``; see
    ``resolve_device``): what the suite stores under ``results["gpu"]``."""
    stage = stage or (lambda label: None)
    dev = resolve_device(device, smoke)
    out: dict = {
        "device": str(dev),
        "device_name": device_name(dev),
        "smoke": smoke,
        "notes": [],
    }
    if dev.type != "cuda":
        out["notes"].append(
            f"run on {dev}, not a GPU: the matrix compares the CPU with itself (it checks "
            "the harness) and the plain step runs eagerly; run it with --device cuda on a GPU"
        )
    stage(f"gpu matrix on {dev} (pytest -m gpu)")
    t0 = time.perf_counter()
    out["matrix"] = run_matrix(dev, smoke)
    with torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext():
        # (graphs are captured on the current device: make it this one)
        out["speed"] = bench_speed(dev, smoke, repeats, stage)
        stage(f"gpu: the authors' Fashion-MNIST protocol on {dev}")
        try:
            out["authors"] = bench_authors(dev, smoke)
        except Exception as exc:  # reported, not fatal: the rest of the report stands
            out["authors"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    out["wall_s"] = time.perf_counter() - t0
    return out


STAGES = 2 + len(SPEED_SHAPES)


def targets(gpu: dict) -> list[tuple[str, float, str, bool]]:
    """(measure, value, threshold, reached): the matrix, and on CUDA the speed goal."""
    out = []
    m = gpu.get("matrix") or {}
    if "passed" in m:
        total = m["passed"] + m["failed"]
        out.append(
            (
                f"same chain on {gpu['device']} as on the CPU (pytest -m gpu): tests passed",
                float(m["passed"]),
                f"= {total}",
                m["failed"] == 0 and total > 0 and not m.get("error"),
            )
        )
    a = gpu.get("authors") or {}
    if "metrics" in a:
        out.append(
            (
                f"authors' F-MNIST logistic regression, {a['rounds']} rounds on "
                f"{gpu['device']}: Brier and NLL, largest relative difference from the CPU's",
                a["max_rel"],
                f"<= {AUTHORS_RTOL:g}",
                a["max_rel"] <= AUTHORS_RTOL,
            )
        )
        if gpu["device"].startswith("cuda") and a["rounds"] == 200:
            out.append(
                (
                    f"authors' F-MNIST logistic regression, 200 rounds on {gpu['device_name']}: "
                    "seconds",
                    a["wall_s"],
                    f"<= {AUTHORS_GOAL_S:g}",
                    a["wall_s"] <= AUTHORS_GOAL_S,
                )
            )
    if gpu["device"].startswith("cuda"):
        for row in (gpu.get("speed") or {}).get("rows", []):
            if "fedhmc/plain" in row:
                r = row["fedhmc/plain"]
                out.append(
                    (
                        f"{row['shape']}: fedhmc step / plain captured step",
                        r,
                        f"<= {RATIO_GOAL:g}",
                        r <= RATIO_GOAL,
                    )
                )
    return out


def render(gpu: dict) -> str:
    """The group's report (markdown)."""
    lines = [
        f"## GPU check on {gpu['device']}: {gpu['device_name']}"
        + (" (smoke)" if gpu.get("smoke") else ""),
        "",
    ]
    for note in gpu.get("notes", []):
        lines += [f"Note: {note}", ""]
    m = gpu.get("matrix") or {}
    if "skipped" in m and isinstance(m["skipped"], str):
        lines += [f"Matrix not run: {m['skipped']}.", ""]
    elif m:
        worst = m.get("max_rel_float64")
        lines += [
            f"Matrix (`{m['command']}`): {m['passed']} passed, {m['failed']} failed, "
            f"{m['skipped']} skipped in {m['wall_s']:.0f} s; largest float64 relative "
            "difference " + (f"{worst:.2g}" if worst is not None else "—") + " (bound 1e-10).",
            "",
        ]
        if m.get("error"):
            lines += [f"Matrix error: {m['error']}", ""]
        lines += ["| test | outcome | s | max rel. diff. |", "|---|---|---:|---:|"]
        for t in m.get("tests", []):
            rel = t.get("max_rel")
            lines.append(
                f"| {t['test']} | {t['outcome']} | {t['seconds']:.2f} | "
                + (f"{rel:.2g}" if isinstance(rel, (int, float)) else "—")
                + " |"
            )
        bad = [t for t in m.get("tests", []) if t["outcome"] == "failed"]
        for t in bad:
            lines.append(f"\n- {t['test']}: {t.get('message', '')}")
        lines.append("")
    sp = gpu.get("speed") or {}
    if sp.get("rows"):
        lines += [
            f"Speed ({sp.get('data', '')} shapes, {NUM_CLIENTS} clients): one batched leapfrog "
            "step of every client, fedhmc's (an FA-HMC round / its gradient evaluations) "
            "against a plain step written in the benchmark; client-gradient evaluations "
            "per second.",
            "",
            "| shape | fedhmc ms/step | plain ms/step | plain | fedhmc evals/s | "
            "plain evals/s | fedhmc / plain |",
            "|---|---:|---:|---|---:|---:|---:|",
        ]
        for r in sp["rows"]:
            if "error" in r:
                lines.append(f"| {r['shape']} | failed: {r['error']} | | | | | |")
                continue
            lines.append(
                f"| {r['shape']} | {r['fedhmc_step_ms']:.3f} | {r['plain_step_ms']:.3f} | "
                f"{r['plain']} | {r['fedhmc_evals_per_s']:,.0f} | {r['plain_evals_per_s']:,.0f} "
                f"| {r['fedhmc/plain']:.2f} |"
            )
        for note in sp.get("notes", []):
            lines += ["", f"Note: {note}"]
        lines.append("")
    a = gpu.get("authors") or {}
    if a:
        lines += ["The paper's Fashion-MNIST logistic regression under the authors' protocol", ""]
    if "skipped" in a or "error" in a:
        lines.append(f"Not run: {a.get('skipped') or a.get('error')}")
    elif a:
        names = ("accuracy", "brier", "ece", "nll_sum")
        lines += [
            f"{a['rounds']} rounds (T = 50 leapfrog steps, K = 10, B = 1000 reshuffled) in "
            f"{a['wall_s']:.1f} s ({a['rounds_s']:.1f} s in the rounds; CUDA graphs "
            f"{'on' if a['cuda_graphs'] else 'off'}), against the CPU run on the results page:",
            "",
            "| | " + " | ".join(names) + " |",
            "|---|" + "---:|" * len(names),
            "| here | " + " | ".join(f"{a['metrics'][m]:.6g}" for m in names) + " |",
            "| CPU | " + " | ".join(f"{a['cpu_metrics'][m]:.6g}" for m in names) + " |",
        ]
    return "\n".join(lines).rstrip() + "\n"
