"""Client-gradient evaluations per second: the engine against two plain-PyTorch baselines.

Measured in one process, interleaved, with warm-up and repeats, and reported as ratios:

- ``engine``: ``fedhmc.sampler.run_round`` (FA-HMC with T local iterations of K leapfrog
  steps, counter-based minibatches, momentum, averaging), counting T·(K+1)·N evaluations
  per round;
- ``floor``: a bare batched-gradient loop of the same shapes: a random minibatch gather,
  the closed-form logistic-regression gradient by two ``bmm`` over all clients, and one
  axpy. No momentum, no RNG streams, no averaging: the least work a batched sampler does;
- ``per-client``: a Python loop over clients, each with ``nn.Linear`` + autograd.

Usage::

    python -m benchmarks.engine_throughput            # digits, N = 10 and N = 100
    python -m benchmarks.engine_throughput --smoke    # seconds; what CI runs
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from fedhmc.config import RunConfig
from fedhmc.problem import build_problem
from fedhmc.sampler import SamplerSettings, run_round


def _time(fn, repeats: int) -> float:
    """Median seconds of ``fn()`` over repeats, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_shape(
    num_clients: int, batch: int, T: int, K: int, rounds: int, repeats: int, dataset="digits"
):
    cfg = RunConfig(
        dataset=dataset, num_clients=num_clients, batch_size=batch, partition="iid", chains=1
    ).resolve()
    target = build_problem(cfg).target
    N, D = target.num_clients, target.dim
    settings = SamplerSettings(cfg.step_size, K, T, rho=1.0)
    evals = rounds * T * (K + 1) * N

    def engine():
        theta = torch.zeros(1, D)
        for r in range(1, rounds + 1):
            theta, _ = run_round(target, theta, 0, r, settings)

    X, y = target.X, target.y  # (N, n_max, F+1), (N, n_max)
    n_max, F1 = X.shape[1], X.shape[2]
    C = D // F1
    b = min(batch, int(target.counts.min())) if batch > 0 else int(target.counts.min())
    cid = torch.arange(N).view(N, 1)
    gen = torch.Generator().manual_seed(0)
    steps = rounds * T * (K + 1)

    def floor():
        W = torch.zeros(N, F1, C)
        for _ in range(steps):
            idx = torch.randint(0, n_max, (N, b), generator=gen) % target.counts.view(N, 1)
            Xb, yb = X[cid, idx], y[cid, idx]
            P = torch.softmax(torch.bmm(Xb, W), -1)
            P.scatter_add_(-1, yb.unsqueeze(-1), torch.full((N, b, 1), -1.0))
            W.add_(torch.bmm(Xb.transpose(1, 2), P), alpha=-1e-4)

    models = [torch.nn.Linear(F1 - 1, C) for _ in range(N)]
    Xc = [X[c, : int(target.counts[c]), :-1] for c in range(N)]
    yc = [y[c, : int(target.counts[c])] for c in range(N)]

    def per_client():
        for _ in range(steps):
            for c in range(N):
                idx = torch.randint(0, Xc[c].shape[0], (b,), generator=gen)
                m = models[c]
                m.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(
                    m(Xc[c][idx]), yc[c][idx], reduction="sum"
                ).backward()
                with torch.no_grad():
                    for p in m.parameters():
                        p.add_(p.grad, alpha=-1e-4)

    res = {}
    for name, fn in (("engine", engine), ("floor", floor), ("per-client", per_client)):
        res[name] = evals / _time(fn, repeats)
    return {
        "shape": f"{dataset} N={N} B={batch or 'full'} D={D}",
        **{f"{k}_evals_per_s": v for k, v in res.items()},
        "engine/floor": res["engine"] / res["floor"],
        "engine/per-client": res["engine"] / res["per-client"],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, seconds (for CI)")
    ap.add_argument("--out", default=None, help="write the table as JSON here")
    ap.add_argument(
        "--fashion-mnist",
        action="store_true",
        help="also the Fashion-MNIST shape (N=10, B=1000; needs the data; minutes)",
    )
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    plan = [(10, 32, "digits"), (100, 32, "digits")]
    if args.smoke:
        rounds, repeats, T, K = 1, 1, 2, 2
    else:
        rounds, repeats, T, K = 4, 5, 10, 10
        # The paper's simulated BLR: 20 clients × 50 points, d = 1000, full batch.
        plan.append((20, 0, "blr-synthetic"))
        if args.fashion_mnist:
            plan.append((10, 1000, "fashion-mnist"))
    rows = []
    for n, b, ds in plan:
        big = ds == "fashion-mnist"
        rows.append(
            bench_shape(
                n, b, T if not big else 2, K, 1 if big else rounds, 2 if big else repeats, ds
            )
        )
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; "
        f"T={T} K={K}; client-gradient evaluations per second (median of {repeats})"
    )
    head = (
        f"{'shape':<32}{'engine':>11}{'floor':>11}{'per-client':>12}{'eng/floor':>11}"
        f"{'eng/loop':>10}"
    )
    print(head)
    for r in rows:
        print(
            f"{r['shape']:<32}{r['engine_evals_per_s']:>11,.0f}{r['floor_evals_per_s']:>11,.0f}"
            f"{r['per-client_evals_per_s']:>12,.0f}{r['engine/floor']:>11.2f}"
            f"{r['engine/per-client']:>10.1f}"
        )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
