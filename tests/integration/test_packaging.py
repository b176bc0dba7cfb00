"""Packaging: every import is ours, `datasets` stays with its owner, the core has no flwr."""

import pkgutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # packaging

ROOT = Path(__file__).resolve().parents[2]
OUR_TOP_LEVEL = {"fedhmc", "fedhmc_datasets", "fedhmc_server", "fedhmc_clients"}


def _fake_owner(tmp_path):
    site = tmp_path / "site"
    (site / "datasets").mkdir(parents=True)
    (site / "datasets" / "__init__.py").write_text("OWNER = 'huggingface'\n")
    return site


@pytest.mark.parametrize("cwd", ["repo", "elsewhere"])
def test_installed_fedhmc_leaves_import_datasets_to_its_owner(tmp_path, cwd):
    site = _fake_owner(tmp_path)
    code = (
        "import fedhmc, fedhmc.cli, fedhmc_datasets.registry, fedhmc_datasets.partition\n"
        "import datasets\n"
        "assert getattr(datasets, 'OWNER', None) == 'huggingface', datasets\n"
        "print('ok')\n"
    )
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT if cwd == "repo" else tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr


def test_without_an_owner_datasets_is_not_importable_from_elsewhere(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", "import fedhmc_datasets.registry\nimport datasets"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    try:
        import datasets  # noqa: F401

        pytest.skip("a real `datasets` package is installed here")
    except ImportError:
        pass
    assert proc.returncode != 0 and "No module named 'datasets'" in proc.stderr


def test_wheel_installs_only_names_of_ours(tmp_path):
    pytest.importorskip("setuptools")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    (wheel,) = tmp_path.glob("fedhmc-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert {"fedhmc", "fedhmc_datasets"} <= tops <= OUR_TOP_LEVEL, tops
    assert any(n.startswith("fedhmc_datasets/") for n in names)


def test_core_never_imports_flwr():
    """Importing every module of fedhmc (all layers) loads no flwr module. The static check
    of the sources is tests/unit/test_layers.py."""
    import fedhmc

    mods = [
        m.name
        for m in pkgutil.walk_packages(fedhmc.__path__, "fedhmc.")
        if not m.name.endswith("__main__")
    ]
    assert "fedhmc.algorithms.fahmc" in mods and "fedhmc.cli.main" in mods
    code = (
        "import importlib, sys\n"
        f"for m in {mods!r}:\n"
        "    importlib.import_module(m)\n"
        "assert not any(k == 'flwr' or k.startswith('flwr.') for k in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_the_app_ships_the_library_only_and_the_staged_copy_builds_the_same_fab(tmp_path):
    """`flwr run` ships pyproject.toml and fedhmc/*.py (Flower unpacks the app for every
    message, so docs and results would cost time on each); deploy/run.sh's staged copy of
    the app builds the very FAB that the repository root builds."""
    from flwr.cli.build import build_fab_from_disk

    sys.path.insert(0, str(ROOT / "deploy"))
    try:
        from stage_app import stage
    finally:
        sys.path.remove(str(ROOT / "deploy"))
    staged = stage(tmp_path / "app")
    from_root = build_fab_from_disk(ROOT)
    assert build_fab_from_disk(staged) == from_root
    import io

    names = zipfile.ZipFile(io.BytesIO(from_root)).namelist()
    shipped = [n for n in names if not n.startswith(".info/")]
    assert "pyproject.toml" in shipped and "fedhmc/__init__.py" in shipped
    assert all(
        n == "pyproject.toml" or (n.startswith("fedhmc/") and n.endswith(".py")) for n in shipped
    ), shipped


def test_the_server_app_imports_no_torch():
    """The ServerApp sends the size query before it imports PyTorch (start-up overlap)."""
    code = "import sys, fedhmc_server.app; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_client_app_imports_no_torch_nor_the_runtime():
    """Flower starts a ClientApp process for every message, so what the ClientApp imports
    is paid every round: it forwards to the node's warm worker and imports neither PyTorch
    nor fedhmc.runtime (importing fedhmc.runtime.wire for an error code cost ~2 s a round)."""
    code = (
        "import sys, fedhmc_clients.app; "
        "print(sorted(m for m in ('torch', 'sklearn', 'fedhmc.runtime') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
