"""Any ``torch.nn.Module`` as a likelihood model on a flat parameter vector.

A module g_θ maps a batch of inputs (B, *features) to class logits (B, C). θ is the flat
vector of its sampled parameters (those that require gradients) in ``named_parameters()``
order, each tensor flattened row-major, so ``nn.Linear(d, C)`` gives θ = (weight[C, d],
bias[C]). The negative log-likelihood of a
row (one chain and one client) is Σ_i sw_i ℓ(θ; x_i, y_i) with ℓ = −log softmax(g_θ(x))_y,
and its gradient comes from ``torch.func``: θ's rows are put into the module as
``functional_call`` would, ``vmap`` maps the forward pass over every (chain, client) row in
one batched computation, and one reverse pass (a vector-Jacobian product) gives every row's
gradient. What does not change between calls is found once, when the model is built: where
each parameter lives in the module (``functional_call``'s lookups, tied weights included)
and θ's layout; a call only splits θ into views, swaps them in, runs one batching level of
``vmap`` and swaps the parameters back. The numbers are ``functional_call``'s and
``torch.func.vmap``'s bit for bit (tested); only their per-call Python work is gone. The
private torch APIs these short cuts take, each with its public fallback, are in
`fedhmc.models.torch_private`.

``TorchModel`` computes its gradients by one strategy, chosen when it is built and kept
for the whole run (``TorchModel.strategy``): ``vmap`` (every row in one batched call),
``loop`` (row by row, each with its own reverse pass), or ``compiled`` (inductor's
compilation of the batched gradient, `CompiledRows`). ``batching`` chooses between the
first two, and ``"auto"`` by a fixed rule (not by timing, so that a seed always gives the
same chain): one batched call, except for modules with convolutions on a CPU at large
minibatches, where the batched computation is slower than a loop over rows (grouped
convolutions). ``compile`` asks for the third. The strategy's gradient is checked on the
first examples against the plain one (``functional_call`` row by row, with autograd
through the whole loss) and refused, or left for the eager one, if it differs by more
than float rounding. Which way a call runs depends only on the strategy and the call's
own shapes, never on the calls before it.

Only the parameters that require gradients are sampled: θ holds those, and a parameter
with ``requires_grad=False`` (a frozen, pretrained feature extractor, say) keeps the value
the factory gave it, in the module, in every call (``frozen_layout``). The module is built
once under a fixed seed (``BUILD_SEED``), so that a frozen part drawn at random is the same
in every process of a run.

The module is evaluated in eval mode. It must not change its buffers or frozen parameters
in the forward pass (batch norm in training mode does), must be deterministic given θ
(dropout in training mode is not), and must compute each example's output from that
example alone (batch norm without running statistics does not); ``TorchModel`` checks
these on the first examples and refuses the module with one line otherwise
(`fedhmc.models.loading`, which also loads a ``PACKAGE.MODULE:FACTORY`` model).

An exception raised by the user's code (the factory, or the forward or backward pass in a
later round) becomes a one-line ``ModelError`` naming the model, the exception and where
in the user's code it was raised; allocation failures pass through unchanged.
"""

from __future__ import annotations

import hashlib
import math
import sys
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from fedhmc.core import rng
from fedhmc.errors import ConfigError, ModelError
from fedhmc.models import BATCHINGS

# describe_factory, format_model_args, load_factory, parse_model_args and spec_of are
# fedhmc.models.loading's; fedhmc.runtime.config still imports them from here.
from fedhmc.models.loading import (
    BUILD_SEED,
    build_module,
    check_module,
    describe_exception,
    describe_factory,  # noqa: F401
    format_model_args,  # noqa: F401
    largest_gap,
    load_factory,  # noqa: F401
    parse_model_args,  # noqa: F401
    passes_through,
    rounding_tolerance,
    spec_of,  # noqa: F401
)
from fedhmc.models.torch_private import (
    BoundModule,
    compile_traced,
    is_convolution,
    log_softmax_backward,
    prepare_vmap,
    vmap_call,
)

AUTO_LOOP_VALUES = 100_000
"""``auto`` evaluates a convolutional module row by row on a CPU from this many input values
per row (minibatch × values per example): a CPU runs large grouped convolutions (the
batched ones) slower than a loop of plain ones, and small ones faster. The performance page
has the measurements (``python -m benchmarks --only models``)."""

PREDICT_CHUNK = 2048
"""Examples per forward pass when predicting a test set (bounds the activations' memory)."""

COMPILE_MAX_VALUES = 100_000
"""``compile`` compiles a module's gradient when a row's minibatch holds fewer input values
than this (minibatch × values per example): compilation removes per-operation overhead,
which dominates small batches, while the matrix products of large batches cost the same
either way (the performance page has the measurements). The compiled strategy computes a
call of more values per row (a full-batch anchor) eagerly, by this rule alone."""

GRADIENT_RTOL = {torch.float32: 1e-3, torch.float64: 1e-9}
"""How far, relative to the largest gradient component, a strategy's gradient of the
check's batch may be from the plain one before the strategy is refused (``compile``: left
for the eager gradient): its kernels sum in another order (about 1e-7 in float32 for the
compiled gradient), while a wrong computation is off by far more."""

_MATMULS = frozenset(
    {torch.matmul, torch.mm, torch.Tensor.matmul, torch.Tensor.mm, torch.Tensor.__matmul__}
)


class ClassesFirstLinear(TorchFunctionMode):
    """Linear layers with their outputs first in memory: ``F.linear(x, W, b)`` on a batch of
    vectors x (B, F) computed as (W xᵀ)ᵀ + b, and a product x @ W of a (B, F) and an
    (F, C) matrix with C < B as (Wᵀ xᵀ)ᵀ.

    The same products, laid out the other way: the result is (B, C) with the C outputs
    first in memory, so that both the forward product and the reverse pass's ∂W = ∂yᵀ x are
    "short × long" matrix products, which a CPU's BLAS runs faster than the "long × short"
    x Wᵀ and xᵀ ∂y that ``F.linear`` and its batched (``vmap``) reverse pass make when C
    is small (``python -m benchmarks --only models`` measures it); a following layer reads
    the transposed result as it is, and the loss takes its softmax along the classes where
    they lie (`_classes_axis`). The results differ from ``F.linear``'s by float rounding
    only (another order of the same sums). ``TorchModel`` runs its module under it unless
    the module fails or differs under it (``TorchModel.classes_first``).
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, w = args[0], args[1]
            b = args[2] if len(args) > 2 else kwargs.get("bias")
            if x.dim() == 2 and w.dim() == 2:
                out = torch.matmul(w, x.mT).mT
                return out if b is None else out + b
        elif func in _MATMULS and len(args) == 2 and not kwargs:
            a, w = args
            if (
                isinstance(a, torch.Tensor)
                and isinstance(w, torch.Tensor)
                and a.dim() == 2
                and w.dim() == 2
                and w.shape[1] < a.shape[0]
            ):
                return torch.matmul(w.mT, a.mT).mT
        return func(*args, **kwargs)


COMPILE_MAX_SHAPES = 8
"""A compiled model keeps at most this many compiled functions (one per shape of its
inputs); a further shape is compiled in place of the one used longest ago (which is
compiled again if it comes back: inductor's disk cache makes that about a second)."""


class CompiledRows:
    """``fn(theta, X, y, sw)`` compiled once per shape of its inputs.

    Each new shape is traced into one graph of ATen operations (``make_fx``: the ``vmap``,
    the gradient and the module's forward pass, with nothing left in Python), which
    inductor compiles (``compile_fx``; both through `fedhmc.models.torch_private`, whose
    fallback is ``torch.compile``). The compiled function is called directly: no Dynamo
    frame and no guards, whose checks cost about as much as the whole gradient of a small
    model. What the guards would check is the key here: the inputs' shapes, strides,
    dtypes and devices, torch's thread count and autocast. The module's buffers, frozen
    parameters and attributes are constants of the traced graph: a module must not change
    them (``TorchModel`` checks that its forward pass does not).

    Every shape is compiled, whatever came before it (past `COMPILE_MAX_SHAPES`, in place
    of the shape used longest ago), so that which way a call runs never depends on the
    calls before it. A shape whose compilation fails is computed eagerly from then on:
    ``failed(exc, inputs)`` is told once, and the call returns None.
    """

    def __init__(self, fn: Callable, failed: Callable[[BaseException, tuple], None]):
        self.fn = fn
        self.failed = failed
        self._compiled: OrderedDict[tuple, Callable | None] = OrderedDict()

    def __call__(self, *inputs: torch.Tensor):
        """``fn(*inputs)`` compiled, or None for a shape that could not be compiled (the
        caller then computes it eagerly)."""
        device = inputs[0].device.type
        key = (torch.get_num_threads(), torch.is_autocast_enabled(device)) + tuple(
            (t.shape, t.stride(), t.dtype, t.device) for t in inputs
        )
        if key in self._compiled:
            self._compiled.move_to_end(key)
            compiled = self._compiled[key]
            return None if compiled is None else compiled(*inputs)
        self._compiled[key] = None  # (until it compiled: a failure leaves the shape eager)
        if len(self._compiled) > COMPILE_MAX_SHAPES:
            self._compiled.popitem(last=False)
        try:
            compiled = self._compile(inputs)
            out = compiled(*inputs)
        except Exception as e:  # noqa: BLE001 - inductor's failures are many: said in one line
            if passes_through(e):
                raise
            self.failed(e, inputs)
            return None
        self._compiled[key] = compiled
        return out

    def _compile(self, inputs: tuple[torch.Tensor, ...]) -> Callable:
        fn = self.fn

        def rows(theta, X, y, sw):
            return fn(theta, X, y, sw)

        return compile_traced(rows, inputs)


def _classes_axis(logits: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``logits`` (..., B, C) as the tensor and axis to take the softmax along: themselves
    and −1, or, when their classes come first in memory (`ClassesFirstLinear`), their
    transpose (..., C, B) and −2, along which the softmax kernels run vectorised over the
    examples (faster than along the few classes of each example)."""
    if logits.shape[-1] > 1 and logits.shape[-2] > 1 and logits.mT.is_contiguous():
        return logits.mT, -2
    return logits, -1


def _has_conv(module: torch.nn.Module) -> bool:
    return any(is_convolution(m) for m in module.modules())


@dataclass(frozen=True)
class ModelOptions:
    """How a `TorchModel` evaluates its module (its keyword arguments beyond the factory's).

    Attributes
    ----------
    batching
        One of ``BATCHINGS``.
    dtype, device
        Where the module's buffers live (its parameters are replaced by θ in every call).
    name
        The model's spec, for ``config.json`` and messages.
    batch_size
        Examples per row of a gradient evaluation (0: the whole client), for ``auto``.
    compile
        Evaluate the gradient with a compiled (inductor, `CompiledRows`)
        ``vmap(grad_and_value(loss))`` of the module, under ``vmap`` batching and below
        ``COMPILE_MAX_VALUES`` input values per row: faster on a CPU at small batches, with
        gradients equal to the eager ones up to float rounding. It is checked on the
        example batch when the model is built; a module that cannot be compiled (or a
        machine without a C compiler) stays eager, with one line on stderr
        (``TorchModel.compiled`` says which runs).
    """

    batching: str = "auto"
    dtype: torch.dtype = torch.float32
    device: torch.device | str = "cpu"
    name: str = "module"
    batch_size: int = 0
    compile: bool = False


class TorchModel:
    """A ``torch.nn.Module`` classifier on flat parameter vectors, batched over rows.

    Parameters
    ----------
    factory
        A callable returning the module (called with ``kwargs``), or the module itself.
    num_classes
        C: the module's outputs must be (B, C).
    example
        A few training inputs, (b, *features), to check the module on.
    kwargs
        Keyword arguments of ``factory``.
    **options
        The fields of `ModelOptions`: ``batching``, ``dtype``, ``device``, ``name``,
        ``batch_size`` and ``compile``.
    """

    def __init__(
        self,
        factory: Callable[..., torch.nn.Module] | torch.nn.Module,
        num_classes: int,
        example: torch.Tensor,
        kwargs: dict | None = None,
        **options,
    ):
        opts = ModelOptions(**options)
        if opts.batching not in BATCHINGS:
            raise ConfigError(
                f"batching must be one of {', '.join(BATCHINGS)}, got {opts.batching!r}"
            )
        self.name = opts.name
        self.kwargs = dict(kwargs or {})
        self.num_classes = int(num_classes)
        self._factory = factory
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(BUILD_SEED)
            module = build_module(self._factory, self.kwargs, self.name)
        self.net = module.to(device=opts.device, dtype=opts.dtype).eval()
        self.device = torch.device(opts.device)
        self._lay_out()
        self._bound = BoundModule(self.net)
        """The module with θ's parts swapped in (`fedhmc.models.torch_private`)."""
        prepare_vmap()
        per_row = max(1, int(opts.batch_size)) * max(1, example[0].numel())
        self.batching = opts.batching
        """``vmap`` or ``loop``: how the module's rows are evaluated (``auto`` resolved)."""
        if opts.batching == "auto":
            big = per_row >= AUTO_LOOP_VALUES
            loop = self.device.type == "cpu" and _has_conv(self.net) and big
            self.batching = "loop" if loop else "vmap"
        self.strategy = "unchecked"
        """How the gradient is computed, chosen here once for the whole run: ``vmap``,
        ``loop`` or ``compiled``."""
        self._said_as_written = False
        self._compiled_fn: CompiledRows | None = None
        x = example.to(device=opts.device, dtype=opts.dtype)[: min(4, example.shape[0])]
        out = check_module(self.net, x, self.num_classes, self.name)
        self.classes_first = self._same_classes_first(x, out)
        """Whether the module runs under `ClassesFirstLinear` (off for a module that fails
        or gives other outputs under it on the check's batch: then it runs as written)."""
        compile = opts.compile and self.batching == "vmap" and per_row < COMPILE_MAX_VALUES
        self.strategy = self._choose_strategy(x, compile)

    @property
    def compiled(self) -> bool:
        """Whether the gradient is the compiled one (``compile``, under ``vmap`` batching)."""
        return self.strategy == "compiled"

    # ------------------------------------------------------------------ building
    def _lay_out(self) -> None:
        """θ's layout: the sampled parameters' names, shapes and sizes, and the frozen ones'."""
        named = dict(self.net.named_parameters())
        if not named:
            raise ConfigError(f"--model {self.name}: the module has no parameters to sample")
        params = {k: v for k, v in named.items() if v.requires_grad}
        if not params:
            raise ConfigError(
                f"--model {self.name}: every parameter has requires_grad=False, so there is "
                "nothing to sample; leave the parameters to sample requiring gradients"
            )
        self.frozen = {k: tuple(v.shape) for k, v in named.items() if not v.requires_grad}
        """Name → shape of the parameters that keep their values (``requires_grad=False``)."""
        self.shapes = {k: tuple(v.shape) for k, v in params.items()}
        self._sizes = [math.prod(s) for s in self.shapes.values()]
        self._shape_list = list(self.shapes.values())
        self.dim = sum(self._sizes)

    def _same_classes_first(self, x: torch.Tensor, out: torch.Tensor) -> bool:
        """Whether the module runs under `ClassesFirstLinear` and gives its outputs ``out``
        on ``x`` there, up to float rounding (``fedhmc.models.loading.BATCH_RTOL``)."""
        try:
            with torch.no_grad(), ClassesFirstLinear():
                got = self.net(x)
        except Exception as e:  # noqa: BLE001 - e.g. a .view() of a layer's output
            if passes_through(e):
                raise
            return False
        if not isinstance(got, torch.Tensor) or got.shape != out.shape:
            return False
        tol = rounding_tolerance(out)
        return bool(torch.allclose(got, out, rtol=0.0, atol=tol, equal_nan=True))

    def _choose_strategy(self, x: torch.Tensor, compile: bool) -> str:
        """The gradient's strategy, checked on the check's batch ``x`` against the plain
        gradient (`_plain_loss_grad`): ``batching``'s (refused in one line if it fails or
        differs), or ``compiled`` where ``compile`` and the compiled gradient matches too
        (else ``batching``'s, said in one line)."""
        theta = self.flatten(dict(self.net.named_parameters())).detach().unsqueeze(0)
        X = x.unsqueeze(0)
        y = (torch.arange(x.shape[0], device=x.device) % self.num_classes).unsqueeze(0)
        sw = torch.ones(X.shape[:2], dtype=x.dtype, device=x.device)
        got = self._eager_on_check(theta, X, y, sw)
        try:
            want, _ = self._plain_loss_grad(theta, X, y, sw)
        except Exception as e:
            if passes_through(e):
                raise
            raise self._user_error(e, "forward or backward pass") from e
        gap, tol = self._gradient_gap(got, want)
        if not gap <= tol:
            how = "batched with torch.func.vmap" if self.batching == "vmap" else "row by row"
            fix = "add --model-batching loop" if self.batching == "vmap" else "please report it"
            raise ConfigError(
                f"--model {self.name}: its gradient {how} differs from functional_call's "
                f"with autograd by {gap:.3g} on the first examples; {fix}"
            )
        if compile and self._compiles(theta, X, y, sw, want):
            return "compiled"
        return self.batching

    def _eager_on_check(self, theta, X, y, sw) -> torch.Tensor:
        """``batching``'s gradient of the check's batch (a module that ``vmap`` cannot batch
        is refused in one line)."""
        if self.batching == "loop":
            return self._loop_grad(theta, X, y, sw, True)[0]
        try:
            return self._grad(theta, X, y, sw, True)[0]
        except Exception as e:
            if passes_through(e):
                raise
            raise ConfigError(
                f"--model {self.name}: torch.func.vmap cannot batch this module "
                f"({describe_exception(e)}); add --model-batching loop"
            ) from None

    def _gradient_gap(self, got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
        """The largest difference of two gradients of the check's batch, and how large
        float rounding may make it (`GRADIENT_RTOL` of the largest component, or of 1)."""
        finite = want[want.isfinite()]
        scale = float(finite.abs().max()) if finite.numel() else 0.0
        return largest_gap(got, want), GRADIENT_RTOL.get(want.dtype, 1e-3) * (scale or 1.0)

    def _compiles(self, theta, X, y, sw, want: torch.Tensor) -> bool:
        """Whether the compiled gradient of the check's batch is ``want`` up to float
        rounding; if not (or it does not compile) the gradient stays eager, said in one
        line."""
        out = self._compiled()(theta, X, y, sw)
        if out is None:  # (said by _compile_failed)
            return False
        gap, tol = self._gradient_gap(out[0], want)
        if not gap <= tol:
            self._compile_failed(ValueError("its gradient differs from the eager one"), ())
            return False
        return True

    def _compile_failed(self, exc: BaseException, inputs: tuple) -> None:
        """One line on stderr: at the check, the gradient stays eager; in the run, the
        gradient of inputs of that shape is computed eagerly."""
        why = describe_exception(exc).splitlines()[0][:200]
        if self.strategy != "compiled":
            msg = f"runs uncompiled: torch.compile failed ({why})"
        else:
            shape = tuple(inputs[1].shape)
            msg = f"computes inputs of shape {shape} uncompiled: compiling them failed ({why})"
        print(f"fedhmc: --model {self.name} {msg}", file=sys.stderr)
        if self.strategy != "compiled":
            self._compiled_fn = None

    def __getstate__(self) -> dict:
        """For pickling and ``copy``: without the compiled functions (rebuilt on use)."""
        return {**self.__dict__, "_compiled_fn": None}

    # ------------------------------------------------------------------ the module's calls
    def _run_net(self, run: Callable[[], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """``run()`` (the module on the inputs ``x``) under `ClassesFirstLinear`, or as
        written: for a module that needs it (``classes_first`` False), and for a call on
        whose inputs the module fails under it (then each such call tries it first: which
        way a call runs never depends on the calls before it)."""
        if not self.classes_first:
            return run()
        try:
            with ClassesFirstLinear():
                return run()
        except Exception as e:
            if passes_through(e):
                raise
            out = run()  # raises again if the module itself fails
            self._say_as_written(tuple(x.shape), e)
            return out

    def _say_as_written(self, shape: tuple[int, ...], exc: BaseException) -> None:
        """The one line (the model's first) saying that the module ran as written on inputs
        of ``shape``, having failed under `ClassesFirstLinear` there."""
        if self._said_as_written:
            return
        self._said_as_written = True
        why = describe_exception(exc).splitlines()[0][:200]
        print(
            f"fedhmc: --model {self.name} runs its linear layers as written on inputs of "
            f"shape {shape}: laid out classes first they failed ({why})",
            file=sys.stderr,
        )

    def _forward(self, *args: torch.Tensor) -> torch.Tensor:
        """The module's outputs with its parameters replaced by ``args[:-1]`` (θ's parts,
        in ``named_parameters()`` order) on the inputs ``args[-1]``: ``functional_call``
        without its per-call lookups (`BoundModule`)."""
        x = args[-1]
        return self._run_net(lambda: self._bound(args[:-1], x), x)

    # ------------------------------------------------------------------ the compiled gradient
    def _row_loss(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, sw: torch.Tensor):
        """Σ_i sw_i ℓ(θ; x_i, y_i) of one row: θ (D,), x (B, *features), y (B,), sw (B,)."""
        params = dict(zip(self.shapes, self._parts(theta), strict=True))
        logits = self._run_net(lambda: torch.func.functional_call(self.net, params, (x,)), x)
        logp = F.log_softmax(logits, dim=-1)
        return -(logp.gather(-1, y.unsqueeze(-1)).squeeze(-1) * sw).sum()

    def _compiled(self) -> CompiledRows:
        """The compiled ``vmap(grad_and_value(_row_loss))``, built once (`CompiledRows`)."""
        if self._compiled_fn is None:
            fn = torch.func.vmap(torch.func.grad_and_value(self._row_loss))
            self._compiled_fn = CompiledRows(fn, self._compile_failed)
        return self._compiled_fn

    # ----------------------------------------------------------------- layout
    def flatten(self, params: dict[str, torch.Tensor]) -> torch.Tensor:
        """θ (D,) from a name → tensor mapping, in ``named_parameters()`` order."""
        return torch.cat([params[k].reshape(-1) for k in self.shapes])

    def _parts(self, theta: torch.Tensor) -> list[torch.Tensor]:
        """θ (..., D) as views (..., *shape), one per parameter in θ's order.

        One ``split`` rather than a slice per parameter: the reverse pass then concatenates
        the parameters' gradients once instead of filling a zeroed θ-sized gradient per
        parameter."""
        lead = theta.shape[:-1]
        parts = torch.split(theta, self._sizes, dim=-1)
        return [p.reshape(*lead, *s) for p, s in zip(parts, self._shape_list, strict=True)]

    def unflatten(self, theta: torch.Tensor) -> dict[str, torch.Tensor]:
        """Name → tensor views of θ (..., D)."""
        return dict(zip(self.shapes, self._parts(theta), strict=True))

    def parameter_layout(self) -> list[tuple[str, tuple[int, ...]]]:
        """(name, shape) of every sampled parameter, in θ's order (the ArviZ export names
        them)."""
        return list(self.shapes.items())

    def frozen_parameters(self) -> dict[str, torch.Tensor]:
        """Name → the module's own tensor of every frozen parameter (``requires_grad=False``,
        not in θ), in ``named_parameters()`` order."""
        return {k: p for k, p in self.net.named_parameters() if k in self.frozen}

    def frozen_layout(self) -> list[tuple[str, tuple[int, ...], str]]:
        """(name, shape, dtype) of every frozen parameter, in ``named_parameters()`` order:
        what ``config.json`` and the ArviZ export record beside θ's layout."""
        return [
            (k, tuple(p.shape), str(p.dtype).removeprefix("torch."))
            for k, p in self.frozen_parameters().items()
        ]

    def frozen_sha256(self) -> str | None:
        """SHA-256 of the frozen parameters' values (names, dtypes, shapes and bytes, in
        order), or None when every parameter is sampled: tells whether two runs, or two
        machines of one run, kept the same frozen values."""
        if not self.frozen:
            return None
        h = hashlib.sha256()
        for k, p in self.frozen_parameters().items():
            t = p.detach().cpu().contiguous()
            h.update(f"{k}|{t.dtype}|{tuple(t.shape)}|".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        return h.hexdigest()

    def module_init(self, seeds: list[int]) -> torch.Tensor:
        """θ (S, D): the module's own initialisation, one draw per seed.

        The factory is called again under each seed (torch's global generator is saved and
        restored around it), so the draw is the factory's own, reproducible from the seed.
        A module given as an instance is copied and its submodules' ``reset_parameters``
        called instead.
        """
        rows = []
        for seed in seeds:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(seed))
                module = build_module(self._factory, self.kwargs, self.name)
                if isinstance(self._factory, torch.nn.Module):  # a copy: draw afresh
                    for m in module.modules():
                        if hasattr(m, "reset_parameters"):
                            m.reset_parameters()
            params = dict(module.named_parameters())
            rows.append(self.flatten(params).detach().to(torch.float64))
        return torch.stack(rows)

    def init(self, kind: str, keys: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """θ (S, D) at round 0 for the run seed's initialisation ``keys`` (S,): ``auto`` and
        ``module`` are the module's own initialisation (``module_init``, seeded by
        each key), except that ``auto`` starts every chain at the weights of a module given
        as an instance; ``zeros`` and ``normal`` (N(0, I)) as for every model."""
        if kind == "auto" and isinstance(self._factory, torch.nn.Module):
            # A module given as an instance (trained, say): every chain starts at its weights.
            theta = self.flatten(dict(self._factory.named_parameters())).detach()
            return theta.to(dtype).cpu().expand(keys.shape[0], -1).clone()
        if kind in ("auto", "module"):
            return self.module_init([int(k) for k in keys.tolist()]).to(dtype)
        if kind == "zeros":
            return torch.zeros(keys.shape[0], self.dim, dtype=dtype, device=keys.device)
        if kind == "normal":
            return rng.normal(keys, 0, self.dim, dtype)
        raise ConfigError(
            f"--init {kind} is for the built-in logistic and mlp models; use --init module "
            "(the module's own initialisation), zeros or normal"
        )

    # ------------------------------------------------------------ likelihood
    def prepare(self, X: torch.Tensor) -> torch.Tensor:
        """Features as they are: the module sees the data's own shape."""
        return X

    @staticmethod
    def _rows(parts: list[torch.Tensor]) -> list[tuple[torch.Tensor, ...]]:
        """θ's parts (M, *shape) as M rows of parts (``unbind``), for the loop's
        predictions."""
        return list(zip(*(p.unbind(0) for p in parts), strict=True))

    def loss_grad(
        self,
        theta: torch.Tensor,
        X: torch.Tensor,
        y: torch.Tensor,
        sw: torch.Tensor,
        need_value: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Σ_i sw_i ℓ(θ_m; x_mi, y_mi) of each row m and its gradient, by ``strategy``.

        theta (M, D), X (M, B, *features), y (M, B), sw (M, B); returns (M, D) and (M,).
        Under ``vmap``, one forward pass of every row (``vmap`` of the bound module), then
        one reverse pass: the rows are independent, so the gradient of their sum with
        respect to θ (M, D) is every row's own gradient (a vector-Jacobian product with
        ones), which is faster than ``vmap(grad)`` at small batches, where per-call
        overhead dominates. Under ``loop``, a forward and a reverse pass of each row in turn, as
        a loop over per-client modules would run them: one row's activations at a time,
        which keeps a large convolutional module as fast as such a loop. Under
        ``compiled``, the compiled ``vmap`` of the gradient of one row's loss
        (`CompiledRows`), below ``COMPILE_MAX_VALUES`` input values per row.

        Autograd records only the module: the loss's gradient with respect to the logits
        is computed here by the kernels autograd's reverse pass of ``log_softmax`` and
        ``gather`` would call (``scatter_add`` of −sw into zeros, then log_softmax's
        backward, `fedhmc.models.torch_private.log_softmax_backward`), with the same
        numbers (tested against autograd through the whole loss) and seven fewer nodes for
        the autograd engine.
        """
        try:
            if self.strategy == "vmap":
                return self._grad(theta, X, y, sw, need_value)
            if self.strategy == "loop":
                return self._loop_grad(theta, X, y, sw, need_value)
            return self._compiled_grad(theta, X, y, sw, need_value)
        except Exception as e:
            if passes_through(e):
                raise
            raise self._user_error(e, "forward or backward pass") from e

    def _loop_grad(self, theta, X, y, sw, need_value):
        """`loss_grad` row by row, each row with its own reverse pass."""
        rows = zip(theta, X, y, sw, strict=True)
        out = [self._grad(t, x, yr, w, need_value) for t, x, yr, w in rows]
        g = torch.stack([o[0] for o in out])
        return g, torch.stack([o[1] for o in out]) if need_value else None

    def _compiled_grad(self, theta, X, y, sw, need_value):
        """`loss_grad` compiled (`CompiledRows`), or batched eagerly at ``COMPILE_MAX_VALUES``
        input values per row and more (a full-batch anchor) and for a shape that could not
        be compiled."""
        if X[0].numel() < COMPILE_MAX_VALUES:
            out = self._compiled()(theta.detach(), X, y, sw)
            if out is not None:
                return out[0], out[1] if need_value else None
        return self._grad(theta, X, y, sw, need_value)

    def _grad(self, theta, X, y, sw, need_value):
        """`loss_grad` of rows θ (M, D) batched with vmap on X (M, B, …), or of one row θ
        (D,) on its X (B, …): one forward pass, then one reverse pass."""
        with torch.enable_grad():
            th = theta.detach().requires_grad_(True)
            if th.dim() == 1:
                logits = self._forward(*self._parts(th), X)
            else:
                logits = vmap_call(self._forward, self._parts(th), X, batched=True)
        with torch.no_grad():
            z, c = _classes_axis(logits)
            logp = F.log_softmax(z, dim=c)
            yy = y.unsqueeze(c)
            nll = -(logp.gather(c, yy).squeeze(c) * sw).sum(-1) if need_value else None
            g_logp = torch.zeros_like(logp).scatter_add_(c, yy, sw.neg().unsqueeze(c))
            g_logits = log_softmax_backward(g_logp, logp, c)
        (g,) = torch.autograd.grad(logits, th, g_logits if c == -1 else g_logits.mT)
        return g, nll

    def _plain_loss_grad(self, theta, X, y, sw) -> tuple[torch.Tensor, torch.Tensor]:
        """`loss_grad` by public APIs alone, row by row: ``functional_call`` of the module
        as written, ``log_softmax`` and autograd through the whole loss. Every strategy is
        checked against it when the model is built."""
        grads, values = [], []
        for t, x, yr, w in zip(theta, X, y, sw, strict=True):
            with torch.enable_grad():
                th = t.detach().requires_grad_(True)
                logits = torch.func.functional_call(self.net, self.unflatten(th), (x,))
                logp = F.log_softmax(logits, dim=-1)
                nll = -(logp.gather(-1, yr.unsqueeze(-1)).squeeze(-1) * w).sum()
                (g,) = torch.autograd.grad(nll, th)
            grads.append(g)
            values.append(nll.detach())
        return torch.stack(grads), torch.stack(values)

    def _user_error(self, exc: BaseException, where: str) -> ModelError:
        return ModelError(
            f"--model {self.name}: the module's {where} raised {describe_exception(exc)}; "
            "fix the module"
        )

    def log_probs(self, theta: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        """Class log-probabilities (S, n, C) of ``X`` (n, *features) under each θ (S, D)."""
        parts = self._parts(theta)
        rows = None if self.batching == "vmap" else self._rows(parts)
        outs = []
        try:
            for start in range(0, X.shape[0], PREDICT_CHUNK):
                x = X[start : start + PREDICT_CHUNK]
                if rows is None:
                    out = vmap_call(self._forward, parts, x, batched=False)
                else:
                    out = torch.stack([self._forward(*r, x) for r in rows])
                z, c = _classes_axis(out)
                logp = F.log_softmax(z, dim=c)
                outs.append(logp if c == -1 else logp.mT)
        except Exception as e:
            if passes_through(e):
                raise
            raise self._user_error(e, "forward pass (predicting the test set)") from e
        return torch.cat(outs, dim=1)
