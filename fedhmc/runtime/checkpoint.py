"""Checkpoints of a run: everything it needs to continue, written atomically.

A run directory holds ``checkpoint.pt`` (the newest) and ``checkpoint.prev.pt`` (the one
before). Each file is one JSON header line (format, package version, round, the payload's
length and SHA-256) followed by the payload, a ``torch.save`` of plain data: tensors,
numbers, strings, lists and dicts. The write goes to a temporary file that is flushed and
fsync'ed, the previous checkpoint is renamed to ``checkpoint.prev.pt``, and the new one is
renamed into place. A ``kill -9`` at any moment therefore leaves at least one complete
checkpoint. A truncated or corrupted file fails its checksum, and `load` falls back
to the previous one.

A checkpoint does not depend on the device that wrote it: `save` moves every tensor to the
CPU (in dicts, lists and algorithm States alike) and `load` maps every tensor to the CPU, so
a run started on a GPU resumes on a CPU and the other way (`to_device` moves what was loaded
onto the run's device). ``--device`` is the one setting besides ``--rounds`` that a resume
may change.

A run's payload (format 4; `fedhmc.runtime.loop.run_loop` writes it) holds ``round``,
``config``, ``device``, ``grad_evals``, ``wall_s``, ``totals`` (the byte and client counts),
``keep_draws``, ``draws`` and ``samples`` (the collected θ̄, or None), ``evaluator`` (its
running averages), ``backend``: the backend's own state (for the engine, the algorithm's
State, θ̄ included), or None where the backend cannot be resumed, and ``metrics``: what
``metrics.csv`` held at that round (its columns, number of rows, and the length and SHA-256
of its bytes), which a resume checks the file against
([`check_metrics_file`][fedhmc.runtime.output.check_metrics_file]). A checkpoint of another
format is refused in one line that names the fedhmc version that wrote it
(`OtherFormat`).

Nothing random needs saving: every random number fedhmc draws is a function of the run seed, the
round and counters ([`fedhmc.core.rng`][fedhmc.core.rng]), so the state is the positions, the
carried momenta, the streaming accumulators and the round reached.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Collection
from pathlib import Path

import torch

from fedhmc import __version__
from fedhmc.errors import ConfigError, loads_json

FORMAT = 4
"""The format `save` writes and the only one `load` and `peek` read."""
NAME = "checkpoint.pt"
PREVIOUS = "checkpoint.prev.pt"


def to_cpu(obj):
    """``obj`` with every tensor detached and on the CPU: dicts, lists and tuples are walked,
    and an algorithm's State (a dataclass) becomes its `state_dict`."""
    import dataclasses

    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return state_dict(obj)
    return obj


def to_device(obj, device):
    """``obj`` (as `load` returned it) with every tensor in its dicts, lists and tuples
    moved to ``device`` (dtypes kept)."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(v, device) for v in obj)
    return obj


def device_name(device) -> str:
    """A device as checkpoints and notes name it: ``cuda`` is ``cuda:0``, ``cpu`` stays."""
    dev = torch.device(device)
    if dev.type != "cpu" and dev.index is None:
        dev = torch.device(dev.type, 0)
    return str(dev)


def save(run_dir: str | os.PathLike, state: dict) -> Path:
    """Write ``state`` (plain data and tensors) as the run's newest checkpoint, every tensor
    moved to the CPU first. The file is readable by its owner alone (mode 0600, whatever
    the umask): a checkpoint holds the run's positions and draws, which may reveal its
    data. A symbolic link in the folder's place of a checkpoint is refused, never followed."""
    from fedhmc.runtime.output import open_private, refuse_links

    run_dir = Path(run_dir)
    refuse_links(run_dir, (NAME, PREVIOUS, NAME + ".tmp"))
    buf = io.BytesIO()
    torch.save(to_cpu(state), buf)
    payload = buf.getvalue()
    header = {
        "format": FORMAT,
        "version": __version__,
        "round": int(state.get("round", 0)),
        "bytes": len(payload),
        "sha256": hashlib.sha256(payload).hexdigest(),
    }
    for key in ("config", "metrics"):  # read alone by `peek`, before a resume
        if isinstance(state.get(key), dict):
            header[key] = state[key]
    tmp = run_dir / (NAME + ".tmp")
    try:
        with open_private(tmp) as f:
            f.write(json.dumps(header, default=str).encode() + b"\n")
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:  # (a full disk): the last checkpoint stays, no temporary file
        tmp.unlink(missing_ok=True)
        raise
    path = run_dir / NAME
    if path.exists():
        os.replace(path, run_dir / PREVIOUS)
    os.replace(tmp, path)
    try:  # make the renames durable
        fd = os.open(run_dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:  # pragma: no cover - some filesystems refuse fsync on a directory
        pass
    return path


HEADER_FIELDS = {"format": int, "version": str, "round": int, "bytes": int, "sha256": str}
"""The header's fields and their JSON types (``config``, a dict, is optional)."""


def _header(line: bytes) -> dict:
    """A checkpoint's first line as its header, or ValueError naming what is wrong."""
    try:
        header = loads_json(line)
    except (ValueError, UnicodeDecodeError):
        raise ValueError("its first line is not a JSON header") from None
    if not isinstance(header, dict):
        raise ValueError(
            f"its header is a JSON {type(header).__name__}, not the object fedhmc writes"
        )
    fmt, version = header.get("format"), header.get("version")
    if type(fmt) is int and fmt != FORMAT and isinstance(version, str):
        raise OtherFormat(fmt, version)  # whatever else its header holds
    for key, kind in HEADER_FIELDS.items():
        value = header.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(
                f"its header's {key!r} is {value!r}, not the {kind.__name__} fedhmc writes"
            )
    if header["bytes"] < 0 or header["round"] < 0:
        raise ValueError(f"its header's byte count or round is negative ({header['bytes']}, "
                         f"{header['round']}), not what fedhmc writes")  # fmt: skip
    if "config" in header and not isinstance(header["config"], dict):
        raise ValueError("its header's 'config' is not an object")
    return header


class OtherFormat(ValueError):
    """A checkpoint of another format than `FORMAT`: written by another fedhmc version,
    which alone continues it."""

    def __init__(self, format_: int, version: str):
        self.format, self.version = format_, version
        super().__init__(f"format {format_}, written by fedhmc {version[:40]}")

    def refusal(self, run_dir) -> ConfigError:
        """The one-line refusal of the run in ``run_dir``: what wrote its checkpoint, and
        what to do."""
        return ConfigError(
            f"{run_dir}'s checkpoint was written by fedhmc {self.version[:40]} (checkpoint "
            f"format {self.format}), and fedhmc {__version__} reads format {FORMAT} only; "
            f"start the run again (--overwrite), or use fedhmc {self.version[:40]}"
        )


PAYLOAD_FIELDS = {
    "round": (int,),
    "backend": (dict, type(None)),
    "evaluator": (dict,),
    "totals": (dict,),
    "grad_evals": (int,),
    "wall_s": (int, float),
    "device": (str,),
    "keep_draws": (bool,),
    "draws": (torch.Tensor, type(None)),
    "samples": (torch.Tensor, type(None)),
    "metrics": (dict,),
}
"""The fields of a run's checkpoint payload, and their types: it is under the checksum,
but a forged file can carry a valid one (`check_run_payload`)."""


def check_run_payload(state: dict) -> None:
    """ValueError naming the first field of a run's checkpoint payload that is missing or
    not of the type fedhmc writes."""
    for key, kinds in PAYLOAD_FIELDS.items():
        value = state.get(key)
        if (
            key not in state
            or not isinstance(value, kinds)
            or (isinstance(value, bool) and bool not in kinds)
        ):
            shown = "missing" if key not in state else f"a {type(value).__name__}"
            want = " or ".join(k.__name__ for k in kinds)
            raise ValueError(f"its {key!r} is {shown}, not the {want} fedhmc writes")
    if state["round"] < 0 or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in state["totals"].values()
    ):
        raise ValueError("its round or totals are not the counts fedhmc writes")
    draws = state.get("draws")
    if draws is not None and (draws.dim() != 3 or not draws.is_floating_point()):
        raise ValueError(f"its draws have shape {tuple(draws.shape)}, not (draws, chains, d)")


def _open_checkpoint(path: Path):
    """``path`` opened for reading without following a symbolic link."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    return os.fdopen(fd, "rb")


def _read(path: Path) -> dict:
    with _open_checkpoint(path) as f:
        header = _header(f.readline())
        payload = f.read()
    if len(payload) != header["bytes"]:
        raise ValueError(f"truncated ({len(payload)} of {header['bytes']} bytes)")
    if hashlib.sha256(payload).hexdigest() != header["sha256"]:
        raise ValueError("checksum mismatch")
    state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"it holds a {type(state).__name__}, not the dict fedhmc saves")
    state["_header"] = header
    state["_file"] = path.name
    return state


def peek(run_dir: str | os.PathLike) -> dict | None:
    """The header of the newest checkpoint of ``run_dir`` whose first line is one (its
    payload unread and unchecked: `load` checks it), or None. A header holds ``round``,
    ``version``, the run's ``config`` and what its ``metrics.csv`` held (``metrics``): what a
    resume is checked against before the run starts (and again, from the checked payload,
    when it starts).

    Raises
    ------
    ConfigError
        When the newest such checkpoint is of another format (`OtherFormat`)."""
    from fedhmc.runtime.output import refuse_links

    run_dir = Path(run_dir)
    refuse_links(run_dir, (NAME, PREVIOUS))
    for name in (NAME, PREVIOUS):
        try:
            with _open_checkpoint(run_dir / name) as f:
                return _header(f.readline())
        except OtherFormat as e:
            raise e.refusal(run_dir) from None
        except (OSError, ValueError):
            continue
    return None


def load(run_dir: str | os.PathLike) -> tuple[dict, list[str]]:
    """The newest valid checkpoint of ``run_dir`` and the problems met on the way.

    Raises
    ------
    ConfigError
        When the directory holds no readable checkpoint, or its newest one is of another
        format (`OtherFormat`).
    """
    import pickle

    from fedhmc.runtime.output import refuse_links

    run_dir = Path(run_dir)
    refuse_links(run_dir, (NAME, PREVIOUS))
    problems = []
    for name in (NAME, PREVIOUS):
        path = run_dir / name
        if not path.exists():
            continue
        try:
            return _read(path), problems
        except OtherFormat as e:
            raise e.refusal(run_dir) from None
        except (OSError, ValueError, RuntimeError, KeyError, EOFError, pickle.PickleError) as e:
            problems.append(f"{name} is unusable ({e})")
    why = "; ".join(problems) if problems else "no checkpoint.pt"
    raise ConfigError(
        f"cannot resume from {str(run_dir)!r}: {why}; run it again without --resume "
        "(add --overwrite to replace it)"
    )


# Settings that may differ between a checkpoint and the run that continues it. The device
# may change (a run started on a GPU resumes on a CPU): the checkpoint holds CPU tensors.
# Like the device, CUDA graphs and --compile change only how a run computes (at most its
# float rounding), not what.
RESUMABLE_CHANGES = frozenset(
    {
        "rounds",
        "out",
        "resume",
        "overwrite",
        "checkpoint_every",
        "device",
        "client_gpus",
        "cuda_graphs",
        "compile",
    }
)


PICKLED_DATASETS = ("cifar2",)
"""The datasets whose files are Python pickles (CIFAR-10's batches): reading them from a
folder runs whatever code the files hold."""


def _named_code(saved: dict) -> tuple[str | None, str | None]:
    """The code that a run's settings (a config.json) name and only the command line may
    name on a resume: the user's own model spec (None: a built-in model, none, or one given
    in Python) and the ``--data-dir`` of pickled data (None: none)."""
    from fedhmc.runtime.config import IN_MEMORY, MODELS

    model = saved.get("model")
    model = model if isinstance(model, str) or model is None else repr(model)
    if model in MODELS or saved.get("dataset") == IN_MEMORY or str(model).startswith("<in-"):
        model = None
    data_dir = saved.get("data_dir")
    pickled = saved.get("dataset") in PICKLED_DATASETS and data_dir
    return model, str(data_dir) if pickled else None


def resume_flags(saved: dict) -> str:
    """What ``fedhmc run --resume DIR`` needs besides DIR to continue the run of ``saved``
    (its settings, as config.json holds them), with a leading space: ``--model`` of the
    user's own model and the ``--data-dir`` of pickled data (`refuse_named_code`)."""
    import shlex

    model, data_dir = _named_code(saved)
    flags = [f" --model {shlex.quote(model)}"] if model else []
    return "".join(flags + ([f" --data-dir {shlex.quote(data_dir)}"] if data_dir else []))


def resume_command(out, saved: dict) -> str:
    """``fedhmc run --resume OUT`` with the flags the run of ``saved`` needs
    (`resume_flags`)."""
    return f"fedhmc run --resume {out}{resume_flags(saved)}"


def refuse_named_code(run_dir, saved: dict, given: dict) -> None:
    """Refuse, in one line and before anything is imported, a resume of ``run_dir`` whose
    folder (``saved``: its config.json) names code that only the command line may name.

    A run folder is something people send each other, so it never decides what runs: a run
    recorded with the user's own model (``PACKAGE.MODULE:FACTORY``) needs ``--model`` again,
    equal to the recorded spec (``given``: the options of this invocation), and a run on a
    dataset read from pickles (``PICKLED_DATASETS``) out of a recorded ``--data-dir`` needs
    that ``--data-dir`` again. A ``--model`` given that is not the run's is refused here too,
    before it is imported. A run whose data was given in memory is left to the resolution,
    which says that it resumes from Python only."""
    from fedhmc.runtime.config import IN_MEMORY

    if saved.get("dataset") == IN_MEMORY:
        return
    recorded = saved.get("model")  # None: the run had no model (a closed-form target)
    model, data_dir = _named_code(saved)
    if "model" in given and recorded is not None and given["model"] != recorded:
        raise ConfigError(
            f"cannot resume {run_dir}: --model {given['model']} is not the run's model "
            f"({str(recorded)[:80]}); drop --model, or give the run's own"
        )
    if model is not None and "model" not in given:
        raise ConfigError(
            f"cannot resume {run_dir}: its run used your own model {model[:80]}, and fedhmc "
            "imports no code that a run folder names; if you trust that code, name it "
            f"again: --model {model[:80]}"
        )
    if data_dir is not None and given.get("data_dir") != data_dir:
        raise ConfigError(
            f"cannot resume {run_dir}: its {saved['dataset']} files are Python pickles, which "
            f"run code when read, from the --data-dir {data_dir[:80]} that its folder "
            f"names; if you trust them, give --data-dir {data_dir[:80]} again"
        )


def check_resumable(
    saved_config: dict, reached: int, version: str, cfg, given: Collection[str] = ()
) -> None:
    """Refuse, in one line, to continue the checkpoint of ``saved_config`` (which reached
    round ``reached``, written by fedhmc ``version``) as the run ``cfg``. Both sides are
    compared as ``config.json`` records them: a setting that played no part (the MLP's
    widths of a CNN run) is None on both, whatever value it was given."""
    import json

    from fedhmc.runtime.config import recorded_settings

    def plain(config: dict) -> dict:
        return json.loads(json.dumps(config, default=str))

    saved = {**recorded_settings(plain(saved_config)), "_round_reached": int(reached)}
    check_compatible(saved, plain(cfg.recorded()), version, given=set(given))


def check_compatible(
    saved: dict, config: dict, version: str, given: Collection[str] | None = None
) -> None:
    """Refuse to continue a checkpoint under another configuration or package version.

    ``given`` names the settings the user gave for this resume (RunConfig field names, as
    ``fedhmc run --resume DIR --rounds 20`` gives ``rounds``); a refused setting that was
    given is to be dropped, one that was not is the folder's own (its config.json differs
    from its checkpoint). None: not known (the Python API), and the refusal says neither.
    """
    if version != __version__:
        raise ConfigError(
            f"the checkpoint was written by fedhmc {version}, this is {__version__}; "
            "continue it with that version, or start the run again"
        )
    import dataclasses

    from fedhmc.runtime.config import RunConfig

    # In the options' order (--dataset before the --dim it implies), then any others.
    order = {f.name: i for i, f in enumerate(dataclasses.fields(RunConfig))}
    for key in sorted(set(saved) | set(config), key=lambda k: (order.get(k, len(order)), k)):
        if key in RESUMABLE_CHANGES or key.startswith("_"):
            continue
        a, b = saved.get(key), config.get(key)
        if a != b and not (_nan(a) and _nan(b)):
            flag = "--" + key.replace("_", "-")
            if given is not None and key not in given:
                raise ConfigError(
                    f"cannot resume: the run's folder holds another {flag} in its checkpoint "
                    f"({a!r}) than in its config.json ({b!r}); restore its config.json, or "
                    "start a new run (--overwrite)"
                )
            fix = (
                f"drop {flag} (only --rounds and --device may change) or start a new run"
                if given is not None
                else "only the rounds and the device may change; start a new run instead"
            )
            raise ConfigError(
                f"cannot resume: {flag} was {a!r} in the checkpoint and is {b!r} now; {fix}"
            )
    if int(config["rounds"]) < int(saved.get("_round_reached", 0)):
        raise ConfigError(
            f"cannot resume: the run already reached round {saved['_round_reached']}, "
            f"more than --rounds {config['rounds']}"
        )


def _nan(x) -> bool:
    return isinstance(x, float) and x != x


def state_dict(state) -> dict:
    """An algorithm's State (a dataclass) as plain data: its class and its fields, tensors
    on the CPU. Any State round-trips through ``state_from_dict``."""
    import dataclasses

    cls = type(state)
    return {
        "type": f"{cls.__module__}.{cls.__qualname__}",
        "fields": {f.name: to_cpu(getattr(state, f.name)) for f in dataclasses.fields(state)},
    }


def state_from_dict(saved: dict, cls: type, device=None):
    """The ``cls`` State that ``state_dict`` saved, its tensors on ``device`` (None: where
    they are; `load` puts them on the CPU).

    The types of nested states come from ``cls``'s declared fields, never from the file:
    a checkpoint that names any other type is refused in one line, and nothing it names is
    imported.
    """
    import dataclasses
    import typing

    name = _type_name(cls)
    if not isinstance(saved, dict) or saved.get("type") != name:
        got = saved.get("type") if isinstance(saved, dict) else type(saved).__name__
        raise ConfigError(
            f"cannot resume: the checkpoint holds a {str(got)[:80]!r} state, this run needs "
            f"{name}; start the run again with --overwrite"
        )
    fields = saved.get("fields")
    declared = {f.name for f in dataclasses.fields(cls)}
    if not isinstance(fields, dict) or not set(fields) <= declared:
        raise ConfigError(
            f"cannot resume: the checkpoint's {name} state does not have this version's fields; "
            "start the run again with --overwrite"
        )
    hints = typing.get_type_hints(cls)

    def back(v, hint, where: str):
        if isinstance(v, torch.Tensor):
            return v if device is None else v.to(device)
        if isinstance(v, dict) and "type" in v and "fields" in v:
            for nested in _dataclasses_in(hint):
                if v["type"] == _type_name(nested):
                    return state_from_dict(v, nested, device)
            raise ConfigError(
                f"cannot resume: the checkpoint puts a {str(v['type'])[:80]!r} state in "
                f"{where}, which holds no such state; start the run again with --overwrite"
            )
        if isinstance(v, dict):
            return {k: back(x, None, where) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return type(v)(back(x, None, where) for x in v)
        return v

    return cls(**{k: back(v, hints.get(k), f"{name}.{k}") for k, v in fields.items()})


def _type_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _dataclasses_in(hint) -> list[type]:
    """The dataclasses a field's type hint names (``State``, ``State | None``, …)."""
    import dataclasses
    import typing

    if hint is None:
        return []
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return [hint]
    return [c for arg in typing.get_args(hint) for c in _dataclasses_in(arg)]
