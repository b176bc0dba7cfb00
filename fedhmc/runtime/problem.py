"""From a resolved [`RunConfig`][fedhmc.runtime.config.RunConfig] to what a run needs.

A `Problem` holds the federated target (the clients' energies), the evaluator of
the global sample (the Bayesian-model-average predictive on the test split, or W₂ to the
exact posterior for Gaussian targets), and the initial position. The engine, the Flower
ServerApp and the Flower ClientApp all build theirs here, so they agree on the data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fedhmc.algorithms import registry
from fedhmc.analysis.metrics import (
    BMAPredictive,
    gaussian_w2_diag,
    mean_of_chains,
    predictive_metrics,
)
from fedhmc.core import rng
from fedhmc.core.determinism import deterministic_cuda
from fedhmc.core.graphs import RoundGraphs
from fedhmc.core.streams import STREAM_INIT
from fedhmc.errors import ConfigError
from fedhmc.models import nets
from fedhmc.models.loading import describe_factory, load_factory, parse_model_args
from fedhmc.models.module import TorchModel
from fedhmc.models.targets import DataTarget, GaussianTarget, hetero_gaussian
from fedhmc.runtime.config import RunConfig
from fedhmc.runtime.presets import GAUSSIAN_TARGETS

PREDICTIVE_COLUMNS = ("accuracy", "brier", "ece", "nll_mean", "nll_sum")
GAUSSIAN_COLUMNS = ("w2", "mean_error")


class PredictiveEvaluator:
    """Per-round Bayesian-model-average predictive on the test split.

    Each call gets the global sample θ̄ of every chain. When ``collect`` is true the
    chains' samples join the running BMA; the metrics are those of the BMA over all samples
    collected so far. Before the first sample (during burn-in) they are those of the
    current θ̄'s predictive, averaged over chains; the ``samples`` column says which.
    """

    columns = ("samples", *PREDICTIVE_COLUMNS, "ece_bins")

    def __init__(
        self, model, X_test: torch.Tensor, y_test: torch.Tensor, num_classes: int,
        ece_bins: int = 15,
    ):  # fmt: skip
        self.model = model
        self.num_classes = int(num_classes)
        self.ece_bins = int(ece_bins)
        self.X = model.prepare(X_test)
        self.y = y_test.to(self.X.device)  # the labels where the predictive is computed
        self.bma = BMAPredictive()

    def __call__(self, theta_bar: torch.Tensor, collect: bool) -> dict[str, float]:
        if not collect and self.bma.log_probs is not None:
            logp = self.bma.log_probs  # the BMA is unchanged: no need to predict
        else:
            with torch.no_grad():
                lp = self.model.log_probs(theta_bar, self.X.to(theta_bar.dtype))
            logp = self.bma.update(lp) if collect else mean_of_chains(lp)
        metrics = predictive_metrics(logp, self.y, ece_bins=self.ece_bins)
        return {"samples": self.bma.count, **metrics, "ece_bins": self.ece_bins}

    def health(self, metrics: dict) -> str | None:
        """Why the chain must be stopped although it is finite, or None.

        A predictive far worse than a uniform guess (mean NLL above 10 log C) means the
        chain has exploded: its samples put near-certain mass on wrong classes.
        """
        num_classes = getattr(self.model, "num_classes", None)
        nll = metrics.get("nll_mean")
        if num_classes is None or nll is None:
            return None
        uniform = math.log(num_classes)
        if nll > 10.0 * uniform:
            return (
                f"the predictive is far worse than a uniform guess (mean NLL {nll:.4g} "
                f"against {uniform:.3g}): the chain has exploded"
            )
        return None

    def state_dict(self) -> dict:
        """The running model average (for checkpoints)."""
        return {"count": self.bma.count, "log_probs": self.bma.log_probs}

    def load_state_dict(self, state: dict) -> None:
        count, lp = state.get("count"), state.get("log_probs")
        points = int(self.X.shape[0])
        fits = isinstance(lp, torch.Tensor) and lp.dim() == 2 and lp.shape[0] == points
        fits = fits and lp.shape[1] == self.num_classes
        if not isinstance(count, int) or count < 0 or not (lp is None or fits):
            shown = tuple(lp.shape) if isinstance(lp, torch.Tensor) else type(lp).__name__
            raise ConfigError(
                f"cannot resume: the checkpoint's model average is {shown} with count "
                f"{count!r}, not one over this run's {points} test points; restore the run's "
                "checkpoint, or start a new run (--overwrite)"
            )
        self.bma.count = count
        # saved on the CPU: back to where the predictive is computed
        self.bma.log_probs = None if lp is None else lp.to(self.X.device)


class GaussianEvaluator:
    """Per-round W₂ and mean error of the chains' current θ̄ against the exact posterior."""

    columns = ("samples", *GAUSSIAN_COLUMNS)

    def __init__(self, target: GaussianTarget, temperature: float):
        self.posterior = target.posterior(temperature)
        self.count = 0

    def __call__(self, theta_bar: torch.Tensor, collect: bool) -> dict[str, float]:
        if collect:
            self.count += theta_bar.shape[0]
        w2, mean_err = gaussian_w2_diag(theta_bar, self.posterior.mean, self.posterior.var)
        return {"samples": self.count, "w2": w2, "mean_error": mean_err}

    def state_dict(self) -> dict:
        return {"count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.count = int(state["count"])


@dataclass
class Problem:
    """The federated target, the evaluator of θ̄, and facts about the data."""

    target: DataTarget | GaussianTarget
    evaluator: PredictiveEvaluator | GaussianEvaluator
    model: object | None
    description: str

    @property
    def dim(self) -> int:
        return self.target.dim


def torch_dtype(cfg: RunConfig) -> torch.dtype:
    return torch.float64 if cfg.dtype == "float64" else torch.float32


def _load(cfg: RunConfig):
    """The run's data: a named data set, the user's ``.npz`` file, or tensors in memory."""
    from fedhmc_datasets.registry import load_dataset

    if cfg.data_in_memory:
        from fedhmc_datasets.user import rescale

        return rescale(cfg.dataset, cfg.scaling)
    if cfg.user_data_file is not None:
        from fedhmc_datasets.user import load_npz

        return load_npz(cfg.user_data_file, scaling=cfg.scaling)  # checked by cfg.resolve()
    kwargs = {}
    if cfg.dim is not None:
        kwargs["dim"] = cfg.dim
    return load_dataset(
        cfg.dataset,
        data_dir=cfg.data_dir,
        download=cfg.download,
        seed=cfg.seed,
        scaling=cfg.scaling,
        **kwargs,
    )


def load_client_data(cfg: RunConfig):
    """Load the dataset and split it: (DatasetSplit, list of index arrays)."""
    from fedhmc_datasets.partition import partition

    data = _load(cfg)
    n = int(data.y_train.shape[0])
    if cfg.num_clients > n:
        raise ConfigError(
            f"--num-clients {cfg.num_clients} exceeds the {n} training examples of "
            f"{cfg.to_dict()['dataset']}; use at most {n}"
        )
    if cfg.partition == "given":
        from fedhmc_datasets.partition import partition_given

        return data, partition_given(data.client_train)
    parts = partition(
        data.y_train,
        cfg.num_clients,
        cfg.partition,
        seed=cfg.seed,
        alpha=cfg.dirichlet_alpha,
        min_size=cfg.min_client_size,
        classes_per_client=cfg.classes_per_client,
        sigma=cfg.quantity_sigma,
    )
    return data, parts


def build_evaluator(cfg: RunConfig, device: torch.device | str = "cpu"):
    """What the server needs: (evaluator, model or None, dim, description).

    For data targets it loads the dataset for its test split and builds the model; it does
    not split the training data, which stays with the clients.
    """
    dtype = torch_dtype(cfg)
    if cfg.dataset in GAUSSIAN_TARGETS:
        target = hetero_gaussian(cfg.num_clients, cfg.dim, dtype=dtype, device=device)
        post = target.posterior(cfg.temperature or 1.0)
        desc = (
            f"heterogeneous Gaussian, d = {cfg.dim}, {cfg.num_clients} clients; "
            f"exact posterior N({post.mean:.4g}·1, {post.var:.4g}·I)"
        )
        return GaussianEvaluator(target, cfg.temperature or 1.0), None, cfg.dim, desc
    data = _load(cfg)
    model = build_model(cfg, data, device, gradients=False)
    evaluator = _predictive(cfg, data, model, dtype, device)
    return evaluator, model, model.dim, data.description


def _predictive(cfg: RunConfig, data, model, dtype, device) -> PredictiveEvaluator:
    """The evaluator of ``model`` on ``data``'s test split, on ``device``."""
    X_test = data.X_test.to(dtype).to(device)
    return PredictiveEvaluator(model, X_test, data.y_test, data.num_classes, cfg.ece_bins or 15)


def build_problem(cfg: RunConfig, device: torch.device | str = "cpu") -> Problem:
    """Build the target of all clients and the evaluator of a resolved config."""
    dtype = torch_dtype(cfg)
    if cfg.dataset in GAUSSIAN_TARGETS:
        evaluator, _, _, desc = build_evaluator(cfg, device)
        target = hetero_gaussian(cfg.num_clients, cfg.dim, dtype=dtype, device=device)
        if not registry.find(cfg.algorithm).federated:  # one sampler on the pooled energy f
            post = target.posterior()
            target = GaussianTarget([post.mean], [post.var], cfg.dim, dtype=dtype, device=device)
        else:
            _replayed(cfg, target)
        check_run_memory(cfg, None, cfg.dim, device)  # before the first round: one line
        return Problem(target, evaluator, None, desc)
    data, parts = load_client_data(cfg)
    target = _clients_data_target(cfg, data, parts, None, device)
    model = target.model
    evaluator = _predictive(cfg, data, model, dtype, device)
    return Problem(target, evaluator, model, data.description)


def _clients_data_target(cfg: RunConfig, data, parts, num_total: int | None, device):
    """The DataTarget of every client's partition (n = ``num_total``, default Σ n_c), its
    memory checked before the first round, its rounds replayed from CUDA graphs when
    ``cfg.cuda_graphs``."""
    model = build_model(cfg, data, device)
    target = DataTarget(
        model,
        [(data.X_train[idx], data.y_train[idx]) for idx in parts],
        cfg.batch_size,
        cfg.prior_std,
        num_total=num_total,
        dtype=torch_dtype(cfg),
        device=device,
        minibatch=cfg.minibatch or "uniform",
    )
    check_run_memory(cfg, data, target.dim, device)  # before the first round: one line
    return _replayed(cfg, target)


def _replayed(cfg: RunConfig, target):
    """``target`` whose clients' rounds replay from CUDA graphs when ``cfg.cuda_graphs``
    and the algorithm has clients' rounds (a federated one)."""
    if cfg.cuda_graphs and registry.find(cfg.algorithm).federated:
        target.graphs = RoundGraphs(device=cfg.device)
    return target


def build_clients_target(cfg: RunConfig, num_total: int | None = None, device="cpu"):
    """Every client's target in one: what the co-located clients of a Flower simulation
    compute with (`fedhmc_clients.task.colocated_update`); their rounds replay from CUDA
    graphs as the engine's do."""
    if cfg.dataset in GAUSSIAN_TARGETS:
        target = hetero_gaussian(cfg.num_clients, cfg.dim, dtype=torch_dtype(cfg), device=device)
        return _replayed(cfg, target)
    data, parts = load_client_data(cfg)
    return _clients_data_target(cfg, data, parts, num_total, device)


def build_client_target(
    cfg: RunConfig, partition_id: int, num_total: int | None = None, device="cpu"
):
    """One client's target (what a Flower client samples): (target, n_c). Its rounds
    replay from CUDA graphs when ``cfg.cuda_graphs``.

    ``num_total`` is the global n that the server sends; by default the client computes it
    from the partition (every client splits the same data with the same seed).
    """
    dtype = torch_dtype(cfg)
    if cfg.dataset in GAUSSIAN_TARGETS:
        target = hetero_gaussian(cfg.num_clients, cfg.dim, dtype=dtype, device=device)
        return _replayed(cfg, target.client(partition_id)), 1
    data, parts = load_client_data(cfg)
    if not 0 <= partition_id < len(parts):
        raise ConfigError(
            f"partition-id {partition_id} is outside [0, {len(parts)}); "
            "check the SuperNode's --node-config and num-clients"
        )
    model = build_model(cfg, data, device)
    idx = parts[partition_id]
    n = num_total if num_total is not None else sum(len(p) for p in parts)
    target = DataTarget(
        model,
        [(data.X_train[idx], data.y_train[idx])],
        cfg.batch_size,
        cfg.prior_std,
        num_total=n,
        dtype=dtype,
        device=device,
        minibatch=cfg.minibatch or "uniform",
    )
    return _replayed(cfg, target), len(idx)


def initial_position(model, dim: int, cfg: RunConfig, device="cpu") -> torch.Tensor:
    """θ̄ at round 0, (S, D), one draw per chain from the run seed's initialisation stream.

    ``--init``: ``zeros``; ``normal``, N(0, I); ``module``, the model's own initialisation
    (a module's factory called again under each chain's seed; PyTorch's ``nn.Linear``
    initialisation for the built-in logistic and MLP); ``torch-linear``, that ``nn.Linear``
    initialisation U(−1/√fan_in, 1/√fan_in) of every weight and bias (built-in models);
    ``auto`` (the default), what the model starts from (``init`` of the model: zeros
    for logistic regression, He-scaled weights for the MLP, whose zero start is a saddle,
    and the module's own initialisation for any other network).
    """
    S = cfg.chains
    dtype = torch_dtype(cfg)
    init = cfg.init or "auto"
    # Drawn on the CPU and then moved: the same start on every device.
    keys = rng.derive(cfg.seed, STREAM_INIT, torch.arange(S, device="cpu"))
    if model is None:  # a synthetic target: no layers
        if init == "normal":
            return rng.normal(keys, 0, dim, dtype).to(device)
        if init in ("torch-linear", "module"):
            raise ConfigError(
                f"--init {init} needs a model with layers; {cfg.dataset} has none: use "
                "--init zeros or normal"
            )
        return torch.zeros(S, dim, dtype=dtype, device=device)
    theta = model.init(init, keys, dtype)
    if not bool(torch.isfinite(theta).all()):  # (once, on the CPU; the chain would blame η)
        raise ConfigError(
            f"--init {init}: the initial position holds non-finite values (the model's "
            f"initial weights, {cfg.model}); give the module finite weights, or start from "
            "--init zeros or normal"
        )
    return theta.to(device)


def build_model(cfg: RunConfig, data, device: torch.device | str = "cpu", gradients: bool = True):
    """The likelihood model of a resolved config on ``data`` (a DatasetSplit).

    ``logistic`` and ``mlp`` are the hand-differentiated fast paths of
    ``fedhmc.models.nets``; ``cnn`` and any ``PACKAGE.MODULE:FACTORY`` (or a callable
    given in Python) go through the generic ``TorchModel``, compiled under ``--compile``
    where it computes ``gradients`` (a server's model only predicts).
    """
    deterministic_cuda(device)
    name = cfg.model
    if name in ("logistic", "mlp"):
        return nets.build_network(name, data.num_features, data.num_classes, cfg.hidden_widths)
    kwargs = parse_model_args(cfg.model_arg)
    if name == "cnn":
        from fedhmc.models.cnn import lenet5

        shape = getattr(data, "image_shape", None) or tuple(data.X_train.shape[1:])
        if len(shape) == 2:
            shape = (1, *shape)
        if len(shape) != 3:
            raise ConfigError(
                f"--model cnn needs images; {cfg.to_dict()['dataset']} has features of shape "
                f"{tuple(data.X_train.shape[1:])}: use --model logistic or mlp"
            )
        factory = lenet5
        kwargs = {"in_shape": shape, "num_classes": data.num_classes, **kwargs}
    elif isinstance(name, str):
        factory = load_factory(name)
    else:
        factory = name
    label = name if isinstance(name, str) else describe_factory(name)
    return TorchModel(
        factory,
        data.num_classes,
        data.X_train[:4],
        kwargs,
        batching=cfg.model_batching,
        dtype=torch_dtype(cfg),
        device=device,
        name=label,
        batch_size=cfg.batch_size or len(data.y_train),
        compile=bool(cfg.compile) and gradients,
    )


def bytes_per_round(
    cfg: RunConfig, dim: int, round_: int = 2, clients: int | None = None
) -> tuple[int, int]:
    """(down, up) bytes of arrays in round ``round_`` of ``clients`` clients (None: every
    client): the arrays the algorithm's ``layout`` names, (S, D) each per client; none for
    a sampler of one process."""
    algo = registry.find(cfg.algorithm)
    if not algo.federated or algo.asynchronous:  # no rounds of messages
        return 0, 0
    itemsize = 8 if cfg.dtype == "float64" else 4
    clients = cfg.num_clients if clients is None else clients  # the round's, if drawn
    layout = algo.module.layout(algo.build_settings(cfg), round_)
    return layout.bytes(clients, cfg.chains, dim, itemsize)


def bits_up_per_round(
    cfg: RunConfig, dim: int, round_: int, clients: int, settings=None
) -> int | None:
    """The bits that the replies of ``clients`` clients really take in round ``round_``
    where the algorithm says its reply arrays are compressed (its module's ``REPLY_BITS``:
    wire name → ``bits(settings, dim, float_bits)`` per chain), else None (the bytes say
    it). ``settings``: the run's sampler settings, where the caller holds them (built from
    ``cfg`` otherwise)."""
    algo = registry.find(cfg.algorithm)
    declared = getattr(algo.module, "REPLY_BITS", None) if algo.federated else None
    if not declared:
        return None
    settings = algo.build_settings(cfg) if settings is None else settings
    float_bits = 64 if cfg.dtype == "float64" else 32
    by_field = {f: k for k, f in algo.module.REPLY.items()}
    per_chain = 0
    for f in algo.module.layout(settings, round_).up:
        bits = declared.get(by_field[f])
        per_chain += bits(settings, dim, float_bits) if bits else dim * float_bits
    return per_chain * cfg.chains * clients


def async_worker_target(cfg, partition_id: int, num_total: int | None = None, device="cpu"):
    """What a worker differentiates: (target, n_c), on ``device``.

    On data, the worker's own partition with the energy of docs/algorithms.md, f^(c) (its data
    scaled up to n, plus the prior): its minibatch gradient ∇f̃^(c) is an unbiased estimate
    of ∇f when the partition is iid (``--partition iid``), and a biased one otherwise. On
    the synthetic Gaussian targets every worker holds the pooled energy f (as ``sghmc``
    does), so the chain targets the exact posterior N(m 1, v I).
    """
    from fedhmc.models.targets import GaussianTarget, hetero_gaussian
    from fedhmc.runtime.presets import GAUSSIAN_TARGETS

    if cfg.dataset in GAUSSIAN_TARGETS:
        dtype = torch_dtype(cfg)
        post = hetero_gaussian(cfg.num_clients, cfg.dim, dtype=dtype).posterior()
        return GaussianTarget([post.mean], [post.var], cfg.dim, dtype=dtype, device=device), 1
    return build_client_target(cfg, partition_id, num_total, device=device)


# ---------------------------------------------------------------- memory, before a run

MEMORY_COPIES = 8
"""Arrays of the clients' (N, S, D) positions that a round holds at its peak: positions,
momenta, gradients, and the parameters and gradients of the batched forward pass. A
module's round holds about 10; 8 keeps the estimate below what a run needs, so that a run
that fits is never refused."""


def estimate_run_bytes(
    *,
    train_values: int,
    test_values: int,
    test_rows: int,
    num_classes: int,
    dim: int,
    chains: int,
    clients: int,
    itemsize: int,
) -> tuple[int, int]:
    """A run's memory from its data and sampler: ``(host, compute)`` bytes, where host is
    what the loaded data holds on the CPU and compute what the run holds where it computes
    (the CPU too for ``--device cpu``). A pure function of the sizes:

    - data: the float32 features (``train_values`` and ``test_values`` numbers) and each
      client's copy of its rows, on the host; the features in the run's dtype
      (``itemsize`` bytes) where it computes;
    - sampler: ``MEMORY_COPIES`` arrays of ``clients`` × ``chains`` × ``dim`` numbers (the
      clients that compute in a round), and four of ``chains`` × ``dim`` (θ̄, the round's
      start, the draws kept for diagnostics, the checkpoint's copy);
    - predictive: the test set's class probabilities per chain and their running average.
    """
    host = 4 * (2 * train_values + test_values)
    data = itemsize * (train_values + test_values)
    sampler = itemsize * dim * chains * (MEMORY_COPIES * clients + 4)
    predictive = itemsize * test_rows * num_classes * (chains + 1)
    return host, data + sampler + predictive


def check_run_memory(cfg: RunConfig, data, dim: int, device) -> None:
    """Refuse in one line a run whose `estimate_run_bytes` exceeds the memory free where
    it computes (the host's and, on a GPU, the GPU's); ``data`` is None for Gaussian
    targets."""
    import math as _math

    from fedhmc_datasets.memory import require

    if not registry.find(cfg.algorithm).federated:  # one sampler on the pooled energy
        clients = 1
    else:
        clients = min(cfg.clients_per_round or cfg.num_clients, cfg.num_clients)
    shape = tuple(data.X_train.shape[1:]) if data is not None else ()
    host, compute = estimate_run_bytes(
        train_values=int(data.X_train.shape[0]) * _math.prod(shape) if data is not None else 0,
        test_values=int(data.X_test.shape[0]) * _math.prod(shape) if data is not None else 0,
        test_rows=int(data.X_test.shape[0]) if data is not None else 0,
        num_classes=int(data.num_classes) if data is not None else 0,
        dim=int(dim),
        chains=int(cfg.chains or 1),
        clients=int(clients),
        itemsize=torch.finfo(torch_dtype(cfg)).bits // 8,
    )
    fix = (
        f"use fewer --chains (now {cfg.chains or 1}) or --num-clients (now {cfg.num_clients}; "
        "or --clients-per-round), a smaller model (D = "
        f"{dim:,} parameters) or less data, or a machine with more memory"
    )
    what = f"the run (D = {dim:,}, {cfg.chains or 1} chains, {clients} clients a round)"
    if torch.device(device).type == "cpu":
        require(host + compute, "cpu", what, fix)
    else:
        require(host, "cpu", what, fix)
        require(compute, device, what, fix)
