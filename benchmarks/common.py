"""What the benchmark's groups share: the problem shapes, the interleaved timer, the
engine's timed rounds and posteriors' SGHMC.

The suite (``benchmarks.suite``) and its groups (``benchmarks.threads``,
``benchmarks.models``) import these from here, so that no group imports the suite that
runs it.
"""

from __future__ import annotations

import statistics
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from fedhmc.algorithms import fahmc
from fedhmc.runtime.config import RunConfig

FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
"""Where the Debian package ``dataset-fashion-mnist`` puts Fashion-MNIST: one of the places
`fmnist_dir` looks in, after ``--data-dir`` and ``$FEDHMC_DATA``."""

DATA_ENV = "FEDHMC_DATA"


@dataclass
class Shape:
    key: str
    label: str
    dataset: str
    num_clients: int
    batch: int  # 0: full batch
    model: str = "logistic"
    loop_target: float | None = None  # the "engine ≥ x × loop" target, if any
    posteriors_target: float | None = None


def quiet_env() -> None:
    """Flower and Ray without telemetry, update checks or dependency installs."""
    import os

    for k, v in (
        ("FLWR_TELEMETRY_ENABLED", "0"),
        ("FLWR_DISABLE_UPDATE_CHECK", "1"),
        ("RAY_USAGE_STATS_ENABLED", "0"),
        ("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1"),
    ):
        os.environ.setdefault(k, v)


def child_env() -> dict:
    """The environment of a benchmark's child process: this one's, with the repository
    root on PYTHONPATH so that the child imports ``benchmarks`` from wherever it starts."""
    import os

    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


def peak_rss_mb() -> float:
    """This process's peak resident memory in MB: ``VmHWM``, the high-water mark of its
    own address space. (``ru_maxrss`` is no use in a child process: Linux carries it over
    from the parent across ``fork`` and ``exec``, so a child started by a large parent
    reports the parent's size.)"""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def fmnist_places() -> list[Path]:
    """Where Fashion-MNIST is looked for, in order, as ``fedhmc run`` looks: ``--data-dir``
    (``python -m benchmarks --data-dir`` sets ``$FEDHMC_DATA``), ``$FEDHMC_DATA``, the
    Debian folder, the cache (``fedhmc_datasets.locate.search_dirs``)."""
    from fedhmc_datasets import locate

    return locate.search_dirs(None, [locate.DEBIAN_FASHION_MNIST_DIR])


def fmnist_dir() -> Path | None:
    """The first folder of `fmnist_places` that holds the four IDX files (directly, in
    ``fashion-mnist/`` or in ``FashionMNIST/raw/``; each file as it is or ``.gz``), or None."""
    from fedhmc_datasets.mnist import IDX_FILES

    for base in fmnist_places():
        for folder in (base / "FashionMNIST" / "raw", base / "fashion-mnist", base):
            if all(
                (folder / name).is_file() or (folder / f"{name}.gz").is_file() for name in IDX_FILES
            ):
                return folder
    return None


def fmnist_available() -> bool:
    """Whether Fashion-MNIST is where ``fedhmc run`` would find it (`fmnist_dir`)."""
    return fmnist_dir() is not None


def fmnist_missing() -> str:
    """Where Fashion-MNIST was looked for, for a note that skips what needs it."""
    looked = ", ".join(str(d) for d in fmnist_places())
    return f"no Fashion-MNIST in {looked} (give --data-dir DIR or set {DATA_ENV})"


def use_data_dir(data_dir: str | None) -> None:
    """``--data-dir DIR``: where the benchmark's data sets are looked for first, in this
    process and the ones it starts (through ``$FEDHMC_DATA``, as ``fedhmc experiment
    --data-dir`` does); a folder that does not exist is a one-line error."""
    import os

    from fedhmc.errors import ConfigError

    if data_dir is None:
        return
    folder = Path(data_dir).expanduser()
    if not folder.is_dir():
        raise ConfigError(
            f"--data-dir {data_dir}: no such folder; give the folder that holds the data "
            f"sets' files (or drop --data-dir to use ${DATA_ENV} and the usual places)"
        )
    os.environ[DATA_ENV] = str(folder.resolve())


def interleaved(fns: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each function, warmed up, the repeats interleaved (fair under load)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def shape_config(shape: Shape, **kw) -> RunConfig:
    """The resolved run configuration of one shape (iid, one chain)."""
    return RunConfig(
        dataset=shape.dataset,
        model=shape.model,
        num_clients=shape.num_clients,
        batch_size=shape.batch,
        partition="iid",
        chains=1,
        **kw,
    ).resolve()


def engine_fn(target, settings: fahmc.Settings, rounds: int):
    """The engine's ``rounds`` rounds from θ̄ = 0 on ``target``: what every engine timing runs."""

    def engine():
        state = fahmc.init(torch.zeros(1, target.dim), settings)
        for _ in range(rounds):
            state, _ = fahmc.step(0, state, target, settings)

    return engine


def posteriors_fn(modules, Xc, yc, b, full, steps, gen):
    """posteriors' SGHMC, one chain per client, minibatches as the loop draws them."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import posteriors  # noqa: F401
            from posteriors.sgmcmc import sghmc
    except ImportError:
        return None
    from torch.func import functional_call

    def make(m, n):
        def log_posterior(params, batch):
            xb, yb = batch
            logits = functional_call(m, params, (xb,))
            ll = -torch.nn.functional.cross_entropy(logits, yb, reduction="sum")
            return ll, logits

        params = {k: v.detach().clone() for k, v in m.named_parameters()}
        transform = sghmc.build(log_posterior, lr=1e-6, alpha=0.01)
        return transform, transform.init(params)

    chains = [make(m, x.shape[0]) for m, x in zip(modules, Xc, strict=True)]

    def run():
        for _ in range(steps):
            for c, (transform, state) in enumerate(chains):
                if full:
                    batch = (Xc[c], yc[c])
                else:
                    idx = torch.randint(0, Xc[c].shape[0], (b,), generator=gen)
                    batch = (Xc[c][idx], yc[c][idx])
                state, _ = transform.update(state, batch, inplace=True)
                chains[c] = (transform, state)

    return run
