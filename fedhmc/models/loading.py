"""A user's ``torch.nn.Module`` before it is sampled: loading its factory, building it, and
the checks that refuse, in one line, a module fedhmc cannot sample.

- **Loading.** ``--model PACKAGE.MODULE:FACTORY`` names a callable that returns the module
  (`load_factory`; the current directory is searched too, as for ``python -m``), called
  with the ``--model-arg`` keyword arguments (`parse_model_args`, `format_model_args`); a
  factory given in Python is recorded by the spec that imports it back (`spec_of`) or
  described (`describe_factory`).
- **Building.** `build_module` calls the factory (under ``BUILD_SEED``, set by the caller)
  and turns its failures into one line; a slow factory says so (`building_note`).
- **Checking.** `check_module` refuses a module that fails on the data's features, gives
  outputs of another shape than (B, C), changes its buffers or frozen parameters in the
  forward pass, is not deterministic, or mixes the examples of a batch
  (`check_per_example`, up to float rounding: `rounding_tolerance`).

An exception raised by the user's code becomes a one-line message naming the exception
and where in the user's code it was raised (`describe_exception`); allocation failures
and fedhmc's own errors pass through unchanged (`passes_through`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import traceback
from collections.abc import Callable

import torch

from fedhmc.errors import ConfigError, FedHMCError, ModelError, first_line

SLOW_BUILD_SECONDS = 2.0
"""A ``--model`` factory still running after this many seconds prints `building_note`."""


def building_note(name: str) -> None:
    """The one line a slow ``--model`` factory prints while it runs."""
    print(f"fedhmc: building the model (--model {name}) …", file=sys.stderr, flush=True)


BUILD_SEED = 0
"""torch's seed while the factory builds the module that a run evaluates (its global random
state is saved and restored around it): what the factory draws at random, a frozen
part's or a buffer's values, is then the same on the engine, the Flower server and every
client. The sampled parameters' values are θ's, drawn per chain (``module_init``)."""


BATCH_RTOL = 1e-4
"""How far, relative to the largest output (or 1), an example's output alone may be from
its output within a batch (``TorchModel``'s check that the module treats examples one by
one): float rounding moves them by ~1e-6 in float32, while batch norm without running
statistics moves logits by ~0.1 and more."""

BATCH_RTOL_ACCELERATOR = 1e-3
"""``BATCH_RTOL`` in float32 on a GPU, whose kernels may differ by batch size and run
convolutions in TF32 (10 mantissa bits, ~5e-4 relative per operation)."""


_OUR_CODE = (
    os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
)
"""torch's and fedhmc's own folders: a user error's place is its innermost frame outside them."""


def passes_through(exc: BaseException) -> bool:
    """Whether an exception from the user's code is not the user's code's fault, and goes
    up as it is: a ``FedHMCError`` (already one line), or an allocation failure (the run's
    out-of-memory handling names the fix)."""
    if isinstance(exc, (FedHMCError, MemoryError)):
        return True
    try:
        from fedhmc_datasets.memory import is_out_of_memory
    except ImportError:  # pragma: no cover - the datasets ship with fedhmc
        oom = getattr(torch, "OutOfMemoryError", None)
        return oom is not None and isinstance(exc, oom)
    return is_out_of_memory(exc)


def describe_exception(exc: BaseException) -> str:
    """``Type: first line of the message (at file.py:line)``: an exception in one line, at
    the innermost frame of its traceback that is neither torch's nor fedhmc's (the user's
    own code), where there is one."""
    out = first_line(exc)
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    mine = [f for f in frames if not os.path.abspath(f.filename).startswith(_OUR_CODE)]
    if mine:
        out += f" (at {os.path.basename(mine[-1].filename)}:{mine[-1].lineno})"
    return out


def load_factory(spec: str) -> Callable[..., torch.nn.Module]:
    """The callable named by ``"package.module:factory"`` (``factory`` may be dotted, such
    as ``Class.build``). The current directory is searched too, as for ``python -m``."""
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise ConfigError(
            f"--model {spec!r} is neither a built-in model nor a PACKAGE.MODULE:FACTORY spec; "
            "use logistic, mlp, cnn, or e.g. mypackage.nets:make_cnn"
        )
    mod_name, attr = (s.strip() for s in spec.split(":"))
    if not mod_name or not attr:
        raise ConfigError(
            f"--model {spec!r}: both sides of ':' are needed, as in mypackage.nets:make_cnn"
        )
    try:
        with _exits_raise():
            module = _import(mod_name)
    except SystemExit as e:
        raise ConfigError(
            f"--model {spec}: importing {mod_name!r} ended the program ({_exit_call(e)}); a "
            "module fedhmc imports must not exit"
        ) from None
    except ModuleNotFoundError as e:
        raise ConfigError(
            f"--model {spec}: cannot import {mod_name!r} ({e}); run from the folder that "
            "holds it, install it, or add its folder to PYTHONPATH"
        ) from None
    except Exception as e:  # the user's module raised while being imported
        raise ConfigError(
            f"--model {spec}: importing {mod_name!r} failed with {type(e).__name__}: {e}"
        ) from None
    obj = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ConfigError(
                f"--model {spec}: module {mod_name!r} has no attribute {attr!r}; "
                "name a function or class that returns a torch.nn.Module"
            )
    if not callable(obj):
        raise ConfigError(f"--model {spec}: {attr!r} is not callable; name a factory function")
    return obj


@contextlib.contextmanager
def _exits_raise():
    """While the user's code runs: ``os._exit`` raises SystemExit as ``sys.exit`` does, so
    that a factory that ends the process is said in one line (it left with its code and no
    word)."""
    real = os._exit

    def _exit(code):
        raise _HardExit(code) from None

    os._exit = _exit
    try:
        yield
    finally:
        os._exit = real


class _HardExit(SystemExit):
    """``os._exit`` called by the user's code (see `_exits_raise`)."""


def _exit_call(e: SystemExit) -> str:
    return f"it called {'os._exit' if isinstance(e, _HardExit) else 'sys.exit'}({e.code!r})"


def _import(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        cwd = os.getcwd()
        if e.name is None or not name.startswith(e.name) or cwd in sys.path:
            raise
        sys.path.insert(0, cwd)  # as `python -m` would: the user's own module in the cwd
        return importlib.import_module(name)


def spec_of(factory: Callable) -> str | None:
    """The ``module:qualname`` spec that imports ``factory`` back, or None (a lambda, a
    function defined in a notebook's or script's ``__main__``, a closure)."""
    mod = getattr(factory, "__module__", None)
    qual = getattr(factory, "__qualname__", None)
    if not mod or not qual or mod == "__main__" or "<" in qual:
        return None
    try:
        obj = importlib.import_module(mod)
        for part in qual.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None
    return f"{mod}:{qual}" if obj is factory else None


def parse_model_args(text: str | dict | None) -> dict:
    """``--model-arg`` values: ``"KEY=VALUE;KEY=VALUE"`` (or a dict) to keyword arguments.

    Values are Python literals where they parse as one (``16``, ``0.5``, ``True``,
    ``(1, 28, 28)``), else strings.
    """
    import ast

    if text is None or text == "":
        return {}
    if isinstance(text, dict):
        return dict(text)
    out = {}
    for item in str(text).split(";"):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key.isidentifier():
            raise ConfigError(
                f"--model-arg {item.strip()!r} is not KEY=VALUE with KEY a Python name; "
                "write e.g. --model-arg channels=16"
            )
        try:
            out[key] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            out[key] = value.strip()
    return out


def format_model_args(kwargs: dict) -> str:
    """The inverse of ``parse_model_args`` (for ``config.json`` and Flower)."""
    return ";".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in kwargs.items())


def describe_factory(factory) -> str:
    """A short name for a factory given in Python (for messages and ``config.json``)."""
    if isinstance(factory, torch.nn.Module):
        return f"<in-memory module {type(factory).__name__}>"
    name = getattr(factory, "__qualname__", None) or getattr(factory, "__name__", "callable")
    return f"<in-memory callable {name}>"


# ------------------------------------------------------------------------------ building
def build_module(factory: Callable[..., torch.nn.Module] | torch.nn.Module, kwargs: dict, name):
    """The module: ``factory(**kwargs)``, or a copy of a module given itself. The factory's
    failures become one line naming the model ``name``; a factory still running after
    ``SLOW_BUILD_SECONDS`` says so (`building_note`)."""
    if isinstance(factory, torch.nn.Module):
        import copy

        module = copy.deepcopy(factory)
    else:
        module = _call_factory(factory, kwargs, name)
    if not isinstance(module, torch.nn.Module):
        raise ConfigError(
            f"--model {name}: the factory returned a {type(module).__name__}, not a "
            "torch.nn.Module; return the network itself"
        )
    return module


def _call_factory(factory: Callable, kwargs: dict, name: str):
    import threading

    # A factory that takes a while (a download of weights, a pretrained body) says so in
    # one line, rather than leaving the terminal silent.
    timer = threading.Timer(SLOW_BUILD_SECONDS, building_note, (name,))
    timer.daemon = True
    timer.start()
    try:
        with _exits_raise():
            return factory(**kwargs)
    except SystemExit as e:
        raise ModelError(
            f"--model {name}: the factory ended the program ({_exit_call(e)}) "
            "instead of returning a network; fix the factory"
        ) from None
    except TypeError as e:
        raise ConfigError(
            f"--model {name}: calling the factory with {kwargs or 'no'} "
            f"arguments failed ({e}); check --model-arg"
        ) from None
    except Exception as e:
        if passes_through(e):
            raise
        args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        args = f"with {args} " if args else ""
        raise ModelError(
            f"--model {name}: the factory {args}raised {describe_exception(e)}; "
            "fix the factory or its --model-arg values"
        ) from e
    finally:
        timer.cancel()


# ------------------------------------------------------------------------------ checking
def check_module(net: torch.nn.Module, x: torch.Tensor, num_classes: int, name: str):
    """``net``'s outputs (b, C) on the check's batch ``x`` (b, *features), after refusing
    in one line a module that fedhmc cannot sample: one that fails on ``x``, gives outputs
    of another shape, changes its buffers or frozen parameters in the forward pass, gives
    two outputs at the same θ, or mixes the examples of a batch (`check_per_example`)."""
    buffers = {k: b.clone() for k, b in net.named_buffers()}
    frozen = {k: p.detach().clone() for k, p in net.named_parameters() if not p.requires_grad}
    try:
        with torch.no_grad():
            out1 = net(x)
            out2 = net(x)
    except Exception as e:
        raise ConfigError(
            f"--model {name}: the module fails on inputs of shape "
            f"{tuple(x.shape[1:])} ({type(e).__name__}: {e}); make it take the data's "
            "features as they are"
        ) from None
    if not isinstance(out1, torch.Tensor) or out1.shape != (x.shape[0], num_classes):
        shape = tuple(out1.shape) if isinstance(out1, torch.Tensor) else type(out1).__name__
        raise ConfigError(
            f"--model {name}: outputs of shape {shape} for a batch of {x.shape[0]}; "
            f"the last dimension must be the {num_classes} classes, as ({x.shape[0]}, "
            f"{num_classes})"
        )
    _check_unchanged(net, buffers, frozen, name)
    if not torch.allclose(out1, out2, rtol=0.0, atol=0.0, equal_nan=True):
        raise ConfigError(
            f"--model {name}: two forward passes at the same θ give different outputs in "
            "eval mode; fedhmc needs a deterministic module (no sampling in forward)"
        )
    check_per_example(net, x, out1, num_classes, name)
    return out1


def _check_unchanged(net: torch.nn.Module, buffers: dict, frozen: dict, name: str) -> None:
    """Refuse a module whose forward passes changed its ``buffers`` or ``frozen``
    parameters (their values before)."""
    changed = [k for k, b in net.named_buffers() if not torch.equal(b, buffers[k])]
    if changed:
        raise ConfigError(
            f"--model {name}: the forward pass changes the buffer(s) {', '.join(changed)} "
            "even in eval mode; fedhmc needs a function of θ alone (no running statistics)"
        )
    now = dict(net.named_parameters())
    changed = [k for k, p in frozen.items() if not torch.equal(now[k], p)]
    if changed:
        raise ConfigError(
            f"--model {name}: the forward pass changes the frozen parameter(s) "
            f"{', '.join(changed)}; fedhmc needs a function of θ alone (keep constants "
            "unchanged, or in buffers the forward pass does not write)"
        )


PER_EXAMPLE_CAUSE = (
    "fedhmc needs each example's output from that example alone (batch norm without "
    "running statistics, track_running_stats=False, normalises over the batch: "
    "use LayerNorm or GroupNorm, or batch norm with running statistics)"
)
"""Why `check_per_example` refuses a module (the end of its one line)."""


def check_per_example(net, x: torch.Tensor, batched: torch.Tensor, num_classes: int, name: str):
    """Refuse a module whose output for an example depends on the other examples of its
    batch: each example's output alone must equal its output within the batch
    ``batched``, up to `rounding_tolerance` (float rounding)."""
    if x.shape[0] < 2:
        return
    try:
        with torch.no_grad():
            alone = [net(x[i : i + 1]) for i in range(x.shape[0])]
    except Exception as e:
        raise ConfigError(
            f"--model {name}: the module runs on a batch of {x.shape[0]} examples but fails "
            f"on one alone ({describe_exception(e)}); {PER_EXAMPLE_CAUSE}"
        ) from None
    bad = [
        tuple(a.shape)
        for a in alone
        if not isinstance(a, torch.Tensor) or a.shape != (1, num_classes)
    ]
    if bad:
        raise ConfigError(
            f"--model {name}: outputs of shape {bad[0]} for a batch of 1 but "
            f"({x.shape[0]}, {num_classes}) for a batch of {x.shape[0]}; keep the "
            "batch dimension for any batch size (no squeeze())"
        )
    gap = largest_gap(torch.cat(alone), batched)
    if not gap <= rounding_tolerance(batched):  # a NaN or infinite one alone, too
        raise ConfigError(
            f"--model {name}: an example's output alone differs from its output within a "
            f"batch of {x.shape[0]} (by up to {gap:.3g}); {PER_EXAMPLE_CAUSE}"
        )


def largest_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest |a − b| over the entries where they differ (equal infinities and NaN
    against NaN are equal): 0 where they are equal, NaN or inf where a NaN or an infinity
    meets another value."""
    same = (a == b) | (a.isnan() & b.isnan())
    return float((a - b).abs()[~same].max()) if not bool(same.all()) else 0.0


def rounding_tolerance(out: torch.Tensor) -> float:
    """How far two computations of the outputs ``out`` may differ by float rounding:
    ``BATCH_RTOL`` (``BATCH_RTOL_ACCELERATOR`` in float32 off the CPU) of the largest
    finite output, or of 1."""
    finite = out[out.isfinite()]
    scale = float(finite.abs().max()) if finite.numel() else 0.0
    loose = out.device.type != "cpu" and out.dtype != torch.float64
    return (BATCH_RTOL_ACCELERATOR if loose else BATCH_RTOL) * max(scale, 1.0)
