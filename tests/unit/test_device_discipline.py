"""Tensors follow their data: no tensor factory in the library lands on the CPU by default.

CI has no GPU, so the device discipline is checked from the source. Every call of a torch
tensor factory (``torch.zeros``, ``torch.tensor``, ``torch.arange``, …) in ``fedhmc/``,
``server/``, ``clients/`` and ``datasets/`` must pass ``device=`` (``device="cpu"`` where
the CPU is meant) or derive its device from a tensor (``*_like``, ``x.new_*``, which this
check never flags). Only the places listed in ``EXEMPT``, each with its reason, may create
tensors on the default device.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("fedhmc", "server", "clients", "datasets")

FACTORIES = frozenset(
    {
        "zeros",
        "ones",
        "empty",
        "full",
        "arange",
        "range",
        "tensor",
        "as_tensor",
        "asarray",
        "eye",
        "linspace",
        "logspace",
        "rand",
        "randn",
        "randint",
        "randperm",
        "normal",
        "empty_strided",
        "scalar_tensor",
        "tril_indices",
        "triu_indices",
        "complex",
        "polar",
        "Tensor",
        "FloatTensor",
        "DoubleTensor",
        "LongTensor",
        "IntTensor",
        "BoolTensor",
        "HalfTensor",
    }
)
"""torch functions that make a tensor on the default device unless told otherwise.
(``torch.normal`` with tensor arguments follows them, but a factory form exists.)"""

EXEMPT: dict[str, str] = {
    "fedhmc/algorithms/delayed/": "delayed SGLD's workers share their chains in CPU memory "
    "(share_memory_) across processes: it runs on the CPU by design, and refuses x0 elsewhere",
    "fedhmc/experiments/gaussian_dim.py": "a closed-form Gaussian experiment on the CPU "
    "(fedhmc experiment refuses --device for it)",
    "fedhmc/experiments/debiased_gaussian.py": "a closed-form Gaussian experiment on the CPU",
    "fedhmc/experiments/stale_gaussian.py": "a closed-form Gaussian experiment on the CPU",
    "fedhmc/experiments/stale_variance.py": "a small simulated experiment on the CPU",
    "fedhmc/experiments/delayed_sgld.py": "delayed SGLD runs on the CPU by design",
    "fedhmc/experiments/blr.py": "simulated Bayesian logistic regression (d ≤ 100) on the CPU",
    "fedhmc/experiments/blr_t.py": "simulated Bayesian logistic regression on the CPU",
    "fedhmc/experiments/blr_eta.py": "reads the committed samples back on the CPU",
    "fedhmc/experiments/participation.py": "its Gaussian part runs on the CPU (the data part "
    "runs its cells on --device)",
}
"""Files (or folders, ending in /) allowed to create CPU tensors implicitly, with why."""


def factory_calls_without_device(source: str) -> list[tuple[int, str]]:
    """(line, name) of every torch tensor factory in ``source`` that passes no ``device=``.

    Calls are recognised as ``torch.NAME(...)``, through any alias of ``torch`` and of its
    functions imported by name (``import torch as t``; ``from torch import zeros``). A call
    that unpacks ``**kwargs`` is taken to pass the device (``torch.zeros(n, **like)``).
    """
    tree = ast.parse(source)
    torch_names: set[str] = set()
    direct: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "torch":
                    torch_names.add(a.asname or "torch")
        elif isinstance(node, ast.ImportFrom) and node.module == "torch":
            for a in node.names:
                if a.name in FACTORIES:
                    direct[a.asname or a.name] = a.name
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            if f.value.id not in torch_names or f.attr not in FACTORIES:
                continue
            name = f.attr
        elif isinstance(f, ast.Name) and f.id in direct:
            name = direct[f.id]
        else:
            continue
        if any(k.arg == "device" or k.arg is None for k in node.keywords):
            continue
        found.append((node.lineno, name))
    return found


def _exemption(rel: str) -> str | None:
    for place, reason in EXEMPT.items():
        if rel == place or (place.endswith("/") and rel.startswith(place)):
            return reason
    return None


def _library_files() -> list[Path]:
    return sorted(p for d in SOURCES for p in (ROOT / d).rglob("*.py"))


def test_every_tensor_factory_names_its_device():
    offenders = []
    for path in _library_files():
        rel = path.relative_to(ROOT).as_posix()
        if _exemption(rel) is not None:
            continue
        for line, name in factory_calls_without_device(path.read_text()):
            offenders.append(f"{rel}:{line}: torch.{name}(...) without device=")
    assert not offenders, (
        "tensor factories on the default device (pass device=, or derive from a tensor with "
        "*_like / new_*; or list the place in EXEMPT with its reason):\n" + "\n".join(offenders)
    )


def test_every_exemption_exists_and_is_needed():
    """A listed place that no longer exists, or creates no CPU tensor, is a stale entry."""
    for place in EXEMPT:
        target = ROOT / place
        assert target.exists(), f"EXEMPT lists {place}, which does not exist"
        files = sorted(target.rglob("*.py")) if place.endswith("/") else [target]
        assert any(factory_calls_without_device(p.read_text()) for p in files), (
            f"EXEMPT lists {place}, which creates no tensor without device=: drop the entry"
        )


@pytest.mark.parametrize(
    "code, count",
    [
        ("import torch\nx = torch.zeros(3)\n", 1),
        ("import torch\nx = torch.zeros(3, device=y.device)\n", 0),
        ("import torch\nx = torch.zeros_like(y)\ny.new_zeros(3)\n", 0),
        ("import torch as T\nx = T.arange(5, dtype=T.int64)\n", 1),
        ("from torch import tensor\nx = tensor([1, 2])\n", 1),
        ("from torch import tensor as mk\nx = mk([1, 2], device='cpu')\n", 0),
        ("import torch\ndef f():\n    return torch.randn(2, generator=g)\n", 1),
        ("import torch\nx = torch.as_tensor(a, dtype=torch.float64).cpu()\n", 1),
        ("import torch\nx = torch.full((2,), 1.0, **kw)\n", 0),
        ("import torch\nx = torch.LongTensor([1])\n", 1),
        ("import numpy as np\nx = np.zeros(3)\n", 0),
        ("import torch\nx = torch.cat([a, b])\n", 0),
    ],
)
def test_the_check_catches_made_up_code(code, count):
    assert len(factory_calls_without_device(code)) == count


def test_a_planted_factory_fails_the_check(tmp_path, monkeypatch):
    """The whole check fails on a library file with a CPU-default factory in it."""
    bad = tmp_path / "fedhmc" / "core"
    bad.mkdir(parents=True)
    (bad / "planted.py").write_text("import torch\n\n\ndef f(n):\n    return torch.ones(n)\n")
    for d in ("server", "clients", "datasets"):
        (tmp_path / d).mkdir()
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    with pytest.raises(AssertionError, match=r"fedhmc/core/planted.py:5: torch.ones"):
        test_every_tensor_factory_names_its_device()
