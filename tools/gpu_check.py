"""The steps of ``tools/gpu_check.sh``, one per call, each writing ``OUT/STEP.json``.

    python3 tools/gpu_check.py probe|matrix|speed|authors --device cuda --out OUT [--smoke]
    python3 tools/gpu_check.py summary --out OUT     # OUT/gpu-check.md from the steps

Runs from source with torch alone besides fedhmc's own small dependencies (NumPy,
scikit-learn; pytest for the matrix): no Flower, no Ray, no fedhmc install. Each step is
its own process, so that the shell can stop one at its time limit and go on.

- ``probe``: versions, the GPU, torch's TF32 and cuDNN switches (as a CUDA run sets them),
  and whether ECE and a CNN's client gradients give the same bits every time;
- ``matrix``: ``pytest -m gpu`` on the device (``benchmarks.gpu.run_matrix``), with torch's
  "CUDA Graph is empty" warning as an error;
- ``speed``: fedhmc's leapfrog step against a plain captured step (``benchmarks.gpu``);
- ``authors``: the paper's 200 Fashion-MNIST rounds under the authors' protocol.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STEPS = ("probe", "matrix", "speed", "authors")


def _device(name: str):
    import torch

    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"gpu_check: --device {name}: torch sees no CUDA GPU here")
    return dev


def _same_every_time(fn, times: int = 5) -> bool:
    import torch

    first = fn()
    return all(
        all(torch.equal(a, b) for a, b in zip(first, fn(), strict=True)) for _ in range(times - 1)
    )


def probe(dev, smoke: bool) -> dict:
    """What the machine is, and whether the metrics and a CNN's gradients are deterministic."""
    import torch

    from fedhmc.core.determinism import deterministic_cuda, switches

    out: dict = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "modules": {
            m: importlib.util.find_spec(m) is not None
            for m in ("numpy", "sklearn", "pytest", "flwr", "ray")
        },
        "switches_default": switches(),
    }
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        out["gpu"] = f"{p.name}, {p.total_memory / 2**30:.0f} GiB, sm_{p.major}{p.minor}"
        out["gpus"] = torch.cuda.device_count()
    deterministic_cuda(dev)
    out["switches_run"] = switches()
    out["ece_deterministic"], out["ece_equals_cpu"] = _ece_check(dev)
    out["cnn_gradient_deterministic"] = _cnn_check(dev, smoke)
    return out


def _ece_check(dev) -> tuple[bool, bool]:
    import torch

    from fedhmc.analysis.metrics import ece

    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(2 * torch.randn(50_000, 10, generator=gen, dtype=torch.float64), -1)
    labels = torch.randint(0, 10, (50_000,), generator=gen)
    got = {ece(probs.to(dev), labels.to(dev)) for _ in range(5)}
    return len(got) == 1, got == {ece(probs, labels)}


def _cnn_check(dev, smoke: bool) -> bool:
    """LeNet-5's client gradients (grouped convolutions under vmap), five times."""
    import torch

    from fedhmc.algorithms import fahmc
    from fedhmc.runtime.config import RunConfig
    from fedhmc.runtime.problem import build_problem

    clients = 2 if smoke else 10
    cfg = RunConfig(
        dataset="digits",
        model="cnn",
        num_clients=clients,
        batch_size=32,
        chains=2,
        device=str(dev),
        dtype="float32",
    ).resolve()
    target = build_problem(cfg, dev).target
    theta = 0.1 * torch.randn(
        2, clients, target.dim, generator=torch.Generator().manual_seed(0)
    ).to(dev)
    keys = fahmc.data_keys(torch.arange(clients, device=dev), torch.arange(2, device=dev))
    return _same_every_time(lambda: target.grad(theta.clone(), keys, 0), 3 if smoke else 5)


def matrix(dev, smoke: bool) -> dict:
    from benchmarks.gpu import run_matrix

    return run_matrix(dev, smoke, timeout_s=60 if smoke else 225)


def speed(dev, smoke: bool) -> dict:
    import torch

    from benchmarks.gpu import bench_speed

    with torch.cuda.device(dev) if dev.type == "cuda" else _null():
        return bench_speed(dev, smoke, None, lambda label: print(label, flush=True))


def authors(dev, smoke: bool) -> dict:
    import torch

    from benchmarks.gpu import bench_authors

    with torch.cuda.device(dev) if dev.type == "cuda" else _null():
        return bench_authors(dev, smoke)


def _null():
    import contextlib

    return contextlib.nullcontext()


# --------------------------------------------------------------------------- the summary


def _read(out: Path, step: str) -> dict | None:
    path = out / f"{step}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _steps_table(out: Path) -> list[str]:
    lines = ["| step | exit status | seconds | time limit |", "|---|---:|---:|---:|"]
    path = out / "steps.tsv"
    for row in path.read_text().splitlines() if path.exists() else []:
        name, rc, secs, limit = row.split("\t")
        status = {"0": "0", "124": "124 (stopped at its limit)"}.get(rc, rc)
        lines.append(f"| {name} | {status} | {secs} | {limit} |")
    return lines


def _probe_lines(p: dict | None) -> list[str]:
    if p is None:
        return ["The probe did not finish.", ""]

    def yes(b):
        return "yes" if b else "**no**"

    return [
        f"- Python {p['python']}, torch {p['torch']}, CUDA {p['cuda']}, cuDNN {p['cudnn']}"
        + (
            f"; {p['gpu']} ({p['gpus']} GPU(s))"
            if "gpu" in p
            else "; no GPU (a check of the script)"
        ),
        "- installed: " + ", ".join(f"{m} {yes(v)}" for m, v in p["modules"].items()),
        "- torch's switches by default: "
        + ", ".join(f"{k}={v}" for k, v in p["switches_default"].items()),
        "- as a CUDA run sets them: " + ", ".join(f"{k}={v}" for k, v in p["switches_run"].items()),
        f"- ECE the same bits in 5 evaluations: {yes(p['ece_deterministic'])}; "
        f"equal to the CPU's: {yes(p['ece_equals_cpu'])}",
        "- LeNet-5's client gradients the same bits every time: "
        + yes(p["cnn_gradient_deterministic"]),
        "",
    ]


def summary(out: Path, device: str, smoke: bool) -> str:
    """``OUT/gpu-check.md``: the steps' status, the probe, and the benchmark's report of
    the matrix, the speed and the authors' rounds."""
    import torch

    from benchmarks.gpu import device_name, render, targets

    dev = torch.device(device)
    gpu = {"device": str(dev), "smoke": smoke, "notes": []}
    gpu["device_name"] = (
        device_name(dev) if dev.type != "cuda" or torch.cuda.is_available() else device
    )
    missing = "the step did not finish (see Steps)"
    gpu["matrix"] = _read(out, "matrix") or {"skipped": missing}
    gpu["speed"] = _read(out, "speed") or {"rows": [], "notes": [missing]}
    gpu["authors"] = _read(out, "authors") or {"skipped": missing}
    lines = [f"# fedhmc GPU check ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", ""]
    lines += [
        "## Steps",
        "",
        *_steps_table(out),
        "",
        "## Probe",
        "",
        *_probe_lines(_read(out, "probe")),
    ]
    lines += ["## Targets", "", "| measure | value | target | reached |", "|---|---:|---|---|"]
    lines += [
        f"| {m} | {v:.4g} | {t} | {'yes' if ok else '**no**'} |" for m, v, t, ok in targets(gpu)
    ]
    lines += ["", render(gpu).replace("## GPU check", "## Report:", 1)]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="tools/gpu_check.py", description=__doc__.splitlines()[0])
    ap.add_argument("step", choices=(*STEPS, "summary"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: a check of the script")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.step == "summary":
        (args.out / "gpu-check.md").write_text(summary(args.out, args.device, args.smoke))
        print(f"wrote {args.out / 'gpu-check.md'}")
        return 0
    dev = _device(args.device)
    t0 = time.perf_counter()
    result = globals()[args.step](dev, args.smoke)
    result["step_s"] = time.perf_counter() - t0
    (args.out / f"{args.step}.json").write_text(json.dumps(result, indent=1, default=str))
    print(f"{args.step}: done in {result['step_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
