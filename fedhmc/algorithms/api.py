"""What a sampler declares, read by everything that runs it: its options and the names of
its messages' arrays.

A sampler's ``Settings`` dataclass is the one definition of each of its hyperparameters.
A field made with [`option`][fedhmc.algorithms.api.option] carries its help line, its
allowed values and the words of its refusal; from these fedhmc makes the ``fedhmc run`` and
``fedhmc sweep`` option, the Flower run-config key, the key a round's message carries it
under, its line in ``config.json`` and its row in the documentation's option tables::

    @dataclass(frozen=True)
    class Settings(api.Settings):
        step_size: float = api.option(1e-3, "γ, the Langevin step", low=0, low_open=True)
        friction: float = api.option(0.1, "B, the momentum's friction", low=0)

Samplers that declare an option of the same name (``--step-size``, ``--local-steps``) share
one option, whose help names what it means for each. A ``step_size`` left unset takes the
dataset's default step size (`Settings.with_defaults`). A field named like one of the run's
own settings that a sampler may read (``clients_per_round``, ``participation``: `SHARED`)
takes the run's value. A field without ``option`` metadata is set by the sampler's registry
entry (``fixed``) or keeps its default.

A federated sampler names the arrays of its round's message and replies in two tables,
``MESSAGE`` and ``REPLY`` (wire name → field of its ``Broadcast`` or ``ClientUpdate``),
and may give a reply array the bits it really takes (``REPLY_BITS``: wire name →
``bits(settings, dim, float_bits)`` per chain); the Flower wire, the reply check and the
``bytes_down``, ``bytes_up`` and ``bits_up`` columns read them.

Pure Python: no torch import (the run configuration reads the options before torch loads).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field

from fedhmc.errors import ConfigError

__all__ = [
    "KEPT",
    "MAX_STEP_SIZE",
    "RESERVED",
    "SHARED",
    "Option",
    "Settings",
    "build",
    "from_wire",
    "option",
    "options",
    "to_wire",
]

KEPT = "kept/"
"""The prefix of the arrays that carry what a client keeps between rounds (its sampler's
``client_keeps``) between a Flower node's state and the client's computation: in a
message's arrays (what it kept of its last round) and in the reply's (what it keeps of
this one, stored in the node's state and never sent)."""

SHARED = ("clients_per_round", "participation")
"""The run's own settings that a sampler's Settings field of the same name reads: who takes
part in a round (``--clients-per-round`` and ``--participation`` are the run's, and a
sampler that lacks the field refuses them)."""

MAX_STEP_SIZE = 1e15
"""The largest ``--step-size`` (η²/2 and 2γ stay finite floats)."""

RESERVED = (
    "round",
    "round_seed",
    "num_examples_total",
    "chains",
    "algorithm",
    "data_sha256",
    "batch_size",
    "prior_std",
    "minibatch",
    "compile",
    "round_clients",
    "method",
)
"""Names a sampler's own option may not take: the keys a round's message carries besides
the sampler's settings, and the run's data settings."""


@dataclass(frozen=True)
class Option:
    """One option of a sampler, as its Settings field declares it.

    Attributes
    ----------
    name
        The field's name (``quantization_levels``); the option is ``--quantization-levels``.
    type
        ``int``, ``float``, ``str`` or ``bool`` (from the field's annotation).
    default
        The field's default.
    help
        One line for ``--help`` and the documentation.
    low, high
        The allowed range (None: unbounded); ``low_open``/``high_open`` exclude the bound.
    choices
        The allowed values of a ``str`` option (empty: any).
    infinite
        A ``float`` option that may be ``inf``.
    """

    name: str
    type: type
    default: typing.Any
    help: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] = ()
    infinite: bool = False

    @property
    def flag(self) -> str:
        """``--quantization-levels``."""
        return "--" + self.name.replace("_", "-")

    @property
    def key(self) -> str:
        """The run-config and message key: ``quantization-levels``."""
        return self.name.replace("_", "-")

    def rule(self) -> str:
        """What a value must be, in words: "a number > 0", "an integer ≥ 1 or inf"."""
        if self.choices:
            return "one of " + ", ".join(self.choices)
        what = {int: "an integer", float: "a number", bool: "true or false", str: "a word"}
        out = what[self.type]
        bounds = []
        if self.low is not None:
            bounds.append(f"{'>' if self.low_open else '≥'} {self.low:g}")
        if self.high is not None:
            bounds.append(f"{'<' if self.high_open else '≤'} {self.high:g}")
        if bounds:
            out += " " + " and ".join(bounds)
        return out + (" or inf" if self.infinite else "")

    def refusal(self, value) -> str | None:
        """Why ``value`` is not allowed, in one line, or None."""
        bad = f"{self.flag} must be {self.rule()}, got {value!r}"
        if value is None and self.default is None:  # unset where unset is allowed
            return None
        if self.type is bool:
            return None if isinstance(value, bool) else bad
        if self.type is str:
            ok = isinstance(value, str) and (not self.choices or value in self.choices)
            return None if ok else bad
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return bad
        if self.type is int and not (isinstance(value, int) or self._infinite(value)):
            return bad
        if math.isnan(value) or (math.isinf(value) and not self._infinite(value)):
            return bad
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return bad
        if self.high is not None and not self._infinite(value):
            if value > self.high or (self.high_open and value == self.high):
                return bad
        return None

    def _infinite(self, value) -> bool:
        return self.infinite and isinstance(value, float) and value == math.inf

    def parse(self, text):
        """A command-line or run-config value as this option's type (``inf`` for an
        infinite one); a value of the right type passes as it is."""
        if not isinstance(text, str):
            return float(text) if self.type is float and isinstance(text, int) else text
        word = text.strip().lower()
        if self.type is bool:
            if word in ("true", "1", "yes", "on"):
                return True
            if word in ("false", "0", "no", "off"):
                return False
            raise ConfigError(f"{self.flag} must be true or false, got {text!r}")
        if self.type is str:
            return text
        if self.infinite and word in ("inf", "infinity"):
            return math.inf
        try:
            return self.type(text) if self.type is int else float(text)
        except ValueError:
            raise ConfigError(f"{self.flag} must be {self.rule()}, got {text!r}") from None


def option(
    default,
    help: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    choices: tuple[str, ...] = (),
    infinite: bool = False,
):
    """A Settings field that is an option of the sampler: its ``default``, one ``help``
    line, and what values it allows (a range, a list of words, ``inf``). The refusal of a
    value outside them names the option and the rule: "--quantization-levels must be an
    integer ≥ 1 or inf, got 0"."""
    spec = dict(
        help=help,
        low=low,
        high=high,
        low_open=low_open,
        high_open=high_open,
        choices=tuple(choices),
        infinite=infinite,
    )
    return field(default=default, metadata={"fedhmc_option": spec})


def options(settings_class) -> tuple[Option, ...]:
    """The options a Settings class declares, in field order (``()`` for a class without
    `option` fields, or that is not a dataclass)."""
    if not dataclasses.is_dataclass(settings_class):
        return ()
    hints = typing.get_type_hints(settings_class)
    out = []
    for f in dataclasses.fields(settings_class):
        spec = f.metadata.get("fedhmc_option")
        if spec is None:
            continue
        kind = _base_type(hints[f.name])
        out.append(Option(f.name, kind, f.default, **spec))
    return tuple(out)


def _base_type(hint) -> type:
    """``int`` of ``int | None``; the type of a plain annotation."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


class Settings:
    """A base of a sampler's Settings dataclass: each `option` field's value is checked
    when the settings are made, then the class's own ``check`` (None or the one-line reason
    the values cannot run together). A refusal is a `ConfigError`."""

    def __post_init__(self):
        for opt in options(type(self)):
            why = opt.refusal(getattr(self, opt.name))
            if why is not None:
                raise ConfigError(why)
        step = getattr(self, "step_size", None)
        if isinstance(step, (int, float)) and step > MAX_STEP_SIZE:
            raise ConfigError(
                f"--step-size {step} is too large (at most {MAX_STEP_SIZE:g}, so that η²/2 "
                "stays a finite float); step sizes that sample are small: try 1e-3, or leave "
                "it to the dataset's default"
            )
        why = self.check()
        if why is not None:
            raise ConfigError(why)

    def check(self) -> str | None:
        """Why these values cannot run together, or None (a sampler overrides it)."""
        return None

    LANGEVIN_STEP: typing.ClassVar[bool] = False
    """Whether a ``step_size`` left unset is a Langevin step γ = η²/2 (FA-LD's learning
    rate, from the dataset's default η) rather than η itself."""

    def with_defaults(self, step_size: float):
        """These settings with what the run fills in where it is unset: a ``step_size``
        of None becomes the dataset's default η (``step_size``), or η²/2 where
        ``LANGEVIN_STEP``. A sampler may override it to derive more."""
        if getattr(self, "step_size", 0) is not None:
            return self
        step = step_size**2 / 2 if self.LANGEVIN_STEP else step_size
        return dataclasses.replace(self, step_size=float(step))


def build(settings_class, values: Mapping[str, typing.Any] | typing.Any, fixed=()):
    """The sampler's settings from a run's values: ``values`` is a mapping of field names,
    or a resolved run config whose attribute or ``option(name)`` holds each field. A field
    the values lack, or give as None, keeps its default; ``fixed`` (pairs, the registry
    entry's) sets the fields its name fixes."""
    got = {}
    fixed = dict(fixed)
    for f in dataclasses.fields(settings_class):
        if f.name in fixed:
            got[f.name] = fixed[f.name]
            continue
        value = _value(values, f.name)
        if value is not None:
            got[f.name] = value
    return settings_class(**got)


def _value(values, name: str):
    if isinstance(values, Mapping):
        return values.get(name)
    if name in getattr(type(values), "__dataclass_fields__", {}):
        return getattr(values, name)
    lookup = getattr(values, "option", None)
    return lookup(name) if callable(lookup) else getattr(values, name, None)


def to_wire(settings) -> dict:
    """Every field of ``settings`` as a round's message carries it: kebab-case keys, Python
    scalars; a field that is None is left out (it reads back as its default)."""
    return {
        f.name.replace("_", "-"): getattr(settings, f.name)
        for f in dataclasses.fields(settings)
        if getattr(settings, f.name) is not None
    }


def from_wire(settings_class, message: Mapping):
    """The settings a round's message carries (`to_wire`'s keys); a field it lacks keeps
    its default. A float field sent as an integer reads back as a float."""
    hints = typing.get_type_hints(settings_class)
    got = {}
    for f in dataclasses.fields(settings_class):
        key = f.name.replace("_", "-")
        if key not in message:
            continue
        value = message[key]
        if _base_type(hints[f.name]) is float and isinstance(value, int):
            value = float(value)
        got[f.name] = value
    return settings_class(**got)
