"""The generic ``nn.Module`` path against the hand-written models and plain loops:
``python -m benchmarks --only models``.

Two measurements, each timed interleaved in one process after a warm-up (medians of the
repeats), in client-gradient evaluations per second of FA-HMC rounds
(``fedhmc.algorithms.fahmc.step``: T·(K+1)·N evaluations a round):

1. **Generic against hand-written.** The built-in logistic regression and MLP
   (``fedhmc.models.nets``, closed-form and hand-written backpropagation) against the
   same models written as ordinary ``nn.Module`` s and sampled through
   ``fedhmc.models.module.TorchModel`` (``vmap`` of the module with θ's rows bound in as
   ``functional_call`` would, one reverse pass): ``nn.Linear``; a module with one
   parameter W of shape (F+1, C) applied to [x, 1]; ``nn.Sequential(Linear, ReLU,
   Linear, ReLU, Linear)`` with the built-in widths. Same data, clients, batch, step
   size, T and K; the ratio generic / hand-written.
2. **LeNet-5 on Fashion-MNIST, 10 clients.** fedhmc's generic path with both batchings
   (``vmap`` and ``loop``; ``auto`` picks one by a fixed rule) against (a) a per-client
   Python loop of the same module with plain autograd (for each client: forward a
   minibatch, ``loss.backward()``, a leapfrog-like momentum update), and (b) posteriors'
   SGHMC, one chain per client, on the same module through ``functional_call``. Same
   number of evaluations, same batch per client; at one thread and at one thread per core.

``--device cuda`` moves this group to the GPU (the other groups stay on the CPU). Without
Fashion-MNIST on disk the CNN and the Fashion-MNIST-sized shapes run on synthetic
28×28 data of the same size (60,000 images), and the report says so.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from itertools import product
from pathlib import Path

import torch
from torch import nn

from fedhmc.algorithms import fahmc

# ---------------------------------------------------------------------------------------
# The modules a user would write (importable, so that --model can name them).


class AffineSoftmax(nn.Module):
    """Logistic regression as the built-in lays it out: logits = [x, 1] W, W (F+1, C)."""

    def __init__(self, num_features: int, num_classes: int, device=None):
        super().__init__()  # ``device`` as torch's layers take it (TorchModel moves it anyway)
        self.W = nn.Parameter(torch.zeros(num_features + 1, num_classes, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        return x @ self.W[:-1] + self.W[-1]  # = [x, 1] W without copying x


def linear(num_features: int, num_classes: int) -> nn.Module:
    """Logistic regression as a user writes it: ``nn.Linear`` (flattening image rows)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(num_features, num_classes))


def affine(num_features: int, num_classes: int) -> nn.Module:
    """Logistic regression with the built-in's parameter layout, (F+1, C)."""
    return AffineSoftmax(num_features, num_classes)


def mlp(num_features: int, num_classes: int, hidden: tuple[int, ...] = (100, 100)) -> nn.Module:
    """The built-in MLP as an ``nn.Sequential`` (Linear, ReLU, …, Linear)."""
    layers: list[nn.Module] = [nn.Flatten()]
    widths = (num_features, *hidden, num_classes)
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


GENERIC = {
    "logistic": (
        ("nn.Linear", "benchmarks.models:linear"),
        ("W on [x,1]", "benchmarks.models:affine"),
    ),
    "mlp": (("nn.Sequential", "benchmarks.models:mlp"),),
}

GENERIC_TARGET = 0.8  # generic / hand-written (compiled where a long run compiles)
COMPILED = {"cpu": (False, True), "cuda": (False,)}
"""The generic path without and, on a CPU, with ``--compile``."""
CNN_LOOP_TARGET = 1.0  # fedhmc / per-client autograd loop
CNN_POSTERIORS_TARGET = 1.3  # fedhmc / posteriors SGHMC


@dataclass
class GenericShape:
    label: str
    dataset: str  # "digits" or "fashion-mnist" (synthetic of the same size without the data)
    model: str  # "logistic" or "mlp"
    num_clients: int
    batch: int


GENERIC_SHAPES = (
    GenericShape("digits logistic N=10 B=32", "digits", "logistic", 10, 32),
    GenericShape("digits MLP N=10 B=32", "digits", "mlp", 10, 32),
    GenericShape("F-MNIST logistic N=10 B=32", "fashion-mnist", "logistic", 10, 32),
    GenericShape("F-MNIST MLP N=10 B=32", "fashion-mnist", "mlp", 10, 32),
    GenericShape("F-MNIST logistic N=10 B=1000", "fashion-mnist", "logistic", 10, 1000),
    GenericShape("F-MNIST MLP N=10 B=1000", "fashion-mnist", "mlp", 10, 1000),
)


# ---------------------------------------------------------------------------------------
# Helpers.


def _sync_fn(device: torch.device):
    if device.type == "cuda":
        return torch.cuda.synchronize
    return lambda: None


def _engine(target, settings, rounds: int, theta0: torch.Tensor, sync):
    """``rounds`` FA-HMC rounds from ``theta0`` (S, D): what every engine timing runs."""

    def engine():
        state = fahmc.init(theta0.clone(), settings)
        for _ in range(rounds):
            state, _ = fahmc.step(0, state, target, settings)
        sync()

    return engine


def _at_threads(fn, n: int):
    def wrapped():
        torch.set_num_threads(n)
        fn()

    return wrapped


def synthetic_fmnist(folder: str | os.PathLike) -> str:
    """A ``.npz`` the size of Fashion-MNIST (60,000 + 10,000 images of 1×28×28, 10
    classes) of uniform noise: for timings where the real data is not installed."""
    import numpy as np

    rng = np.random.default_rng(0)
    path = Path(folder) / "synthetic-fmnist.npz"
    np.savez(
        path,
        x_train=rng.random((60_000, 1, 28, 28), dtype=np.float32),
        y_train=rng.integers(0, 10, 60_000),
        x_test=rng.random((10_000, 1, 28, 28), dtype=np.float32),
        y_test=rng.integers(0, 10, 10_000),
    )
    return str(path)


def _cfg(dataset: str, model, N: int, B: int, **kw):
    from fedhmc.runtime.config import RunConfig

    return RunConfig(
        dataset=dataset,
        model=model,
        num_clients=N,
        batch_size=B,
        partition="iid",
        chains=1,
        **kw,
    ).resolve()


# ---------------------------------------------------------------------------------------
# 1. Generic against hand-written.


def bench_generic(
    shape: GenericShape,
    dataset: str,
    T: int,
    K: int,
    rounds: int,
    repeats: int,
    device: torch.device,
) -> dict:
    """Evaluations per second of the built-in model and its ``nn.Module`` twins."""
    from fedhmc.models.loading import format_model_args
    from fedhmc.runtime.problem import build_problem, initial_position
    from fedhmc.runtime.threads import auto_threads, gradient_work

    cfg_h = _cfg(dataset, shape.model, shape.num_clients, shape.batch)
    prob_h = build_problem(cfg_h, device)
    target_h = prob_h.target
    model_h = prob_h.model
    settings = fahmc.Settings(cfg_h.step_size, K, T, rho=1.0)
    sync = _sync_fn(device)
    fns = {
        "hand-written": _engine(
            target_h, settings, rounds, initial_position(model_h, target_h.dim, cfg_h, device), sync
        )
    }
    batchings = {}
    # On a CPU also compiled (--compile: what a run of 200,000 evaluations or more uses).
    for (label, spec), compiled in product(GENERIC[shape.model], COMPILED[device.type]):
        kwargs = {"num_features": model_h.num_features, "num_classes": model_h.num_classes}
        if shape.model == "mlp":
            kwargs["hidden"] = tuple(model_h.hidden)
        cfg_g = _cfg(
            dataset,
            spec,
            shape.num_clients,
            shape.batch,
            model_arg=format_model_args(kwargs),
            step_size=cfg_h.step_size,
            prior_std=cfg_h.prior_std,
            scaling=cfg_h.scaling,
            compile=compiled,
        )
        prob_g = build_problem(cfg_g, device)
        if prob_g.target.dim != target_h.dim:
            raise RuntimeError(f"{label}: D = {prob_g.target.dim}, built-in D = {target_h.dim}")
        label = f"{label}, compiled" if prob_g.model.compiled else label
        batchings[label] = prob_g.model.batching
        theta0 = initial_position(prob_g.model, prob_g.target.dim, cfg_g, device)
        fns[label] = _engine(prob_g.target, settings, rounds, theta0, sync)
        fns[label]()  # compiled for the run's shapes before the timing
    from benchmarks.common import interleaved

    N, D = target_h.num_clients, target_h.dim
    before = torch.get_num_threads()
    threads = before if device.type != "cpu" else auto_threads(gradient_work(N, 1, shape.batch, D))
    torch.set_num_threads(threads)
    try:
        secs = interleaved(fns, repeats)
    finally:
        torch.set_num_threads(before)
    evals = rounds * T * (K + 1) * N
    rate = {k: evals / s for k, s in secs.items()}
    return {
        "shape": f"{shape.label} D={D}",
        "dataset": dataset,
        "model": shape.model,
        "batch": shape.batch,
        "threads": threads,
        "T": T,
        "K": K,
        "rounds": rounds,
        "repeats": repeats,
        "evals": evals,
        "evals_per_s": rate,
        "batching": batchings,
        "ratios": {k: rate[k] / rate["hand-written"] for k in rate if k != "hand-written"},
    }


# ---------------------------------------------------------------------------------------
# 2. LeNet-5: fedhmc's batchings against a per-client autograd loop and posteriors.


def _client_tensors(target):
    N = target.num_clients
    Xc = [target.X[c, : int(target.counts[c])] for c in range(N)]
    yc = [target.y[c, : int(target.counts[c])] for c in range(N)]
    return Xc, yc


def _manual_loop(model, theta0, Xc, yc, b, steps, step_size, num_total, gen, device, sync):
    """What a user writes by hand: one module per client, autograd, a momentum update."""
    from fedhmc.models.cnn import lenet5

    params0 = model.unflatten(theta0[0])
    modules, moms = [], []
    for _ in Xc:
        m = lenet5(**model.kwargs).to(device)
        with torch.no_grad():
            for k, p in m.named_parameters():
                p.copy_(params0[k])
        modules.append(m)
        moms.append([torch.zeros_like(p) for p in m.parameters()])
    scale = num_total / b

    def loop():
        for _ in range(steps):
            for c, m in enumerate(modules):
                n_c = Xc[c].shape[0]
                idx = torch.randint(0, n_c, (b,), generator=gen, device=gen.device).to(device)
                xb, yb = Xc[c][idx], yc[c][idx]
                m.zero_grad(set_to_none=True)
                loss = nn.functional.cross_entropy(m(xb), yb, reduction="sum") * scale
                loss.backward()
                with torch.no_grad():  # p ← p − η ∇f, θ ← θ + η p (a leapfrog-like step)
                    for p, v in zip(m.parameters(), moms[c], strict=True):
                        v.add_(p.grad, alpha=-step_size)
                        p.add_(v, alpha=step_size)
        sync()

    return loop, modules


def bench_cnn(
    dataset: str,
    N: int,
    B: int,
    T: int,
    K: int,
    rounds: int,
    repeats: int,
    thread_counts: tuple[int, ...],
    device: torch.device,
    with_posteriors: bool = True,
) -> dict:
    """Evaluations per second of LeNet-5 sampled by fedhmc (vmap, loop) and by hand."""
    from benchmarks.common import interleaved, posteriors_fn
    from fedhmc.runtime.problem import build_problem, initial_position
    from fedhmc.runtime.threads import auto_threads, gradient_work

    cfg = _cfg(dataset, "cnn", N, B)
    problem = build_problem(cfg, device)
    target, model = problem.target, problem.model
    auto = model.batching
    theta0 = initial_position(model, target.dim, cfg, device)
    settings = fahmc.Settings(cfg.step_size, K, T, rho=1.0)
    sync = _sync_fn(device)
    steps = rounds * T * (K + 1)
    evals = steps * N
    b = min(B, int(target.counts.min()))
    strategies = {}
    for batching in ("vmap", "loop"):  # --model-batching, as a run sets it
        t = build_problem(_cfg(dataset, "cnn", N, B, model_batching=batching), device).target
        if t.model.batching != batching:
            raise RuntimeError(f"--model-batching {batching} gave {t.model.batching}")
        strategies[f"fedhmc {batching}"] = _engine(t, settings, rounds, theta0, sync)
    Xc, yc = _client_tensors(target)
    gen = torch.Generator().manual_seed(0)
    loop, modules = _manual_loop(
        model, theta0, Xc, yc, b, steps, cfg.step_size, target.num_total, gen, device, sync
    )
    strategies["autograd loop"] = loop
    if with_posteriors:
        post = posteriors_fn(modules, Xc, yc, b, False, steps, gen)
        if post is not None:

            def posteriors(post=post):
                post()
                sync()

            strategies["posteriors SGHMC"] = posteriors
    fns = {}
    for n in thread_counts:
        for k, fn in strategies.items():
            fns[(k, n)] = _at_threads(fn, n)
    before = torch.get_num_threads()
    try:
        secs = interleaved(fns, repeats)
    finally:
        torch.set_num_threads(before)
    rows = []
    for n in thread_counts:
        rate = {k: evals / secs[(k, n)] for k in strategies}
        fed = rate[f"fedhmc {auto}"]
        row = {
            "threads": n,
            "evals_per_s": rate,
            "vmap/loop": rate["fedhmc vmap"] / rate["fedhmc loop"],
        }
        row["fedhmc/autograd loop"] = fed / rate["autograd loop"]
        if "posteriors SGHMC" in rate:
            row["fedhmc/posteriors"] = fed / rate["posteriors SGHMC"]
        rows.append(row)
    D = target.dim
    return {
        "shape": f"LeNet-5 {'digits' if dataset == 'digits' else 'F-MNIST'} N={N} B={b} D={D}",
        "dataset": dataset,
        "batch": b,
        "T": T,
        "K": K,
        "rounds": rounds,
        "repeats": repeats,
        "evals": evals,
        "auto_batching": auto,
        "auto_threads": auto_threads(gradient_work(N, 1, b, D)) if device.type == "cpu" else None,
        "rows": rows,
    }


# ---------------------------------------------------------------------------------------
# The group.


def bench_models(
    smoke: bool = False, repeats: int | None = None, device: str = "cpu", stage=None
) -> dict:
    """Both measurements; what the suite stores under ``results["models"]``. ``stage(label)``
    is called as each part starts (the suite's progress bar)."""
    stage = stage or (lambda label: None)
    from benchmarks.common import fmnist_available

    out: dict = {"device": device, "notes": [], "load_before": list(os.getloadavg())}
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        out["notes"].append(
            f"--device {device} asked for, but there is no GPU here: measured on CPU"
        )
        dev = torch.device("cpu")
    out["measured_on"] = str(dev)
    if dev.type == "cuda":
        out["cuda"] = f"measured on {torch.cuda.get_device_name(dev)}"
    elif torch.cuda.is_available():
        out["cuda"] = "not measured (run with --device cuda)"
    else:
        out["cuda"] = "not measured (no GPU on this machine)"
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        fmnist = "fashion-mnist"
        if not smoke and not fmnist_available():
            fmnist = synthetic_fmnist(tmp)
            out["notes"].append(
                "Fashion-MNIST is not installed here: its shapes ran on synthetic 1×28×28 "
                "noise of the same size (60,000 training images, 10 classes)"
            )
        if smoke:
            out["fmnist_data"] = "not run (smoke)"
        else:
            out["fmnist_data"] = "real" if fmnist == "fashion-mnist" else "synthetic"
        out["generic"] = []
        for shape in GENERIC_SHAPES:
            if smoke and shape.dataset != "digits":
                continue
            if smoke:
                T, K, rounds, r = 1, 2, 1, 1
            elif shape.batch >= 1000:
                T, K, rounds, r = 1, 10, 1, 5
            else:
                T, K, rounds, r = 5, 10, 4, 5
            data = "digits" if shape.dataset == "digits" else fmnist
            stage(f"generic vs hand-written: {shape.label}")
            out["generic"].append(bench_generic(shape, data, T, K, rounds, repeats or r, dev))
        stage("LeNet-5: fedhmc vs autograd loop and posteriors")
        if smoke:
            out["cnn"] = bench_cnn(
                "digits", 10, 16, 1, 1, 1, repeats or 1, (1,), dev, with_posteriors=False
            )
        else:
            counts = (1, cores) if dev.type == "cpu" and cores > 1 else (torch.get_num_threads(),)
            out["cnn"] = bench_cnn(fmnist, 10, 1000, 1, 1, 1, repeats or 3, counts, dev)
    out["load_after"] = list(os.getloadavg())
    return out


# ---------------------------------------------------------------------------------------
# Targets and report.


def targets(models: dict) -> list[tuple[str, float, str, bool]]:
    """(measure, value, threshold, reached) of every goal the group measures."""
    out = []
    for row in models.get("generic", []):
        compiled = any(label.endswith(", compiled") for label in row["ratios"])
        for label, r in row["ratios"].items():
            if compiled and not label.endswith(", compiled"):
                continue  # a long run on this device compiles: the goal is the compiled path's
            out.append(
                (
                    f"{row['shape']}: generic {label} / hand-written",
                    r,
                    f">= {GENERIC_TARGET:g}",
                    r >= GENERIC_TARGET,
                )
            )
    cnn = models.get("cnn")
    if cnn:
        auto = cnn["auto_batching"]
        for row in cnn["rows"]:
            n = row["threads"]
            r = row["fedhmc/autograd loop"]
            out.append(
                (
                    f"{cnn['shape']}, {n} thread(s): fedhmc ({auto}) / per-client autograd loop",
                    r,
                    f">= {CNN_LOOP_TARGET:g}",
                    r >= CNN_LOOP_TARGET,
                )
            )
            if "fedhmc/posteriors" in row:
                r = row["fedhmc/posteriors"]
                out.append(
                    (
                        f"{cnn['shape']}, {n} thread(s): fedhmc ({auto}) / posteriors SGHMC",
                        r,
                        f">= {CNN_POSTERIORS_TARGET:g}",
                        r >= CNN_POSTERIORS_TARGET,
                    )
                )
    return out


def render(models: dict) -> str:
    """The group's section of the report (markdown)."""
    lines = [
        "## Models: the generic nn.Module path",
        "",
        f"Device: {models['measured_on']}; CUDA: {models['cuda']}. Fashion-MNIST shapes: "
        f"{models['fmnist_data']} data. Load average (1, 5, 15 min) before "
        + ", ".join(f"{v:.1f}" for v in models["load_before"])
        + "; after "
        + ", ".join(f"{v:.1f}" for v in models.get("load_after", ()))
        + ".",
    ]
    for note in models.get("notes", []):
        lines += ["", f"Note: {note}"]
    gen = models.get("generic", [])
    if gen:
        lines += [
            "",
            "Generic path (TorchModel) against the hand-written built-in model: FA-HMC "
            "client-gradient evaluations per second, median of interleaved repeats:",
            "",
            "| shape | T, K, rounds | threads | module | batching | hand-written | generic "
            "| generic / hand-written |",
            "|---|---|---:|---|---|---:|---:|---:|",
        ]
        for row in gen:
            rate = row["evals_per_s"]
            for label, r in row["ratios"].items():
                lines.append(
                    f"| {row['shape']} | {row['T']}, {row['K']}, {row['rounds']} "
                    f"| {row['threads']} | {label} | {row['batching'][label]} "
                    f"| {rate['hand-written']:,.0f} | {rate[label]:,.0f} | {r:.2f} |"
                )
    cnn = models.get("cnn")
    if cnn:
        names = list(cnn["rows"][0]["evals_per_s"])
        lines += [
            "",
            f"{cnn['shape']} (T = {cnn['T']}, K = {cnn['K']}, {cnn['rounds']} round: "
            f"{cnn['evals']} client-gradient evaluations per timing, median of "
            f"{cnn['repeats']} interleaved repeats). `auto` picks `{cnn['auto_batching']}` here"
            + (
                f"; `--threads auto` picks {cnn['auto_threads']} thread(s)."
                if cnn.get("auto_threads")
                else "."
            )
            + " Evaluations per second:",
            "",
            "| threads | " + " | ".join(names) + " | vmap / loop | fedhmc / autograd loop "
            "| fedhmc / posteriors |",
            "|---:|" + "---:|" * (len(names) + 3),
        ]
        for row in cnn["rows"]:
            rate = row["evals_per_s"]
            post = row.get("fedhmc/posteriors")
            lines.append(
                f"| {row['threads']} | "
                + " | ".join(f"{rate[k]:,.2f}" for k in names)
                + f" | {row['vmap/loop']:.2f} | {row['fedhmc/autograd loop']:.2f} | "
                + (f"{post:.2f}" if post is not None else "—")
                + " |"
            )
    return "\n".join(lines) + "\n"
