"""The algorithms a run can name, listed once: the only place that maps ``--algorithm NAME``
to its module, its kind and the backends it runs on.

An [`Entry`][fedhmc.algorithms.registry.Entry] is small: what follows from the sampler's
module (its options, leapfrog steps or not, partial participation, what its messages carry)
is read from the module, not restated here. Everything else (the config's choices and
checks, the engine, the wire format, the Flower server and clients) reads an entry's facts
instead of comparing names. ``fald`` is FA-HMC with K = 1: the same module, with its
leapfrog steps fixed.

Pure PyTorch: no Flower import.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import sys
import typing
from dataclasses import dataclass
from types import ModuleType

from fedhmc.algorithms import api
from fedhmc.errors import ConfigError, first_line

ENGINE, FLOWER = "engine", "flower"
ALGORITHM3, AUTHORS = "algorithm3", "authors"
FEDERATED, POOLED, ASYNCHRONOUS = "federated", "pooled", "asynchronous"
SAMPLER_KINDS = (FEDERATED, POOLED, ASYNCHRONOUS)

WORKERS_ANSWER = " (its workers answer when they can, not when drawn)"
ON_POOLED_DATA = " (it samples the pooled data: there are no clients to draw)"


@dataclass(frozen=True)
class Entry:
    """One algorithm.

    Attributes
    ----------
    name
        ``--algorithm NAME``.
    module_path
        The module with the sampler's ``Settings`` (its options: `fedhmc.algorithms.api`)
        and ``init(position, settings)`` and ``step(seed, state, target, settings)`` (the
        asynchronous samplers: their chain's state machine); a federated one has the
        functions `fedhmc.algorithms.federated` composes.
    summary
        What it is, in a few words (the documentation's table of samplers).
    kind
        ``federated`` (clients of their own data exchange messages in rounds), ``pooled``
        (one sampler on the pooled data) or ``asynchronous`` (workers answer a server when
        they can, not in rounds).
    backends
        The ``--backend`` values it runs on.
    fixed
        Settings fields that the name fixes, as (field, value) pairs (``fald``: K = 1).

    What the module declares is read from it: ``PROTOCOLS`` (the protocols it runs under;
    default: the paper's Algorithm 3) and ``NO_PARTIAL_REASON`` (why it draws no subset of
    clients a round, in the words of the refusal).
    """

    name: str
    module_path: str | None
    summary: str = ""
    kind: str = FEDERATED
    backends: tuple[str, ...] = (ENGINE, FLOWER)
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

    # ------------------------------------------------------------ the kind
    @property
    def federated(self) -> bool:
        return self.kind == FEDERATED

    @property
    def asynchronous(self) -> bool:
        return self.kind == ASYNCHRONOUS

    # ----------------------------------------------- read from the module
    @property
    def settings_class(self) -> type | None:
        """The module's ``Settings`` class (None for a name not listed)."""
        return None if self.module_path is None else self.module.Settings

    @property
    def field_names(self) -> tuple[str, ...]:
        """The fields of the sampler's Settings."""
        cls = self.settings_class
        return () if cls is None else tuple(f.name for f in dataclasses.fields(cls))

    @property
    def options(self) -> tuple[api.Option, ...]:
        """The options the sampler declares, without the fields its name fixes."""
        fixed = dict(self.fixed)
        return tuple(o for o in api.options(self.settings_class) if o.name not in fixed)

    @property
    def own(self) -> tuple[str, ...]:
        """The names a run may give for this sampler: its options, and the run's settings
        that its Settings read (`fedhmc.algorithms.api.SHARED`), without those its name
        fixes."""
        fixed = dict(self.fixed)
        names = [o.name for o in self.options]
        names += [n for n in api.SHARED if n in self.field_names and n not in fixed]
        return tuple(dict.fromkeys(names))

    @property
    def leapfrog(self) -> bool:
        """K leapfrog steps of size η, and ρ (FA-HMC's family)."""
        return "leapfrog_steps" in self.field_names

    @property
    def partial_participation(self) -> bool:
        """``--clients-per-round`` (and, where the Settings read it, ``--participation``)
        apply."""
        return "clients_per_round" in self.own

    @property
    def trajectory_options(self) -> bool:
        """``--sync-unit leapfrog``, ``--fresh-gradients`` and ``--restart-trajectories``."""
        return "sync_unit" in self.own

    @property
    def protocols(self) -> tuple[str, ...]:
        """The ``--protocol`` values it runs under (the module's ``PROTOCOLS``)."""
        if self.module_path is None:
            return (ALGORITHM3,)
        return tuple(getattr(self.module, "PROTOCOLS", (ALGORITHM3,)))

    @property
    def no_partial_reason(self) -> str:
        """Why ``--clients-per-round`` does not apply, in the refusal's words."""
        if self.asynchronous:
            return WORKERS_ANSWER
        if self.kind == POOLED:
            return ON_POOLED_DATA
        if self.module_path is None:
            return ""
        return str(getattr(self.module, "NO_PARTIAL_REASON", ""))

    @property
    def step_symbol(self) -> str:
        """The symbol of ``--step-size`` (sweep cell ids): the Settings' ``STEP_SYMBOL``
        (``eta``: FA-HMC's leapfrog step; ``h``: an Euler step; else ``step``)."""
        cls = self.settings_class
        return str(getattr(cls, "STEP_SYMBOL", "step")) if cls is not None else "step"

    def fixed_value(self, name: str, default=None):
        """The value the name fixes for the Settings field ``name`` (``default``: none)."""
        return dict(self.fixed).get(name, default)

    def build_settings(self, cfg):
        """The sampler's settings from a resolved run config (or a mapping of field
        names): `fedhmc.algorithms.api.build` with the fields the name fixes. Another
        package's Settings that fail otherwise than by a refusal are a one-line
        `ConfigError` naming it."""
        try:
            return api.build(self.settings_class, cfg, self.fixed)
        except ConfigError:
            raise
        except Exception as e:
            if self.module_path.startswith("fedhmc."):
                raise
            raise ConfigError(
                f"--algorithm {self.name}: its Settings failed ({first_line(e)}); fix or "
                f"uninstall the package that provides {self.module_path}"
            ) from None


def _pooled(method: str) -> Entry:
    """The stale-gradient sampler ``method`` (``sghmc``: with momentum) on the pooled data."""
    return Entry(
        method,
        module_path="fedhmc.algorithms.stale",
        summary=f"{method.upper()} with stale gradients, on the pooled data",
        kind=POOLED,
        backends=(ENGINE,),
        fixed=_euler_fixed(method),
    )


def _asynchronous(method: str) -> Entry:
    """The asynchronous distributed sampler ``method`` (``sghmc``: with momentum)."""
    return Entry(
        f"async-{method}",
        module_path="fedhmc.algorithms.async_sgmcmc",
        summary=f"asynchronous distributed {method.upper()}: workers send gradients when ready",
        kind=ASYNCHRONOUS,
        backends=(FLOWER,),
        fixed=_euler_fixed(method),
    )


def _euler_fixed(method: str) -> tuple[tuple[str, typing.Any], ...]:
    """SGHMC's or SGLD's fixed fields: the method, and SGLD's friction 0 (it has none)."""
    return (("method", method),) + ((("friction", 0.0),) if method == "sgld" else ())


_QLSD = (
    ("qlsd", "plain", "QLSD: clients send quantised gradients, the server takes the Langevin step"),
    ("qlsd-star", "star", "QLSD*: QLSD with a control variate at a reference set before round 1"),
    ("qlsd-pp", "pp", "QLSD++: QLSD with a refreshed control variate and a memory"),
)


def _qlsd(name: str, variant: str, summary: str) -> Entry:
    """QLSD's variant ``variant`` (``fedhmc.algorithms.qlsd``)."""
    fixed = (("variant", variant),)
    if variant != "pp":
        fixed += (("reference_refresh", 10),)
    if variant != "star":
        fixed += (("mode_steps", 0),)
    return Entry(name, module_path="fedhmc.algorithms.qlsd", summary=summary, fixed=fixed)


DEBIASED_FIXED = (
    ("sync_unit", "iteration"),
    ("fresh_gradients", False),
    ("restart_trajectories", False),
    ("clients_per_round", None),
    ("participation", "normalized"),
)
"""What debiased FA-HMC fixes of FA-HMC's settings: Algorithm 3's rounds, every client."""

BUILTIN: tuple[Entry, ...] = (
    Entry(
        "fahmc",
        "fedhmc.algorithms.fahmc",
        summary="FA-HMC, the paper's Algorithm 3 (or the authors' protocol)",
    ),
    Entry(
        "fald",
        "fedhmc.algorithms.fahmc",
        summary="FA-LD: FA-HMC with K = 1",
        fixed=(("leapfrog_steps", 1),),
    ),
    Entry(
        "fahmc-debiased",
        "fedhmc.algorithms.debiased",
        summary="FA-HMC with a SCAFFOLD-style control variate (the paper's Algorithm B.2)",
        fixed=DEBIASED_FIXED,
    ),
    *(_pooled(method) for method in ("sghmc", "sgld")),
    *(_asynchronous(method) for method in ("sghmc", "sgld")),
    *(_qlsd(name, variant, summary) for name, variant, summary in _QLSD),
    Entry(
        "fsgld",
        "fedhmc.algorithms.fsgld",
        summary="FSGLD: one client a round, conducive gradients from Gaussian surrogates",
    ),
    Entry(
        "dglmc",
        "fedhmc.algorithms.dglmc",
        summary="DG-LMC: clients run Langevin steps on coupled copies, the server draws θ",
    ),
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
        out.append(e)
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
    if not isinstance(e.module_path, str):
        return "an Entry needs a module_path"
    if e.kind not in SAMPLER_KINDS:
        return f"its kind {e.kind!r} is not one of {', '.join(SAMPLER_KINDS)}"
    if not set(e.backends) <= {ENGINE, FLOWER} or not e.backends:
        return f"its backends {e.backends!r} are not among {ENGINE}, {FLOWER}"
    return _declaration_refusal(e)


def _declaration_refusal(e: Entry) -> str | None:
    """Why a sampler's module cannot be listed: it does not import, has no Settings
    dataclass, or names a field like a run setting that a sampler may not declare."""
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


ENTRIES: tuple[Entry, ...] = BUILTIN + _plugins({e.name for e in BUILTIN})
"""Every algorithm a run can name: fedhmc's own, then other packages' (``PLUGIN_GROUP``)."""

BY_NAME: dict[str, Entry] = {e.name: e for e in ENTRIES}
NAMES: tuple[str, ...] = tuple(BY_NAME)
"""``--algorithm``'s choices, in the order the help lists them."""
DEFAULT_ALGORITHM = NAMES[0]

UNKNOWN = Entry("", module_path=None)
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
