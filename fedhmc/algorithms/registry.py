"""The algorithms a run can name, listed once: the only place that maps ``--algorithm NAME``
to its module, to how its Settings are built from a run config, and to what it supports.

Everything else (the config's choices and checks, the engine, the wire format, the Flower
server and clients) reads an [`Entry`][fedhmc.algorithms.registry.Entry]'s facts instead of
comparing names. ``fald`` is FA-HMC with K = 1: the same module, the same Settings and the
same facts as ``fahmc`` but for its fixed leapfrog steps.

Pure PyTorch: no Flower import.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from fedhmc.algorithms import api
from fedhmc.errors import ConfigError, first_line

if TYPE_CHECKING:  # the modules are imported when an entry's module or settings are used:
    # the run configuration reads the facts without importing torch (a ServerApp sends its
    # first messages before it imports torch)
    from fedhmc.algorithms import debiased, fahmc, stale

ENGINE, FLOWER = "engine", "flower"
ALGORITHM3, AUTHORS = "algorithm3", "authors"

WORKERS_ANSWER = " (its workers answer when they can, not when drawn)"
POOLED = " (it samples the pooled data: there are no clients to draw)"


def fahmc_fields(cfg) -> dict:
    """FA-HMC's Settings fields from a resolved run config (or anything with its fields)."""
    return dict(
        step_size=float(cfg.step_size),
        leapfrog_steps=int(cfg.leapfrog_steps),
        local_steps=int(cfg.local_steps),
        rho=float(cfg.rho),
        grad_noise=float(cfg.grad_noise),
        temperature=float(cfg.temperature or 1.0),
        sync_unit=cfg.sync_unit or "iteration",
        fresh_gradients=bool(cfg.fresh_gradients),
        restart=bool(cfg.restart_trajectories),
        clients_per_round=cfg.clients_per_round,
        participation=cfg.participation or "normalized",
    )


def fahmc_settings(cfg) -> fahmc.Settings:
    """FA-HMC's settings (``fahmc`` and ``fald``)."""
    from fedhmc.algorithms import fahmc

    return fahmc.Settings(**fahmc_fields(cfg))


def debiased_settings(cfg) -> debiased.Settings:
    """Debiased FA-HMC's settings: FA-HMC's and the anchor batch size."""
    from fedhmc.algorithms import debiased

    return debiased.Settings(anchor_batch_size=int(cfg.anchor_batch_size), **fahmc_fields(cfg))


def _async_settings(method: str) -> Callable:
    def build(cfg):
        """The asynchronous sampler's settings (each worker's chain)."""
        from fedhmc.algorithms import async_sgmcmc

        return async_sgmcmc.Settings(
            method=method,
            step_size=float(cfg.step_size),
            friction=float(cfg.friction),
            temperature=float(cfg.temperature),
            max_staleness=int(cfg.max_staleness),
        )

    return build


def _stale_settings(method: str) -> Callable:
    def build(cfg) -> stale.Settings:
        """The stale-gradient sampler's settings (one process, the pooled energy)."""
        from fedhmc.algorithms import stale

        return stale.Settings(
            method=method,
            step_size=float(cfg.step_size),
            friction=float(cfg.friction),
            staleness=int(cfg.staleness),
            staleness_dist=cfg.staleness_dist,
            temperature=float(cfg.temperature),
            grad_noise=float(cfg.grad_noise),
            steps=int(cfg.local_steps),
        )

    return build


@dataclass(frozen=True)
class Entry:
    """One algorithm: its module and what it supports.

    Attributes
    ----------
    name
        ``--algorithm NAME``.
    summary
        What it is, in a few words (the documentation's table of samplers).
    module_path
        The name of the module with ``init(position, settings)`` and ``step(seed, state,
        target, settings)`` (the asynchronous samplers: their chain's state machine); a
        federated one has the functions `fedhmc.algorithms.federated` composes.
    settings
        Its Settings from a resolved run config: ``settings(cfg)``.
    federated
        Clients of their own data exchange messages (False: one sampler on the pooled data).
    asynchronous
        Workers answer a server when they can, not in rounds.
    leapfrog
        An FA-HMC sampler: K leapfrog steps of size η, and ρ (False: an Euler step h).
    euler
        An Euler-step sampler (SGHMC / SGLD): h, no leapfrog steps, no ρ.
    momentum
        Its Euler update keeps a momentum with friction (SGHMC; False: SGLD).
    fixed_leapfrog_steps
        K fixed by the name (``fald``: 1), or None.
    partial_participation
        ``--clients-per-round`` and ``--participation`` apply.
    no_partial_reason
        Why they do not, in the refusal's words.
    trajectory_options
        ``--sync-unit leapfrog``, ``--fresh-gradients`` and ``--restart-trajectories`` apply.
    protocols
        The ``--protocol`` values it runs under.
    backends
        The ``--backend`` values it runs on.
    anchor
        Debiased FA-HMC's anchor: ``--anchor-batch-size`` applies. (What a round's
        messages carry is the federated module's ``layout``: `fedhmc.algorithms.federated`.)
    batches_colocated
        A Flower simulation's co-located clients compute a round in one batch
        (``clients/task.colocated_update``), as the engine does.
    fixed
        Settings fields that the name fixes, as (field, value) pairs: for a sampler whose
        ``settings`` is None, its module's ``Settings`` is built from the run's values
        (`fedhmc.algorithms.api.build`) with these set.
    """

    name: str
    module_path: str | None
    settings: Callable | None
    summary: str = ""
    federated: bool = True
    asynchronous: bool = False
    leapfrog: bool = False
    euler: bool = False
    momentum: bool = False
    fixed_leapfrog_steps: int | None = None
    partial_participation: bool = False
    no_partial_reason: str = WORKERS_ANSWER
    trajectory_options: bool = False
    protocols: tuple[str, ...] = (ALGORITHM3,)
    backends: tuple[str, ...] = (ENGINE, FLOWER)
    anchor: bool = False
    batches_colocated: bool = False
    fixed: tuple[tuple[str, typing.Any], ...] = ()

    @property
    def module(self) -> ModuleType:
        """The algorithm's module (``module_path``); another package's that does not import
        is a one-line `ConfigError`."""
        try:
            return importlib.import_module(self.module_path)
        except Exception as e:
            if self.module_path.startswith("fedhmc."):
                raise
            raise ConfigError(
                f"--algorithm {self.name}: its module {self.module_path} does not import "
                f"({first_line(e)}); fix or uninstall the package that provides it"
            ) from None

    @property
    def declares_options(self) -> bool:
        """Whether the sampler's options are its module's ``Settings`` declarations
        (`fedhmc.algorithms.api.option`), not the run config's fields."""
        return self.settings is None and self.module_path is not None

    @property
    def settings_class(self) -> type | None:
        """The module's ``Settings`` class where the sampler declares its options."""
        return self.module.Settings if self.declares_options else None

    @property
    def options(self) -> tuple[api.Option, ...]:
        """The options the sampler declares (``()`` where its options are the run
        config's fields), without the fields its name fixes."""
        if not self.declares_options:
            return ()
        fixed = dict(self.fixed)
        return tuple(o for o in api.options(self.settings_class) if o.name not in fixed)

    @property
    def field_names(self) -> tuple[str, ...]:
        """The fields of the sampler's Settings where it declares its options."""
        if not self.declares_options:
            return ()
        return tuple(f.name for f in dataclasses.fields(self.settings_class))

    def build_settings(self, cfg):
        """The sampler's settings from a resolved run config."""
        if self.settings is not None:
            return self.settings(cfg)
        return api.build(self.settings_class, cfg, self.fixed)


_FAHMC = dict(
    module_path="fedhmc.algorithms.fahmc",
    settings=fahmc_settings,
    leapfrog=True,
    partial_participation=True,
    no_partial_reason="",
    trajectory_options=True,
    protocols=(ALGORITHM3, AUTHORS),
    batches_colocated=True,
)


def _pooled(method: str) -> Entry:
    """The stale-gradient sampler ``method`` (``sghmc``: with momentum) on the pooled data."""
    return Entry(
        method,
        module_path="fedhmc.algorithms.stale",
        settings=_stale_settings(method),
        summary=f"{method.upper()} with stale gradients, on the pooled data",
        federated=False,
        euler=True,
        momentum=method == "sghmc",
        no_partial_reason=POOLED,
        backends=(ENGINE,),
    )


def _asynchronous(method: str) -> Entry:
    """The asynchronous distributed sampler ``method`` (``sghmc``: with momentum)."""
    return Entry(
        f"async-{method}",
        module_path="fedhmc.algorithms.async_sgmcmc",
        settings=_async_settings(method),
        summary=f"asynchronous distributed {method.upper()}: workers send gradients when ready",
        asynchronous=True,
        euler=True,
        momentum=method == "sghmc",
        backends=(FLOWER,),
    )


_QLSD = (
    ("qlsd", "plain", "QLSD: clients send quantised gradients, the server takes the Langevin step"),
    ("qlsd-star", "star", "QLSD*: QLSD with a control variate at the chain's start"),
    ("qlsd-pp", "pp", "QLSD++: QLSD with a refreshed control variate and a memory"),
)


def _qlsd(name: str, variant: str, summary: str) -> Entry:
    """QLSD's variant ``variant`` (``fedhmc.algorithms.qlsd``): its options are its own."""
    fixed = (("variant", variant),)
    if variant != "pp":
        fixed += (("reference_refresh", 10),)
    return Entry(
        name,
        module_path="fedhmc.algorithms.qlsd",
        settings=None,
        summary=summary,
        euler=True,
        partial_participation=True,
        no_partial_reason="",
        fixed=fixed,
    )


def _dglmc() -> Entry:
    """DG-LMC (``fedhmc.algorithms.dglmc``): its options are its own; every client takes
    part in every round (it declares no ``clients_per_round``)."""
    return Entry(
        "dglmc",
        module_path="fedhmc.algorithms.dglmc",
        settings=None,
        summary="DG-LMC: clients run Langevin steps on coupled copies, the server draws θ",
        euler=True,
        no_partial_reason="",
    )


BUILTIN: tuple[Entry, ...] = (
    Entry(
        "fahmc",
        **_FAHMC,
        summary="FA-HMC, the paper's Algorithm 3 (or the authors' protocol)",
    ),
    Entry(  # FA-HMC with K = 1, in every respect
        "fald", **_FAHMC, fixed_leapfrog_steps=1, summary="FA-LD: FA-HMC with K = 1"
    ),
    Entry(
        "fahmc-debiased",
        module_path="fedhmc.algorithms.debiased",
        settings=debiased_settings,
        summary="FA-HMC with a SCAFFOLD-style control variate (the paper's Algorithm B.2)",
        leapfrog=True,
        no_partial_reason=" (debiased FA-HMC needs every client's gradient at its anchor)",
        anchor=True,
    ),
    *(_pooled(method) for method in ("sghmc", "sgld")),
    *(_asynchronous(method) for method in ("sghmc", "sgld")),
    *(_qlsd(name, variant, summary) for name, variant, summary in _QLSD),
    Entry(
        "fsgld",
        module_path="fedhmc.algorithms.fsgld",
        settings=None,
        summary="FSGLD: one client a round, conducive gradients from Gaussian surrogates",
        euler=True,
        no_partial_reason="",  # (it draws one client a round: its module says so)
    ),
    _dglmc(),
)

PLUGIN_GROUP = "fedhmc.algorithms"
"""The entry-point group of samplers from other packages: each entry point names an
[`Entry`][fedhmc.algorithms.registry.Entry] (``my_sampler = "my_package.sampler:ENTRY"``).
A Flower simulation's workers find them too, as they find the package."""


PLUGIN_NAME = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")
"""What another package's sampler may be called: lowercase words joined by single hyphens."""


def _plugins(taken: set[str]) -> tuple[Entry, ...]:
    """The entries that installed packages declare under ``PLUGIN_GROUP``. One whose import
    fails (however: an exception, ``sys.exit``, a KeyboardInterrupt), that is not an Entry,
    whose name is not a sampler name or is already listed, is left out with one line on
    stderr, and the others still load."""
    from importlib.metadata import entry_points

    out = []
    for point in entry_points(group=PLUGIN_GROUP):
        try:
            e = point.load()
        except BaseException as exc:  # noqa: BLE001 - another package's failure: said, not fatal
            why = f"its import failed ({first_line(exc)})"
        else:
            why = _plugin_refusal(e, taken)
        if why is not None:
            print(f"fedhmc: sampler {point.value} not loaded: {why}", file=sys.stderr)
            continue
        taken.add(e.name)
        out.append(
            e if e.settings is None else dataclasses.replace(e, settings=_checked_settings(e))
        )
    return tuple(out)


def _plugin_refusal(e, taken: set[str]) -> str | None:
    if not isinstance(e, Entry):
        return f"it is a {type(e).__name__}, not an Entry"
    if not isinstance(e.name, str) or not PLUGIN_NAME.fullmatch(e.name):
        return (
            f"its name {e.name!r} is not a sampler name (lowercase letters and digits, "
            "words joined by single hyphens: my-sampler)"
        )
    if e.name in taken:
        return f"its name {e.name!r} is already listed"
    if not isinstance(e.module_path, str) or not (e.settings is None or callable(e.settings)):
        return "an Entry needs a module_path, and a settings(config) callable or None"
    if e.settings is None:
        return _declaration_refusal(e)
    return None


def _declaration_refusal(e: Entry) -> str | None:
    """Why a sampler that declares its options (``settings=None``) cannot be listed: its
    module does not import, has no Settings dataclass, or names an option as a run setting
    other than the shared sampler options."""
    try:
        cls = getattr(importlib.import_module(e.module_path), "Settings", None)
    except BaseException as exc:  # noqa: BLE001 - another package's failure: said, not fatal
        return f"its module {e.module_path} does not import ({first_line(exc)})"
    if not dataclasses.is_dataclass(cls):
        return f"its module {e.module_path} has no Settings dataclass"
    for f in dataclasses.fields(cls):
        if f.name in api.RESERVED:
            return f"its Settings field {f.name!r} is a name fedhmc keeps for a run setting"
    return None


def _checked_settings(e: Entry) -> Callable:
    """``e.settings``, whose failure or result of another kind is a one-line `ConfigError`
    naming the sampler (a `ConfigError` of its own, a refusal, passes as it is)."""
    build = e.settings

    def settings(cfg):
        try:
            got = build(cfg)
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(
                f"--algorithm {e.name}: its settings(config) failed ({first_line(exc)}); fix "
                f"or uninstall the package that provides {e.module_path}"
            ) from None
        if not dataclasses.is_dataclass(got) or isinstance(got, type):
            raise ConfigError(
                f"--algorithm {e.name}: its settings(config) returned a value of type "
                f"{type(got).__name__}, "
                f"not a Settings dataclass; fix the package that provides {e.module_path}"
            )
        return got

    return settings


ENTRIES: tuple[Entry, ...] = BUILTIN + _plugins({e.name for e in BUILTIN})
"""Every algorithm a run can name: fedhmc's own, then other packages' (``PLUGIN_GROUP``)."""

BY_NAME: dict[str, Entry] = {e.name: e for e in ENTRIES}
NAMES: tuple[str, ...] = tuple(BY_NAME)
"""``--algorithm``'s choices, in the order the help lists them."""
DEFAULT_ALGORITHM = NAMES[0]

UNKNOWN = Entry("", module_path=None, settings=None)
"""The facts of a name not listed: the config's choices check refuses it, and no check
before that one speaks for it (every fact off, both backends)."""


def entry(name: str) -> Entry:
    """The entry of ``name``; ``KeyError`` for a name not listed."""
    return BY_NAME[name]


def find(name) -> Entry:
    """The entry of ``name``, or [`UNKNOWN`][fedhmc.algorithms.registry.UNKNOWN] for any
    other value (a config not yet validated)."""
    return BY_NAME.get(name, UNKNOWN) if isinstance(name, str) else UNKNOWN


def algorithm_of(cfg):
    """(module, settings) of the algorithm that ``cfg`` (resolved) runs."""
    e = entry(cfg.algorithm)
    return e.module, e.build_settings(cfg)
