"""The one definition of every run setting.

``RunConfig`` is a frozen dataclass of what belongs to the run: the data, the model, the
split, the rounds, the seed, the chains, the device, the output, the backend and who takes
part in a round. Each field's metadata carries its help text. The sampler's options are
declared by the sampler, in its module's ``Settings`` (`fedhmc.algorithms.api`), and held
in the field ``options``; ``cfg.leapfrog_steps`` reads one. The command line
(``fedhmc run --local-steps 50``) and Flower's run config
(``flwr run . --run-config "local-steps=50"``) both use the name in kebab-case, and both are
parsed by ``RunConfig.from_mapping``, so a setting is defined once.

Fields left at ``None`` take the dataset's default in ``RunConfig.resolve`` (see
``fedhmc.runtime.presets``), which returns a ``ResolvedConfig``: what a run is carried out
with, never resolved again. ``config.json`` holds the resolved values, with ``null`` for
the settings that played no part in the run (``RunConfig.recorded``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import sys
import typing
from collections.abc import Collection
from dataclasses import dataclass, field, fields

from fedhmc.algorithms import api, registry
from fedhmc.core import MINIBATCH_LAWS, PARTICIPATION_SCHEMES
from fedhmc.errors import ConfigError
from fedhmc.models import BATCHINGS

COMPILE_MIN_EVALS = 200_000
"""``--compile``'s default: on for a network module on the CPU from this many client-gradient
evaluations in the run (rounds × chains × clients × T × (K + 1)). Compiling a network the
first time takes 5–20 s (LeNet-5 on digits: about 18 s for its two shapes; inductor's disk
cache brings a later process down to about 2 s) and saves about 0.03 ms per evaluation of a
small network (measured on 2 CPU cores), so a smaller run would spend longer compiling than
it saves. Like ``--device``, ``--compile`` changes only the float rounding, so it is a
setting of how a run is carried out: a resume may change it, and a sweep does not tell its
cells apart by it (``fedhmc.runtime.checkpoint.RESUMABLE_CHANGES``,
``fedhmc.sweep.grid.RUN_ONLY_KEYS``)."""

BACKENDS = ("engine", "flower")
"""``--backend``'s choices (`fedhmc.runner.run_config` sends a run to its backend)."""

ALGORITHMS = registry.NAMES
MODELS = ("logistic", "mlp", "cnn")
"""The built-in models; ``--model`` also takes PACKAGE.MODULE:FACTORY (any nn.Module)."""
ON_FAILURE = ("renormalize", "stop")
DTYPES = ("float32", "float64")
SCALINGS = ("standardize", "unit", "symmetric", "none")
PROTOCOL_NAMES = ("algorithm3", "authors")
PARTITIONS = ("iid", "dirichlet", "shards", "quantity", "given")
INITS = ("auto", "zeros", "normal", "module", "torch-linear")
MAX_SEED = 2**32 - 1
"""The largest ``--seed``: the data split's random state (scikit-learn's) takes 32 bits."""
IN_MEMORY = "<in-memory tensors>"
"""What ``config.json`` records as the dataset of data given to Python as tensors."""

# What `--protocol` sets for the options left unset (explicit options win). "algorithm3" is
# the paper's Algorithm 3 as printed; "authors" is what the authors' experiment code runs
# (docs/algorithms.md, "The authors' protocol"). Keys are field names.
_PROTOCOL_COMMON = {"sync_unit": "leapfrog", "fresh_gradients": True, "burn_in": 0}
_AUTHORS_IMAGES = {
    **_PROTOCOL_COMMON,
    "minibatch": "reshuffle",
    "prior_std": math.inf,
    "temperature": 0.005,
    "scaling": "symmetric",
    "init": "torch-linear",
    "ece_bins": 20,
}
_AUTHORS_BLR = {**_PROTOCOL_COMMON, "restart_trajectories": True}
_GENERIC_DEFAULTS = {
    "sync_unit": "iteration",
    "fresh_gradients": False,
    "restart_trajectories": False,
    "minibatch": "uniform",
    "init": "auto",
    "ece_bins": 15,
    "temperature": 1.0,
}


RECORDED_ONLY = ("step_size_means", "model_frozen", "model_frozen_sha256")
"""What ``config.json`` records beside the settings (not settings: dropped on reading): what
``--step-size`` means, and a module's frozen parameters (name, shape, dtype) and the
SHA-256 of their values."""

_MODEL_SETTINGS = ("model", "model_arg", "model_batching", "compile", "hidden")
_SPLIT_SETTINGS = ("dirichlet_alpha", "min_client_size", "classes_per_client", "quantity_sigma")
_SPLIT_USES = {
    "dirichlet_alpha": "dirichlet",
    "min_client_size": "dirichlet",
    "classes_per_client": "shards",
    "quantity_sigma": "quantity",
}
_FLOWER_SETTINGS = (
    "client_gpus",
    "round_timeout",
    "straggler_factor",
    "straggler_floor",
    "min_clients",
    "node_wait_timeout",
    "on_failure",
    "max_failed_rounds",
)
NULLABLE = (
    *_MODEL_SETTINGS,
    "partition",
    *_SPLIT_SETTINGS,
    "scaling",
    "ece_bins",
    "max_worker_failures",
    *_FLOWER_SETTINGS,
    *api.SHARED,
)
"""The settings that ``config.json`` records as ``null`` where they played no part in the
run (`recorded_settings`); a ``null`` one reads back as its default."""


SAMPLER_OPTIONS = "sampler-options"
"""The Flower run-config key of the options of samplers from other packages, as
``"drift-correction=0.5;friction=2"`` (Flower's run config holds the keys its app lists:
fedhmc's own samplers' options are keys of their own, a plugin's are not)."""


def _parse_sampler_options(text, declared: dict) -> dict:
    """``"key=value;key=value"`` (``SAMPLER_OPTIONS``) as declared options by field name."""
    out = {}
    for part in str(text or "").split(";"):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        name = key.strip().replace("-", "_")
        if not sep or name not in declared:
            known = ", ".join(o.key for o in declared.values()) or "none"
            raise ConfigError(
                f"{SAMPLER_OPTIONS}: {part.strip()!r} is not KEY=VALUE of a sampler's own "
                f"option (they are: {known})"
            )
        out[name] = declared[name].parse(value.strip())
    return out


def _sampler_help(e: registry.Entry, o: api.Option) -> str:
    """Option ``o``'s help under sampler ``e``, with its default where the help gives
    none."""
    if o.default is None or "default" in o.help or o.type is bool:
        return o.help
    return f"{o.help} (default {_shown(o.default)})"


@functools.cache
def sampler_options() -> dict[str, api.Option]:
    """The options that samplers declare in their own Settings (``--leapfrog-steps``,
    ``--quantization-levels``, a plugin's own), by field name. An option that several
    samplers declare is one option; its help names each sampler's meaning. One whose name
    or type clashes with what is listed already is left out with a line on stderr."""
    own = {f.name for f in fields(RunConfig)}
    found: dict[str, api.Option] = {}
    for e in registry.ENTRIES:
        for o in e.options:
            if o.name in own:
                continue  # the run's own setting (who takes part in a round)
            if o.name in found and found[o.name].type is not o.type:
                print(
                    f"fedhmc: option {o.flag} of --algorithm {e.name} left out: another "
                    f"sampler declares it as {found[o.name].type.__name__}",
                    file=sys.stderr,
                )
                continue
            found.setdefault(o.name, o)
    for name, first in found.items():
        meanings = option_meanings(name).items()
        text = "; ".join(
            f"{', '.join(who)}: {h}" for h, (o, who) in meanings if o.type is first.type
        )
        found[name] = dataclasses.replace(first, help=text, default=None)
    return found


def option_meanings(name: str) -> dict[str, tuple[api.Option, list[str]]]:
    """What the samplers' option ``name`` means for each: its help line (with its default)
    → (the option as the first sampler of that meaning declares it, the samplers that give
    it that meaning), in the registry's order."""
    out: dict[str, tuple[api.Option, list[str]]] = {}
    for e in registry.ENTRIES:
        for o in e.options:
            if o.name == name:
                out.setdefault(_sampler_help(e, o), (o, []))[1].append(e.name)
    return out


@functools.cache
def builtin_option_keys() -> tuple[str, ...]:
    """The run-config keys of fedhmc's own samplers' options: keys of their own in
    Flower's run config (``pyproject.toml``), where a plugin's travel in
    ``SAMPLER_OPTIONS``."""
    names = {o.name for e in registry.BUILTIN for o in e.options}
    return tuple(o.key for n, o in sampler_options().items() if n in names)


def own_options_clause(algo: registry.Entry) -> str:
    """The clause " (its options: --step-size, --quantization-levels)": the options a run
    may give for sampler ``algo``."""
    flags = ["--" + n.replace("_", "-") for n in algo.own]
    return f" (its options: {', '.join(flags)})" if flags else " (it has no options)"


def applies_to(key: str) -> str:
    """What the setting ``key`` applies to, for the refusal of one that a run would not use
    (`refuse_unused`)."""
    network = "a network given as an nn.Module (--model cnn or PACKAGE.MODULE:FACTORY)"
    if key in _SPLIT_USES:
        return f"--partition {_SPLIT_USES[key]}"
    asynchronous = [e.name for e in registry.ENTRIES if e.asynchronous]
    table = {
        "hidden": "--model mlp",
        "model_batching": network,
        "compile": network,
        "participation": "--clients-per-round",
        "max_worker_failures": "--algorithm " + " or ".join(asynchronous),
    }
    if key in _FLOWER_SETTINGS:
        return "--backend flower"
    return table.get(key, "a dataset of examples (not a Gaussian target, which has no data)")


def refuse_unused(cfg: RunConfig, given: Collection[str]) -> None:
    """Refuse, in one line, an option given for a run (``given``: RunConfig field names)
    that the resolved run ``cfg`` would make no use of: the MLP's ``--hidden`` with
    ``--model cnn``, ``--round-timeout`` on the engine. (A sampler's option that the run's
    sampler lacks is refused when the config is checked.)"""
    for key in unused_settings(cfg.to_dict()):
        if key in given:
            flag = "--" + key.replace("_", "-")
            value = getattr(cfg, key, None)
            shown = flag if isinstance(value, bool) or value is None else f"{flag} {value}"
            raise ConfigError(
                f"{shown} applies to {applies_to(key)}; this run would make no use of it: "
                f"drop {flag}"
            )


def unused_settings(config: dict) -> list[str]:
    """The run settings of a resolved run's settings dict (``RunConfig.to_dict``, or a
    ``config.json``) that played no part in the run: the MLP's ``hidden`` for any other
    model, ``dirichlet_alpha`` for a split that is not Dirichlet, the Flower options on the
    engine, and so on. (A sampler's options are its own: none is unused.)"""
    from fedhmc.runtime.presets import GAUSSIAN_TARGETS

    c = config
    algo = registry.find(c.get("algorithm"))
    unused: list[str] = []
    if c.get("dataset") in GAUSSIAN_TARGETS:  # an energy in closed form: no data, no model
        unused += [*_MODEL_SETTINGS, "partition", *_SPLIT_SETTINGS, "scaling", "ece_bins"]
    else:
        if c.get("model") != "mlp":
            unused.append("hidden")
        if c.get("model") in ("logistic", "mlp"):
            unused += ["model_batching", "compile"]
        unused += [k for k in _SPLIT_SETTINGS if c.get("partition") != _SPLIT_USES[k]]
    unused += [k for k in api.SHARED if k not in algo.own]
    if not algo.asynchronous:
        unused.append("max_worker_failures")
    if c.get("backend") == "engine":
        unused += list(_FLOWER_SETTINGS)
    if c.get("clients_per_round") is None:
        unused.append("participation")
    return list(dict.fromkeys(unused))


def without_other_options(config: dict) -> dict:
    """A saved run's settings (a ``config.json`` or a checkpoint's) as this fedhmc reads
    them: without the options of other samplers than its own (a run recorded while every
    sampler's options were settings of every run holds them, unused)."""
    out = dict(config)
    algo = registry.find(out.get("algorithm"))
    if algo.module_path is not None:
        mine = {o.name for o in api.options(algo.settings_class)}
        for name in sampler_options():
            if name not in mine:
                out.pop(name, None)
    return out


def recorded_settings(config: dict) -> dict:
    """``config`` (a resolved run's settings dict, or a ``config.json``) as it is compared:
    the run settings that played no part in the run set to ``None``, and of the samplers'
    options only the run's sampler's own, each with its value (its default, or the value
    its name fixes, where none was recorded).

    Applying it to both sides of a comparison (a resume's checkpoint and the new run, a
    sweep cell's ``config.json`` and its settings) compares what the runs computed with;
    it is idempotent, so a ``config.json`` written before it existed compares the same
    (``without_other_options``).
    """
    saved = without_other_options(config)
    out = {k: v for k, v in saved.items() if k not in sampler_options()}
    for key in unused_settings(config):
        if key in out:
            out[key] = None
    algo = registry.find(out.get("algorithm"))
    for o in api.options(algo.settings_class) if algo.module_path else ():
        # (a run recorded before its sampler's defaults were recorded: those)
        value = saved.get(o.name)
        value = algo.fixed_value(o.name, o.default) if value is None else value
        if value is not None and o.name not in RunConfig.__dataclass_fields__:
            out[o.name] = value
    return out


STEP_SIZE_MEANINGS = {
    "eta": "η, the leapfrog step (FA-LD's Langevin learning rate is η²/2)",
    "h": "h, the Euler step of SGHMC / SGLD",
}
"""What ``--step-size`` is, by its symbol in sweep cell ids (fedhmc's FA-HMC family and its
Euler samplers; another sampler's is its option's help)."""


def step_size_symbol(algorithm: str) -> str:
    """The symbol of ``--step-size`` under ``algorithm`` (sweep cell ids): ``eta`` for the
    leapfrog samplers, ``h`` for the Euler ones, ``step`` for the others (their Settings'
    ``STEP_SYMBOL``)."""
    return registry.find(algorithm).step_symbol


def step_size_meaning(algorithm: str) -> str:
    """What ``--step-size`` means under ``algorithm``, in words (``config.json`` records it)."""
    e = registry.find(algorithm)
    symbol = e.step_symbol
    if symbol in STEP_SIZE_MEANINGS:
        return STEP_SIZE_MEANINGS[symbol]
    return next((o.help for o in e.options if o.name == "step_size"), "its step size")


def protocol_settings(protocol: str, dataset: str) -> dict:
    """The options ``--protocol`` sets on ``dataset`` (field names → values).

    The authors' code runs the heterogeneous-Gaussian study as Algorithm 3, so there
    ``authors`` sets nothing.
    """
    if protocol == "algorithm3" or dataset == "gaussian-hetero":
        return {}
    if dataset == "blr-synthetic":
        return dict(_AUTHORS_BLR)
    return dict(_AUTHORS_IMAGES)


def _f(default, help: str, **meta):
    return field(default=default, metadata={"help": help, **meta})


@dataclass(frozen=True)
class RunConfig:
    """Every setting of a run. Field ``local_steps`` is option ``--local-steps``."""

    # Data and model
    dataset: str = _f(
        "digits",
        "dataset or synthetic target (see `fedhmc data --list`), or PATH.npz: your own data "
        "(x_train, y_train, x_test, y_test, optionally client_train)",
    )
    model: str = _f(
        "logistic",
        "logistic, mlp, cnn (LeNet-5, for images), or PACKAGE.MODULE:FACTORY: a callable "
        "returning any torch.nn.Module that maps inputs to class logits",
    )
    model_arg: str | None = _f(
        None,
        "KEY=VALUE keyword argument of the `--model` factory (repeat the option for more; "
        "Flower's run config joins them with ';')",
    )
    model_batching: str = _f(
        "auto",
        "how a network given as an nn.Module (cnn, PACKAGE.MODULE:FACTORY) evaluates every "
        "chain and client: vmap (one batched computation), loop (one at a time, for modules "
        "vmap cannot batch), or auto (loop for convolutions on a CPU with 100,000 input "
        "values or more per client minibatch, else vmap)",
        choices=BATCHINGS,
    )
    compile: bool | None = _f(
        None,
        "compile a network given as an nn.Module (cnn, PACKAGE.MODULE:FACTORY) with torch's "
        "compiler (inductor) when it is batched with vmap (default: on for a run on the CPU with "
        f"{COMPILE_MIN_EVALS:,} or more client-gradient evaluations, else off); like --device, "
        "it changes only the float rounding, so a resume may change it and a sweep does not "
        "tell its cells apart by it",
    )
    hidden: str = _f("100,100", "MLP hidden widths, comma-separated")
    num_clients: int | None = _f(
        None,
        "number of clients N (default 10, or the clients of a `--dataset` file's `client_train`)",
    )
    partition: str | None = _f(
        None,
        "how the training data is split over clients: iid, dirichlet, shards, quantity, or "
        "given (a `--dataset` file's `client_train`; the default when it has one, else dirichlet)",
    )
    dirichlet_alpha: float = _f(0.5, "Dirichlet α of the label skew (smaller: more skewed)")
    min_client_size: int | None = _f(
        None,
        "dirichlet: the smallest client a split may have (default: 10 examples, at most half "
        "the mean client size; 1 lets thousands of clients hold one to a few examples)",
    )
    classes_per_client: int = _f(2, "classes per client for `--partition shards`")
    quantity_sigma: float = _f(
        1.0,
        "quantity: σ of the log-normal client sizes (0: equal sizes; 1.5 spreads 60,000 "
        "examples over 10,000 clients as 1 to about 300 each)",
    )
    dim: int | None = _f(None, "dimension of synthetic targets (default per dataset)")
    data_dir: str | None = _f(None, "directory holding the dataset files")
    data_sha256: str | None = _f(
        None,
        "SHA-256 of your own data (filled in by fedhmc: a resume, or a Flower client, refuses "
        "data that differs)",
        internal=True,
    )
    download: bool = _f(
        False,
        "let torchvision download a dataset where a network exists (into --data-dir when "
        "given, else the cache)",
    )
    scaling: str | None = _f(
        None,
        "feature scaling: standardize, unit ([0, 1] pixels), symmetric ([-1, 1] pixels: "
        "(x/255 − 0.5)/0.5) or none (default: none for `blr-synthetic` and your own data, "
        "else standardize)",
        choices=SCALINGS,
    )
    init: str | None = _f(
        None,
        "initial position: auto (zeros for logistic; He-scaled normal weights for mlp; the "
        "module's own initialisation for cnn and your own models), zeros, normal (N(0, I)), "
        "module (the module's own initialisation, one draw per chain), or `torch-linear` "
        "(PyTorch's default nn.Linear initialisation, for logistic and mlp)",
        choices=INITS,
    )
    # Sampler
    algorithm: str = _f(
        registry.DEFAULT_ALGORITHM,
        "the sampler: " + "; ".join(f"`{e.name}`, {e.summary}" for e in registry.ENTRIES),
        choices=ALGORITHMS,
    )
    options: tuple = _f(
        (),
        "the options that the sampler declares in its own Settings ((name, value) pairs: "
        "`--quantization-levels`, a plugin's own); given as options of their own",
        internal=True,
    )
    protocol: str | None = _f(
        None,
        "algorithm3 (the paper's Algorithm 3, default) or authors (what the authors' "
        "experiment code runs: sync every T leapfrog steps with momenta averaged, two fresh "
        "gradients per step, and for image data a flat prior at temperature 0.005, pixels "
        "in [-1, 1], nn.Linear initialisation, random reshuffling, 20-bin ECE, no burn-in); "
        "explicit options override it",
        choices=PROTOCOL_NAMES,
    )
    batch_size: int | None = _f(None, "minibatch per client (0: full batch; default per dataset)")
    minibatch: str | None = _f(
        None,
        "uniform (each evaluation draws its batch independently) or reshuffle (each client's "
        "data permuted once per pass and cut into batches)",
        choices=MINIBATCH_LAWS,
    )
    clients_per_round: int | None = _f(
        None, "S: clients drawn each round, 1 … N (default: every client)"
    )
    participation: str | None = _f(
        None,
        "how the `--clients-per-round` S clients are drawn and averaged: weighted (with "
        "replacement, each client with probability its share of the data, each draw "
        "weighing 1/S), uniform (S distinct clients, each weighing N/S times its share) or "
        "normalized (S distinct clients, their shares renormalised to sum to one; default)",
        choices=PARTICIPATION_SCHEMES,
    )
    max_worker_failures: int = _f(
        3, "`async-sghmc`, `async-sgld`: retire a worker after this many failed replies in a row"
    )
    prior_std: float | None = _f(None, "σ₀ of the N(0, σ₀² I) prior (default per dataset)")
    # Run
    rounds: int = _f(200, "communication rounds")
    burn_in: int | None = _f(None, "rounds before samples are collected (default rounds/10)")
    thin: int = _f(1, "collect a sample every this many rounds")
    chains: int | None = _f(None, "independent chains run side by side (default per dataset)")
    seed: int = _f(0, "run seed: the same seed gives the same run, bit for bit")
    dtype: str = _f("float32", "floating-point type of the positions", choices=DTYPES)
    device: str = _f("cpu", "torch device (cpu, cuda, cuda:1, …)")
    backend: str = _f("engine", "engine (in-process, batched) or flower", choices=BACKENDS)
    cuda_graphs: bool | None = _f(
        None,
        "capture each round's local iterations in a CUDA graph and replay it (default: on "
        "with `--device cuda`; the federated samplers' rounds, under every participation "
        "scheme, in the engine and in Flower's clients; the chain is the same either way)",
    )
    client_gpus: float | None = _f(
        None,
        "Flower simulation with `--device cuda`: the share of a GPU that each simulated client "
        "asks Ray for, in (0, 1] (default: 1, all co-located clients share one GPU)",
    )
    # Flower
    round_timeout: float = _f(600.0, "Flower: seconds to wait for the clients' replies in a round")
    straggler_factor: float = _f(
        3.0,
        "Flower: close a round with the replies it has once it has lasted this many times the "
        "median of the earlier complete rounds (at least `--straggler-floor` seconds); 0: off",
    )
    straggler_floor: float = _f(
        30.0, "Flower: the straggler deadline is never shorter than this many seconds"
    )
    min_clients: int | None = _f(
        None, "Flower: clients that must be connected to start (default all)"
    )
    node_wait_timeout: float = _f(
        120.0,
        "Flower: seconds to wait for `--min-clients` to connect and answer their first message",
    )
    on_failure: str = _f(
        "renormalize",
        "Flower: when clients fail, average over those that replied, or stop the run",
        choices=ON_FAILURE,
    )
    max_failed_rounds: int = _f(3, "Flower: stop after this many rounds with no valid reply")
    # Output
    out: str | None = _f(None, "output directory (default runs/<time>-<dataset>)")
    save_samples: bool = _f(False, "also write samples.npy (num_samples, chains, d)")
    checkpoint_every: int | None = _f(
        None,
        "write a checkpoint every this many rounds (default: at most once a minute; 0: only "
        "at the end and when stopped)",
    )
    resume: bool = _f(False, "continue the run in `--out` from its checkpoint")
    overwrite: bool = _f(False, "replace the run that `--out` holds")
    ece_bins: int | None = _f(None, "equal-width confidence bins of the ECE (default 15)")
    tensorboard: str | None = _f(
        None,
        "also log every round's metrics and the step size for `tensorboard --logdir DIR` "
        "(a sweep logs each cell to DIR/<cell>); needs fedhmc[tensorboard]",
    )

    # ----------------------------------------------------------------- mapping
    @staticmethod
    def keys() -> list[str]:
        """The kebab-case keys: option names without ``--`` and Flower run-config keys."""
        own = [f.name.replace("_", "-") for f in fields(RunConfig) if f.name != "options"]
        return own + [SAMPLER_OPTIONS] + [o.key for o in sampler_options().values()]

    @classmethod
    def from_mapping(cls, mapping: dict[str, typing.Any]) -> RunConfig:
        """Build a config from kebab- or snake-case keys (CLI options, Flower run config).

        Values may be strings (they are parsed), or already typed. Empty strings mean
        "unset" (Flower's run config cannot hold None). A run's ``config.json`` reads back
        as it is: what it records beside the settings (``RECORDED_ONLY``) is skipped.
        """
        hints = typing.get_type_hints(cls)
        by_name = {f.name: f for f in fields(cls) if f.name != "options"}
        declared = sampler_options()
        kwargs, options = {}, {}
        for key, value in mapping.items():
            name = key.replace("-", "_")
            if name in RECORDED_ONLY:
                continue
            if key == SAMPLER_OPTIONS:  # Flower's run config: "key=value;key=value"
                options.update(_parse_sampler_options(value, declared))
                continue
            if name in declared and name not in by_name:
                if value is not None and value != "":  # unset: the sampler's default
                    options[name] = declared[name].parse(value)
                continue
            if name not in by_name:
                raise ConfigError(f"unknown setting {key!r}; valid: {', '.join(cls.keys())}")
            if value is None and name in NULLABLE:
                continue  # recorded as unused (config.json): the field's default
            choices = by_name[name].metadata.get("choices", ())
            kwargs[name] = _coerce(
                key.replace("_", "-"), value, hints[name], literal_none="none" in choices
            )
        # (a RunConfig, also as ResolvedConfig.from_mapping: only `resolve` resolves)
        return RunConfig(**kwargs, options=tuple(sorted(options.items())))

    def to_run_config(self) -> dict[str, typing.Any]:
        """Flower run-config form: kebab-case keys, None written as an empty string.

        Flower's apps rebuild the problem from these values alone, so the data must be a
        named data set or a file and the model a name or an import spec.
        """
        if self.data_in_memory:
            raise ConfigError(
                "the Flower backend loads the data in every client from a file: save the "
                "tensors with fedhmc_datasets.user.save_npz(data, 'data.npz') and pass "
                "dataset='data.npz'"
            )
        if not isinstance(self.model, str):
            raise ConfigError(
                f"the Flower backend imports the model in every client: define "
                f"{_record('model', self.model)} in an importable module and pass "
                "model='package.module:factory'"
            )
        out = {}
        for f in fields(self):
            if f.name != "options":
                v = getattr(self, f.name)
                out[f.name.replace("_", "-")] = "" if v is None else v
        builtin = set(builtin_option_keys())
        given = {k.replace("_", "-"): v for k, v in self.options}
        out.update({k: given.get(k, "") for k in builtin})
        out[SAMPLER_OPTIONS] = ";".join(f"{k}={v}" for k, v in given.items() if k not in builtin)
        return out

    def to_dict(self) -> dict[str, typing.Any]:
        """The settings as JSON values: data given in memory is recorded as
        ``IN_MEMORY``, a model given as a callable by its import spec (or a description
        when it has none), so that ``config.json`` says truthfully what ran."""
        return {name: _record(name, v) for name, v in self._flat().items()}

    def _flat(self) -> dict[str, typing.Any]:
        """The fields, with the sampler's declared options in place of ``options``."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "options"}
        out.update(self.options)
        return out

    def option(self, name: str):
        """The value given for the sampler's option ``name``, or None."""
        return self._option_values.get(name)

    @functools.cached_property
    def _option_values(self) -> dict[str, typing.Any]:
        """``options`` by name (made once: the config is frozen)."""
        return dict(self.options)

    def __getattr__(self, name: str):
        """A sampler's option by its name (``cfg.leapfrog_steps``): its value, the
        sampler's resolved value in a resolved config, or None where it is not given."""
        if name.startswith("_") or name not in sampler_options():
            raise AttributeError(f"RunConfig has no setting {name!r}")
        return self._option_values.get(name)

    def recorded(self) -> dict[str, typing.Any]:
        """What ``config.json`` records: ``to_dict`` of this resolved config with the
        settings that played no part in the run as ``None`` (`recorded_settings`): a CNN
        records no MLP widths, a given split no Dirichlet α, an engine run no Flower
        timeouts. A ``None`` there reads back (``from_mapping``) as the field's default."""
        return recorded_settings(self.to_dict())

    def headline(self) -> str:
        """The run in one line, as ``fedhmc run`` opens its report: the data, the model,
        the algorithm, the chains, who takes part in a round, and the steps, e.g.
        ``digits, logistic, fahmc, 4 chains, 5 of 10 clients a round (normalized), K=10
        T=10 η=0.01 ρ=1`` (of a resolved config)."""
        rec = self.recorded()
        parts = [str(rec["dataset"])]
        if rec["model"] is not None:
            model = str(rec["model"])
            if rec["model_arg"]:
                model += f"({rec['model_arg']})"
            parts.append(model)
        parts.append(self.algorithm)
        chains = self.chains or 1
        n = self.num_clients
        algo = registry.find(self.algorithm)
        if algo.asynchronous:
            parts.append(f"{chains} server{'s' if chains != 1 else ''}")
            parts.append(f"{n} worker{'s' if n != 1 else ''}")
        else:
            parts.append(f"{chains} chain{'s' if chains != 1 else ''}")
            if not algo.federated:
                parts.append("the pooled data" if n == 1 else f"{n} clients' data pooled")
            elif self.clients_per_round is not None:
                scheme = self.participation or "normalized"
                parts.append(f"{self.clients_per_round} of {n} clients a round ({scheme})")
            elif n == 1:
                parts.append("1 client")
            else:
                parts.append(f"all {n} clients every round")
        symbol = algo.step_symbol
        if symbol == "eta":
            tail = (
                f"K={self.leapfrog_steps} T={self.local_steps} η={self.step_size:g} ρ={self.rho:g}"
            )
        elif symbol == "h" and self.local_steps is not None:
            tail = f"{self.local_steps} steps a round h={self.step_size:g}"
        elif symbol == "h":
            tail = f"h={self.step_size:g}"
        else:
            tail = " ".join(f"{o.key}={_shown(getattr(self, o.name))}" for o in algo.options)
        return ", ".join(parts) + ", " + tail

    @property
    def data_in_memory(self) -> bool:
        """Whether the data was given in Python (tensors or a Dataset), not by name or file."""
        return not isinstance(self.dataset, str)

    @property
    def user_data_file(self) -> str | None:
        """The path of a ``--dataset PATH.npz``, or None for a named or in-memory dataset."""
        return _user_file(self.dataset)

    def replace(self, **changes) -> RunConfig:
        """This config with ``changes``: fields, or the sampler's declared options (None:
        back to the sampler's default)."""
        own = {f.name for f in fields(self)}
        declared = {k: changes.pop(k) for k in list(changes) if k not in own}
        unknown = [k for k in declared if k not in sampler_options()]
        if unknown:
            raise TypeError(f"RunConfig has no setting {unknown[0]!r}")
        if declared:
            options = dict(changes.get("options", self.options))
            options.update(declared)
            kept = {k: v for k, v in options.items() if v is not None}
            changes["options"] = tuple(sorted(kept.items()))
        return dataclasses.replace(self, **changes)

    @property
    def hidden_widths(self) -> tuple[int, ...]:
        try:
            widths = tuple(int(h) for h in str(self.hidden).split(",") if h.strip())
        except ValueError:
            raise ConfigError(
                f"--hidden must be comma-separated integers like 100,100, got {self.hidden!r}"
            ) from None
        if not widths or min(widths) < 1:
            raise ConfigError(f"--hidden needs positive widths like 100,100, got {self.hidden!r}")
        return widths

    # ------------------------------------------------------------- resolution
    def resolve(self) -> ResolvedConfig:
        """Fill the dataset defaults and validate; returns a `ResolvedConfig`, with no
        ``None`` left except ``data_dir`` and ``out`` and the settings its sampler does not
        have (a ResolvedConfig's ``resolve`` returns it as it is). Raises ``ConfigError``
        with a one-line message.
        """
        from fedhmc.runtime.presets import USER_DATA, dataset_defaults

        # (before the defaults, some of which divide by the dimension)
        _need(self.dim is None or self.dim >= 1, f"--dim must be ≥ 1, got {self.dim}")
        _need(
            self.algorithm in ALGORITHMS,
            f"--algorithm must be one of {', '.join(ALGORITHMS)}; got {self.algorithm!r}",
        )
        cfg = self._resolve_model_and_data()
        builtin = isinstance(cfg.dataset, str) and cfg.user_data_file is None
        model_key = cfg.model if cfg.model in ("logistic", "mlp") else "module"
        d = dataset_defaults(cfg.dataset if builtin else USER_DATA, model_key, cfg.dim)
        algo = registry.find(cfg.algorithm)
        cfg = cfg._resolve_protocol(algo)._resolve_sampler(algo, d)._fill_defaults(d, builtin)
        cfg.validate()
        return ResolvedConfig(**{f.name: getattr(cfg, f.name) for f in fields(cfg)})

    def _resolve_protocol(self, algo: registry.Entry) -> RunConfig:
        """``--protocol`` checked (default algorithm3), and the options it sets filled in
        where they are unset (of the sampler's, those it has)."""
        if self.protocol is not None and self.protocol not in PROTOCOL_NAMES:
            raise ConfigError(
                f"--protocol must be one of {', '.join(PROTOCOL_NAMES)}; got {self.protocol!r}"
            )
        protocol = self.protocol or "algorithm3"
        if protocol not in algo.protocols:
            runs = [e.name for e in registry.ENTRIES if protocol in e.protocols]
            raise ConfigError(
                f"--protocol {protocol} is a way to run FA-HMC; use --algorithm "
                f"{' or '.join(runs)}, not {self.algorithm}"
            )
        unset = {
            **_GENERIC_DEFAULTS,
            **protocol_settings(protocol, self.dataset),
        }
        if self.model not in ("logistic", "mlp") and self.init is None:
            # The authors' nn.Linear start, for any other network: its own initialisation.
            unset["init"] = {"torch-linear": "module"}.get(unset["init"], unset["init"])
        run = {f.name for f in fields(self)}
        mine = set(algo.own) | run
        return self.replace(
            protocol=protocol,
            **{k: v for k, v in unset.items() if k in mine and getattr(self, k) is None},
        )

    def _resolve_sampler(self, algo: registry.Entry, d: dict) -> RunConfig:
        """The sampler's options checked and filled in: its Settings from the given
        options (an option it lacks refused in one line naming its own: here, before the
        resolved values replace what was given), with the run's defaults where unset (the
        step size from the dataset's, ``d``); every option's value recorded in
        ``options``. Also the chains and the pooled data that the kind of sampler implies."""
        self._check_given_options(algo)
        settings = algo.build_settings(self).with_defaults(d["step_size"])
        run = {f.name for f in fields(self)}
        values = {
            o.name: getattr(settings, o.name)
            for o in api.options(algo.settings_class)
            if o.name not in run and getattr(settings, o.name) is not None
        }
        changes: dict[str, typing.Any] = {"options": tuple(sorted(values.items()))}
        if algo.asynchronous and self.chains is None:
            changes["chains"] = 1  # one server per chain, each with its own workers
        if algo.kind == registry.POOLED and self.dataset != "gaussian-hetero":
            changes.update(num_clients=1, partition="iid")  # the pooled data: one "client"
        return self.replace(**changes)

    def _check_given_options(self, algo: registry.Entry) -> None:
        """Refuse a sampler option that ``algo`` does not have, naming its own, and one
        that its name fixes to another value."""
        own = set(algo.own)
        for name, value in self.options:
            flag = "--" + name.replace("_", "-")
            fixed = dict(algo.fixed)
            if name in fixed and value == fixed[name]:
                continue  # (what the name means anyway: fald's K = 1)
            if name in fixed:
                raise ConfigError(
                    f"{flag} is not an option of --algorithm {self.algorithm} (its name means "
                    f"{flag} {_shown(fixed[name])}){own_options_clause(algo)}; drop {flag}"
                )
            if name not in own:
                raise ConfigError(
                    f"{flag} is not an option of --algorithm {self.algorithm}"
                    f"{own_options_clause(algo)}; drop {flag}"
                )

    def _fill_defaults(self, d: dict, builtin: bool) -> RunConfig:
        """The settings still unset, from the dataset's defaults ``d`` and the run's own
        (burn-in, CUDA graphs, scaling); ``builtin``: the data is a named dataset."""
        return self.replace(
            batch_size=d["batch_size"] if self.batch_size is None else self.batch_size,
            prior_std=d["prior_std"] if self.prior_std is None else self.prior_std,
            chains=d["chains"] if self.chains is None else self.chains,
            dim=d["dim"] if self.dim is None else self.dim,
            burn_in=self.rounds // 10 if self.burn_in is None else self.burn_in,
            cuda_graphs=(
                self.device.startswith("cuda") if self.cuda_graphs is None else self.cuda_graphs
            ),
            compile=self._compile_default(d) if self.compile is None else self.compile,
            scaling=(
                ("none" if self.dataset == "blr-synthetic" or not builtin else "standardize")
                if self.scaling is None
                else self.scaling
            ),
        )

    def _compile_default(self, d: dict) -> bool:
        """``--compile``'s default (``COMPILE_MIN_EVALS``): on for a network module on the
        CPU whose run is large enough to repay the compilation."""
        from fedhmc.runtime.presets import GAUSSIAN_TARGETS

        if self.dataset in GAUSSIAN_TARGETS or self.model in ("logistic", "mlp"):
            return False
        if not self.device == "cpu":
            return False
        chains = d["chains"] if self.chains is None else self.chains
        clients = self.clients_per_round or self.num_clients or 10
        k = self.leapfrog_steps or 1  # (resolved: the sampler's K, or none)
        evals = self.rounds * chains * clients * (self.local_steps or 1) * (k + 1)
        return evals >= COMPILE_MIN_EVALS

    def _resolve_model_and_data(self) -> RunConfig:
        """The model as an import spec where it has one, the data's checksum, and the client
        split (``given`` where the data carries one); one-line errors otherwise."""
        if self.dataset == IN_MEMORY:
            raise ConfigError(
                "this run's data was given in memory (Python tensors); continue it from Python "
                "with the same data: run(RunConfig(..., dataset=data, resume=True))"
            )
        changes = self._resolved_model()
        data_changes, clients = self._resolved_data()
        changes.update(data_changes)
        changes.update(self._resolved_split(clients))
        return self.replace(**changes)

    def _resolved_model(self) -> dict[str, typing.Any]:
        """``model`` (a callable by its import spec where it has one) and ``model_arg``
        (normalised), checked."""
        from fedhmc.models.module import format_model_args, load_factory, parse_model_args

        changes: dict[str, typing.Any] = {}
        model = self.model
        if not isinstance(model, str):
            from fedhmc.models.module import spec_of

            if not callable(model):
                raise ConfigError(
                    f"model must be a name, a 'package.module:factory' spec or a callable "
                    f"returning a torch.nn.Module, got {type(model).__name__}"
                )
            changes["model"] = spec_of(model) or model
        elif model.startswith("<in-memory"):
            raise ConfigError(
                f"this run's model was a Python object ({model}); continue it from Python "
                "with the same model: run(RunConfig(..., model=factory, resume=True))"
            )
        elif model not in MODELS:
            load_factory(model)  # a one-line error if it does not import
        kwargs = parse_model_args(self.model_arg)
        if kwargs and model in ("logistic", "mlp"):
            raise ConfigError(
                f"--model-arg is for cnn and your own models, not {model}; drop it "
                "(--hidden sets the MLP's widths)"
            )
        changes["model_arg"] = format_model_args(kwargs) or None
        return changes

    def _resolved_data(self) -> tuple[dict[str, typing.Any], int | None]:
        """The changes for the data (a file's absolute path, the data's ``data_sha256``,
        refusing data that differ from the run's), and the number of clients of the data's
        own split (None: it has none)."""
        changes: dict[str, typing.Any] = {}
        ds, sha, clients = self.dataset, None, None
        if not isinstance(ds, str):
            from fedhmc_datasets.registry import DatasetSplit
            from fedhmc_datasets.user import data_checksum

            if not isinstance(ds, DatasetSplit):
                raise ConfigError(
                    f"dataset must be a name, a PATH.npz, or data from "
                    f"fedhmc_datasets.user.from_tensors / from_datasets, got {type(ds).__name__}"
                )
            sha = data_checksum(ds)
            if ds.client_train is not None:
                clients = int(ds.client_train.max()) + 1
        elif self.user_data_file is not None:
            from fedhmc_datasets.user import npz_client_count, sha256_of

            path = os.path.abspath(os.path.expanduser(ds))
            if not os.path.isfile(path):
                what = "not a regular file" if os.path.exists(path) else "no such file"
                raise ConfigError(
                    f"--dataset {ds}: {what}; give the path of an .npz holding x_train, "
                    "y_train, x_test and y_test, or a dataset name (fedhmc data --list)"
                )
            sha = sha256_of(path)
            clients = npz_client_count(path)
            changes["dataset"] = path
        if sha is not None:
            if self.data_sha256 and self.data_sha256 != sha:
                raise ConfigError(
                    f"the data differ from the run's (SHA-256 {sha[:12]}… against "
                    f"{self.data_sha256[:12]}… in its config); restore the run's data or "
                    "start a new run"
                )
            changes["data_sha256"] = sha
        return changes, clients

    def _resolved_split(self, clients: int | None) -> dict[str, typing.Any]:
        """``partition`` (``given`` where the data has ``clients`` of its own, else
        dirichlet) and ``num_clients`` (default 10)."""
        partition = self.partition or ("given" if clients is not None else "dirichlet")
        num_clients = self.num_clients
        if partition == "given":
            if clients is None:
                raise ConfigError(
                    "--partition given keeps the data's own client split, but the data has no "
                    "client_train; add client_train to the .npz or use another --partition"
                )
            if num_clients is not None and num_clients != clients:
                raise ConfigError(
                    f"--num-clients {num_clients} disagrees with the {clients} clients of the "
                    "data's client_train; drop --num-clients or use another --partition"
                )
            num_clients = clients
        return {"partition": partition, "num_clients": 10 if num_clients is None else num_clients}

    # ------------------------------------------------------------- validation
    def validate(self) -> None:
        """Check ranges; one-line ``ConfigError`` naming the option and the fix.

        The checks run in this order, and the first that fails gives the message. The
        sampler's options are checked by its Settings."""
        _need(
            self.algorithm in ALGORITHMS,
            f"--algorithm must be one of {', '.join(ALGORITHMS)}; got {self.algorithm!r}",
        )
        algo = registry.find(self.algorithm)
        self._check_sampler(algo)
        self._check_participation(algo)
        self._check_output()
        self._check_data_and_clients()
        self._check_steps()
        self._check_backend_and_async(algo)
        self._check_dynamics()
        self._check_rounds()
        self._check_device_options()
        self._check_counts_and_split()
        self._check_choices()
        self._check_flower()
        self._check_model()

    def _check_sampler(self, algo: registry.Entry) -> None:
        """The sampler's options: one it does not have refused, naming its own; its
        Settings check the values (each option's range, then its own rules)."""
        self._check_given_options(algo)
        settings = algo.build_settings(self)
        resumes = getattr(algo.module, "resumes_on_flower", None)
        _need(
            not (self.resume and self.backend == "flower") or resumes is None or resumes(settings),
            f"--algorithm {self.algorithm} cannot be resumed on Flower: its clients keep "
            "state between rounds that new Flower nodes do not have; start the run again "
            "(--overwrite), or run it on the engine, whose checkpoint holds that state",
        )

    def _check_participation(self, algo: registry.Entry) -> None:
        """``--clients-per-round`` and ``--participation``: the run's, for a sampler whose
        Settings read them."""
        S = self.clients_per_round
        for name in api.SHARED:
            flag = "--" + name.replace("_", "-")
            _need(
                getattr(self, name) is None or name in algo.own,
                f"{flag} is not an option of --algorithm {self.algorithm}"
                f"{algo.no_partial_reason}{own_options_clause(algo)}; drop {flag}",
            )
        _need(
            self.participation is None or S is not None,
            f"--participation {self.participation} has no effect without --clients-per-round "
            "(every client takes part in every round); add --clients-per-round S (1 … N) or "
            "drop --participation",
        )
        if S is not None:  # (its range and the scheme: the sampler's Settings)
            N = self.num_clients
            _need(
                N is None or S <= N,
                f"--clients-per-round {S} is more than the {N} clients; give at most {N}",
            )

    def _check_output(self) -> None:
        """``--ece-bins``, ``--checkpoint-every``, and ``--resume`` against ``--overwrite``."""
        eb = self.ece_bins
        _need(eb is None or eb >= 1, f"--ece-bins must be ≥ 1, got {eb}")
        ce = self.checkpoint_every
        _need(ce is None or ce >= 0, f"--checkpoint-every must be ≥ 0 rounds, got {ce}")
        _need(
            not (self.resume and self.overwrite),
            "--resume continues the run in --out and --overwrite replaces it; pick one",
        )
        tb = self.tensorboard
        _need(
            tb is None or not os.path.exists(tb) or os.path.isdir(tb),
            f"--tensorboard {tb} is a file; give a folder for its event files (new or existing)",
        )

    def _check_data_and_clients(self) -> None:
        """``--data-dir`` (an existing folder) and ``--num-clients``."""
        dd = self.data_dir
        _need(
            dd is None or os.path.isdir(os.path.expanduser(dd)),
            f"--data-dir {dd}: no such folder; give the folder that holds the dataset's files "
            "(or drop --data-dir to use the usual places)",
        )
        nc = self.num_clients
        _need(nc is None or nc >= 1, f"--num-clients must be ≥ 1, got {nc}")

    def _check_steps(self) -> None:
        """The batch size."""
        b = self.batch_size
        _need(b is None or b >= 0, f"--batch-size must be ≥ 0 (0: full batch), got {b}")

    def _check_backend_and_async(self, algo: registry.Entry) -> None:
        """The algorithm's backends, and the asynchronous samplers' options."""
        _need(
            not (self.backend == "flower" and "flower" not in algo.backends),
            f"--algorithm {self.algorithm} runs on the engine only; drop --backend flower",
        )
        _need(
            self.max_worker_failures >= 1,
            f"--max-worker-failures must be ≥ 1, got {self.max_worker_failures}",
        )
        _need(
            not (algo.asynchronous and self.chains is not None and self.chains > self.num_clients),
            f"--algorithm {self.algorithm} gives each of the --chains {self.chains} servers "
            f"its own workers, but --num-clients is {self.num_clients}; "
            "use --num-clients ≥ --chains",
        )

    def _check_dynamics(self) -> None:
        """The prior."""
        ps = self.prior_std
        _need(
            ps is None or (ps > 0 and not math.isnan(ps)),
            f"--prior-std must be > 0 (inf for a flat prior), got {ps}",
        )

    def _check_rounds(self) -> None:
        """``--rounds`` and ``--burn-in``."""
        _need(self.rounds >= 1, f"--rounds must be ≥ 1, got {self.rounds}")
        bi = self.burn_in
        _need(bi is None or bi >= 0, f"--burn-in must be ≥ 0, got {bi}")
        _need(
            bi is None or bi < self.rounds,
            f"--burn-in {bi} leaves no round to sample in --rounds {self.rounds}; "
            f"use --burn-in below {self.rounds}",
        )

    def _check_device_options(self) -> None:
        """``--cuda-graphs``, ``--client-gpus`` and ``--device`` (this machine has it)."""
        _need(
            not self.cuda_graphs or self.device.startswith("cuda"),
            f"--cuda-graphs needs --device cuda (this run is on {self.device}); drop it",
        )
        cg = self.client_gpus
        _need(
            cg is None or (math.isfinite(cg) and 0 < cg <= 1),
            f"--client-gpus must be a share of one GPU in (0, 1], got {cg}",
        )
        if self.device != "cpu":
            check_device(self.device)
        _need(
            cg is None or self.backend == "flower",
            "--client-gpus sets the GPU share of Flower's simulated clients; "
            "add --backend flower or drop it",
        )
        _need(
            cg is None or self.device.startswith("cuda"),
            "--client-gpus gives Flower's clients a share of a GPU; add --device cuda or drop it",
        )

    def _check_counts_and_split(self) -> None:
        """``--thin``, ``--chains``, ``--dim``, and the parameters of the client split."""
        _need(self.thin >= 1, f"--thin must be ≥ 1, got {self.thin}")
        _need(self.chains is None or self.chains >= 1, f"--chains must be ≥ 1, got {self.chains}")
        _need(
            0 <= self.seed <= MAX_SEED,
            f"--seed must be an integer in [0, {MAX_SEED}] (the data split's random state "
            f"takes 32 bits), got {self.seed}",
        )
        _need(
            self.dirichlet_alpha > 0 and math.isfinite(self.dirichlet_alpha),
            f"--dirichlet-alpha must be a positive number, got {self.dirichlet_alpha}",
        )
        _need(
            self.min_client_size is None or self.min_client_size >= 1,
            f"--min-client-size must be ≥ 1 example, got {self.min_client_size}",
        )
        _need(
            self.classes_per_client >= 1,
            f"--classes-per-client must be ≥ 1, got {self.classes_per_client}",
        )
        _need(
            self.quantity_sigma >= 0 and math.isfinite(self.quantity_sigma),
            f"--quantity-sigma must be a finite number ≥ 0, got {self.quantity_sigma}",
        )

    def _check_choices(self) -> None:
        """The settings that take one of a list of values."""
        for name, choices in (
            ("algorithm", ALGORITHMS),
            ("backend", BACKENDS),
            ("dtype", DTYPES),
            ("on_failure", ON_FAILURE),
            ("model_batching", BATCHINGS),
        ):
            v = getattr(self, name)
            _need(v in choices, f"--{name} must be one of {', '.join(choices)}; got {v!r}")
        for name, choices in (
            ("protocol", PROTOCOL_NAMES),
            ("minibatch", MINIBATCH_LAWS),
            ("init", INITS),
            ("partition", PARTITIONS),
        ):
            v = getattr(self, name)
            flag = name.replace("_", "-")
            _need(
                v is None or v in choices,
                f"--{flag} must be one of {', '.join(choices)}; got {v!r}",
            )
        _need(
            self.scaling is None or self.scaling in SCALINGS,
            f"--scaling must be one of {', '.join(SCALINGS)}; got {self.scaling!r}",
        )

    def _check_flower(self) -> None:
        """The Flower backend's timeouts, straggler deadline and failure limits."""
        _need(self.round_timeout > 0, f"--round-timeout must be > 0, got {self.round_timeout}")
        _need(
            math.isfinite(self.straggler_factor) and self.straggler_factor >= 0,
            f"--straggler-factor must be >= 0 (0 turns it off), got {self.straggler_factor}",
        )
        _need(
            math.isfinite(self.straggler_floor) and self.straggler_floor > 0,
            f"--straggler-floor must be > 0 seconds, got {self.straggler_floor}",
        )
        _need(
            self.node_wait_timeout > 0,
            f"--node-wait-timeout must be > 0, got {self.node_wait_timeout}",
        )
        mc = self.min_clients
        _need(
            mc is None or 1 <= mc <= self.num_clients,
            f"--min-clients must be in [1, --num-clients={self.num_clients}], got {mc}",
        )
        _need(self.max_failed_rounds >= 1, "--max-failed-rounds must be ≥ 1")

    def _check_model(self) -> None:
        """``--model``, the MLP's ``--hidden``, and the gradient evaluations per round."""
        _need(
            not isinstance(self.model, str) or self.model in MODELS or ":" in self.model,
            f"--model must be one of {', '.join(MODELS)} or a PACKAGE.MODULE:FACTORY spec "
            f"such as mypackage.nets:make_cnn; got {self.model!r}",
        )
        if self.model == "mlp":
            self.hidden_widths  # noqa: B018  (validates)
        from fedhmc.runtime.presets import GAUSSIAN_TARGETS

        builtin = self.model in ("logistic", "mlp") or self.dataset in GAUSSIAN_TARGETS
        _need(
            not (self.compile and builtin),
            "--compile applies to a network given as an nn.Module (--model cnn or "
            "PACKAGE.MODULE:FACTORY); the built-in logistic and mlp models are already "
            "hand-differentiated: drop it",
        )

    def default_out(self) -> str:
        import time

        stamp = time.strftime("%Y%m%d-%H%M%S")
        return os.path.join("runs", f"{stamp}-{self.dataset}")


_DATACLASS_INIT = RunConfig.__init__


def _init(self, *args, **kwargs) -> None:
    """RunConfig's ``__init__``: its fields, and the options a sampler declares given by
    name (``RunConfig(algorithm="qlsd", quantization_levels=4)``) into ``options``."""
    own = RunConfig.__dataclass_fields__
    declared = {k: kwargs.pop(k) for k in list(kwargs) if k not in own}
    if declared:
        known = sampler_options()
        unknown = [k for k in declared if k not in known]
        if unknown:
            raise TypeError(f"RunConfig got an unexpected keyword argument {unknown[0]!r}")
        options = dict(kwargs.get("options", ()))
        options.update({k: known[k].parse(v) for k, v in declared.items() if v is not None})
        kwargs["options"] = tuple(sorted(options.items()))
    _DATACLASS_INIT(self, *args, **kwargs)


RunConfig.__init__ = _init


class ResolvedConfig(RunConfig):
    """A resolved `RunConfig`: what `RunConfig.resolve` returns, its defaults filled in and
    its values checked, and what a run is carried out with
    (`fedhmc.runtime.backends.prepare` makes one; the round loop and the Flower server
    take one). Resolving it again returns it as it is, so that a run resolves its settings
    once.

    ``replace`` gives a `RunConfig`, to be resolved again: a changed setting may call for
    other defaults (``rounds`` for the ``burn_in``) or break a rule. ``with_out`` changes
    the output folder only, which nothing is derived from, and keeps it resolved."""

    def resolve(self) -> ResolvedConfig:
        """This config, resolved already."""
        return self

    def replace(self, **changes) -> RunConfig:
        """This config with ``changes`` (as `RunConfig.replace`), as a RunConfig."""
        plain = RunConfig(**{f.name: getattr(self, f.name) for f in fields(self)})
        return plain.replace(**changes)

    def with_out(self, out: str) -> ResolvedConfig:
        """This config writing its files to folder ``out``."""
        return dataclasses.replace(self, out=out)


def _shown(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _need(ok: bool, msg: str) -> None:
    """Raise ``ConfigError(msg)`` unless ``ok``."""
    if not ok:
        raise ConfigError(msg)


def check_device(
    device: str, label: str | None = None, where: str = "this machine", cpu: str = "--device cpu"
) -> None:
    """A one-line error for a device that ``where`` does not have. ``label`` names the
    setting in the message (default ``--device DEVICE``; a SuperNode's node config says
    ``node config device='cuda:1'``), ``cpu`` how to ask for the CPU instead."""
    import torch

    label = label or f"--device {device}"
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ConfigError(f"{label} is not a torch device; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"{label}: no CUDA GPU is available on {where}; use {cpu}")
        if dev.index is not None and dev.index >= count:
            raise ConfigError(f"{label}: {where} has {count} GPU(s); use cuda:0 … cuda:{count - 1}")
    elif dev.type == "mps":
        # The chain's random numbers (Box-Muller on 53-bit uniforms) and the metrics are
        # float64 computations, which Apple's MPS backend does not have.
        raise ConfigError(
            f"{label}: fedhmc's random numbers and metrics need float64, which Apple's MPS "
            f"backend lacks; use {cpu}"
        )
    elif dev.type != "cpu":
        raise ConfigError(f"{label}: fedhmc runs on cpu or cuda")


def _coerce(key: str, value, hint, literal_none: bool = False):
    """Parse ``value`` to the field type ``hint`` (str, int, float, bool, or Optional).

    For an optional field, ``""`` and ``"none"`` mean unset, unless ``"none"`` is one of
    the field's choices (``--scaling none``), when it is kept as text.
    """
    args = typing.get_args(hint)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), hint) if args else hint
    unset = ("",) if literal_none else ("", "none")
    if value is None or (optional and isinstance(value, str) and value.strip() in unset):
        if optional:
            return None
        raise ConfigError(f"setting {key!r} needs a value")
    try:
        if base is bool:
            if isinstance(value, str):
                low = value.strip().lower()
                if low in ("1", "true", "yes", "on"):
                    return True
                if low in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            return bool(value)
        if base is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            if isinstance(value, str):
                f = float(value)
                if not f.is_integer():
                    raise ValueError(value)
                return int(f)
            return int(value)
        if base is float:
            return float(value)
        return str(value)
    except (TypeError, ValueError, OverflowError):
        kind = {bool: "true or false", int: "an integer", float: "a number"}.get(base, "text")
        raise ConfigError(f"setting {key!r} must be {kind}, got {value!r}") from None


def _user_file(dataset) -> str | None:
    """``dataset`` as the path of the user's own data file, or None."""
    if not isinstance(dataset, str):
        return None
    if dataset.endswith(".npz") or os.sep in dataset or (os.altsep and os.altsep in dataset):
        return dataset
    return None


def _record(name: str, value):
    """A setting's value as ``config.json`` records it (see ``RunConfig.to_dict``)."""
    if name == "dataset" and not isinstance(value, str):
        return IN_MEMORY
    if name == "model" and value is not None and not isinstance(value, str):
        from fedhmc.models.module import describe_factory, spec_of

        return spec_of(value) or describe_factory(value)
    if name == "model_arg" and isinstance(value, dict):
        from fedhmc.models.module import format_model_args

        return format_model_args(value) or None
    return value
