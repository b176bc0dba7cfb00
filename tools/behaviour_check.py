"""Check that a refactor leaves fedhmc's behaviour unchanged, run for run.

Two subcommands:

``record --tree PATH --out DIR [-j N] [--only SUBSTR] [--force]``
    Runs a fixed list of small ``fedhmc run`` cases (engine backend, ``--threads 1``, a fixed
    seed, float64 unless a case says otherwise, a few rounds each) with the fedhmc source
    tree at PATH, N runs at a time (default 4), and writes each case's run folder to
    ``DIR/<case>/run/`` next to ``cmd.txt``, ``stderr.txt``, ``rc.txt``, ``imports.txt``
    (where every fedhmc module was imported from) and, for a run the CLI refuses,
    ``refused.txt`` (stderr's last line, with DIR and PATH replaced by placeholders).

    The venv's editable install maps ``fedhmc``, ``fedhmc_datasets``, ``fedhmc_server`` and
    ``fedhmc_clients`` to /work/main; each run therefore starts through a small bootstrap
    (``python -c ...``) that removes the editable finder, puts PATH first on ``sys.path``,
    maps the three namespace packages to PATH/datasets, PATH/server and PATH/clients, and,
    at exit, checks that every loaded fedhmc module came from PATH (a run whose modules
    came from elsewhere fails with rc 97).

``compare OLD_DIR NEW_DIR``
    For each case: both runs' ``metrics.csv`` must have the same columns and, in every
    column but the wall-time ones (a name containing ``wall`` or ``time``), byte-identical
    text, row for row; ``samples.npy`` (where written) must be equal; a case refused by both
    trees must be refused with the same message. Prints one line per case (ok, DIFFERENT
    with the first differing round and columns, or missing) and a total; exits 1 if any
    case differs or is missing.

Typical use (the tree before the refactor as a git worktree)::

    git worktree add /tmp/fedhmc-base <commit>
    .venv/bin/python tools/behaviour_check.py record --tree /tmp/fedhmc-base --out /tmp/old
    .venv/bin/python tools/behaviour_check.py record --tree . --out /tmp/new
    .venv/bin/python tools/behaviour_check.py compare /tmp/old /tmp/new

The cases cross the heterogeneous Gaussian target (``gaussian-hetero``) and ``digits`` with
every algorithm the engine runs (fahmc, fald, fahmc-debiased, sghmc, sgld), both protocols
where the algorithm allows them (fahmc, fald) and full or partial participation with each
``--participation`` scheme where it applies (fahmc, fald); then a few cases with other
settings, and a few that the CLI must refuse. The asynchronous algorithms run only on
Flower, with timing-dependent results: they are listed as skipped.

Stdlib and numpy only.
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PYTHON = sys.executable

# The registry's facts (fedhmc/algorithms/registry.py at the commit the baseline is taken
# from), fixed here so that both trees run the same list of cases.
ENGINE_ALGORITHMS = {
    # name: (protocols, partial participation)
    "fahmc": (("algorithm3", "authors"), True),
    "fald": (("algorithm3", "authors"), True),
    "fahmc-debiased": (("algorithm3",), False),
    "sghmc": (("algorithm3",), False),
    "sgld": (("algorithm3",), False),
}
SKIPPED = [
    ("async-sghmc, async-sgld", "Flower only, results depend on timing"),
    ("fahmc-debiased x authors", "registry: protocols = (algorithm3,); one refusal case"),
    ("sghmc, sgld x authors", "registry: protocols = (algorithm3,); one refusal case"),
    (
        "fahmc-debiased x partial participation",
        "registry: partial_participation = False (needs every client's gradient); one refusal case",
    ),
    (
        "sghmc, sgld x partial participation",
        "registry: partial_participation = False (pooled data); one refusal case",
    ),
]
PARTICIPATION = ("weighted", "uniform", "normalized")

DATASETS = {
    # dataset: options every case on it takes
    "gaussian-hetero": ["--chains", "16"],
    "digits": ["--chains", "2"],
}
COMMON = ["--backend", "engine", "--threads", "1", "--quiet", "--rounds", "8"]

BOOTSTRAP = r"""
import atexit, os, sys, types
tree = os.path.realpath(sys.argv[1]); sys.argv = ["fedhmc"] + sys.argv[2:]
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in repr(f)]
sys.path_hooks[:] = [h for h in sys.path_hooks if "_Editable" not in repr(h)]
sys.path[:] = [tree] + [p for p in sys.path if "__editable__" not in p]
sys.path_importer_cache.clear()
for name, sub in (("fedhmc_datasets", "datasets"), ("fedhmc_server", "server"),
                  ("fedhmc_clients", "clients")):
    d = os.path.join(tree, sub)
    if os.path.exists(os.path.join(d, "__init__.py")):
        continue
    m = types.ModuleType(name); m.__path__ = [d]; sys.modules[name] = m
def _check():
    mods = {"fedhmc", "fedhmc_datasets", "fedhmc_server", "fedhmc_clients"}
    bad, n = [], 0
    for k, m in list(sys.modules.items()):
        if k.split(".")[0] in mods and getattr(m, "__file__", None):
            n += 1
            if not os.path.realpath(m.__file__).startswith(tree + os.sep):
                bad.append(k + " " + m.__file__)
    with open(os.environ["BEHAVIOUR_CHECK_IMPORTS"], "w") as f:
        import fedhmc
        f.write("fedhmc " + fedhmc.__file__ + "\n%d modules from the tree\n" % n)
        f.writelines("OUTSIDE " + b + "\n" for b in bad)
    if bad:
        os._exit(97)
atexit.register(_check)
from fedhmc.cli.main import main
sys.exit(main())
"""


def cases() -> dict[str, list[str]]:
    """The fixed list of cases: name -> options after ``fedhmc run``."""
    out: dict[str, list[str]] = {}
    for ds, ds_opts in DATASETS.items():
        short = "gauss" if ds.startswith("gaussian") else ds
        base = ["--dataset", ds, *ds_opts, "--dtype", "float64", "--seed", "3"]
        for alg, (protocols, partial) in ENGINE_ALGORITHMS.items():
            for proto in protocols:
                opts = [*base, "--algorithm", alg, "--protocol", proto]
                if ds == "digits" and proto == "authors":
                    opts += ["--step-size", "0.001"]  # 0.01 explodes at temperature 0.005
                out[f"{short}-{alg}-{proto}-full"] = opts
                if partial:
                    for scheme in PARTICIPATION:
                        out[f"{short}-{alg}-{proto}-S3-{scheme}"] = [
                            *opts,
                            "--clients-per-round",
                            "3",
                            "--participation",
                            scheme,
                        ]
    g = ["--dataset", "gaussian-hetero", *DATASETS["gaussian-hetero"], "--dtype", "float64"]
    d = ["--dataset", "digits", *DATASETS["digits"], "--dtype", "float64"]
    extra = {
        # other settings
        "gauss-fahmc-K3T2-rho0.5": [*g, "--leapfrog-steps", "3", "--local-steps", "2",
                                    "--rho", "0.5", "--seed", "11"],
        "digits-fahmc-K3T2-rho0.5": [*d, "--leapfrog-steps", "3", "--local-steps", "2",
                                     "--rho", "0.5", "--seed", "11"],
        "gauss-fahmc-gradnoise": [*g, "--grad-noise", "0.1", "--seed", "5"],
        "digits-fald-gradnoise-temp": [*d, "--algorithm", "fald", "--grad-noise", "0.05",
                                       "--temperature", "0.5", "--seed", "5"],
        "gauss-fahmc-leapfrog-restart": [*g, "--sync-unit", "leapfrog", "--local-steps", "4",
                                         "--restart-trajectories", "--seed", "6"],
        "digits-fahmc-leapfrog-fresh": [*d, "--sync-unit", "leapfrog", "--local-steps", "3",
                                        "--fresh-gradients", "--seed", "6"],
        "digits-fahmc-reshuffle-S4": [*d, "--minibatch", "reshuffle", "--clients-per-round",
                                      "4", "--seed", "8"],
        "digits-debiased-anchor16": [*d, "--algorithm", "fahmc-debiased",
                                     "--anchor-batch-size", "16", "--seed", "9"],
        "gauss-debiased-K3T3": [*g, "--algorithm", "fahmc-debiased", "--leapfrog-steps", "3",
                                "--local-steps", "3", "--seed", "9"],
        "digits-sghmc-stale3": [*d, "--algorithm", "sghmc", "--staleness", "3", "--seed", "4"],
        "gauss-sghmc-stale2-uniform-friction": [*g, "--algorithm", "sghmc", "--staleness",
                                                "2", "--staleness-dist", "uniform",
                                                "--friction", "5", "--seed", "4"],
        "gauss-sgld-stale2": [*g, "--algorithm", "sgld", "--staleness", "2", "--seed", "4"],
        "digits-sgld-gradnoise": [*d, "--algorithm", "sgld", "--grad-noise", "0.05",
                                  "--seed", "4"],
        "digits-fahmc-mlp": [*d, "--model", "mlp", "--hidden", "16", "--seed", "2"],
        "digits-fahmc-cnn": [*d, "--model", "cnn", "--chains", "2", "--step-size", "0.001",
                            "--seed", "2"],
        "digits-debiased-cnn": [*d, "--model", "cnn", "--algorithm", "fahmc-debiased",
                                "--step-size", "0.001", "--seed", "2"],
        "digits-fald-cnn-S3": [*d, "--model", "cnn", "--algorithm", "fald",
                               "--clients-per-round", "3", "--seed", "2"],
        "digits-fahmc-iid-N5": [*d, "--partition", "iid", "--num-clients", "5", "--seed", "2"],
        "digits-fahmc-shards": [*d, "--partition", "shards", "--seed", "2"],
        "digits-fahmc-float32": ["--dataset", "digits", *DATASETS["digits"], "--dtype",
                                 "float32", "--seed", "2"],
        "gauss-fahmc-float32": ["--dataset", "gaussian-hetero", *DATASETS["gaussian-hetero"],
                                "--dtype", "float32", "--seed", "2"],
        "gauss-fahmc-dim5-thin2-samples": [*g, "--dim", "5", "--burn-in", "3", "--thin", "2",
                                           "--save-samples", "--seed", "2"],
        "digits-fahmc-authors-samples": [*d, "--protocol", "authors", "--save-samples",
                                         "--step-size", "0.001", "--thin", "2",
                                         "--seed", "2"],
        # combinations the CLI must refuse
        "refuse-debiased-partial": [*g, "--algorithm", "fahmc-debiased",
                                    "--clients-per-round", "3"],
        "refuse-debiased-authors": [*d, "--algorithm", "fahmc-debiased", "--protocol",
                                    "authors"],
        "refuse-sghmc-authors": [*g, "--algorithm", "sghmc", "--protocol", "authors"],
        "refuse-sgld-partial": [*d, "--algorithm", "sgld", "--clients-per-round", "3"],
        "refuse-async-engine": [*d, "--algorithm", "async-sgld", "--num-clients", "4"],
    }  # fmt: skip
    out.update(extra)
    return out


def run_case(tree: Path, out: Path, name: str, opts: list[str]) -> tuple[str, str, float]:
    """Run one case; returns (name, status, seconds)."""
    case = out / name
    case.mkdir(parents=True)
    run_dir = case / "run"
    argv = [PYTHON, "-c", BOOTSTRAP, str(tree), "run", *COMMON, *opts, "--out", str(run_dir)]
    env = dict(os.environ)
    env.update(
        BEHAVIOUR_CHECK_IMPORTS=str(case / "imports.txt"),
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
        PYTHONHASHSEED="0",
    )
    env.pop("PYTHONPATH", None)
    (case / "cmd.txt").write_text(" ".join(["fedhmc", "run", *COMMON, *opts]) + "\n")
    t0 = time.perf_counter()
    try:
        p = subprocess.run(argv, env=env, cwd=case, capture_output=True, text=True, timeout=300)
        rc, err = p.returncode, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, err = -9, (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else ""
    dt = time.perf_counter() - t0
    (case / "stderr.txt").write_text(err)
    (case / "rc.txt").write_text(f"{rc}\n")
    if rc == 97:
        return name, "IMPORTED FROM OUTSIDE THE TREE (see imports.txt)", dt
    if rc != 0:
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        last = lines[-1] if lines else f"(rc {rc}, no stderr)"
        last = last.replace(str(out), "<OUT>").replace(str(tree), "<TREE>")
        (case / "refused.txt").write_text(f"rc {rc}: {last}\n")
        return name, f"refused: {last}", dt
    return name, "ran", dt


def record(args) -> int:
    tree = Path(args.tree).resolve()
    out = Path(args.out).resolve()
    if not (tree / "fedhmc" / "__init__.py").exists():
        sys.exit(f"{tree} holds no fedhmc package")
    if out.exists() and any(out.iterdir()):
        if not args.force:
            sys.exit(f"{out} is not empty (--force replaces it)")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    todo = {k: v for k, v in cases().items() if not args.only or args.only in k}
    print(f"recording {len(todo)} cases from {tree} into {out}, {args.jobs} at a time")
    for what, why in SKIPPED:
        print(f"  skipped: {what}: {why}")
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        futs = [pool.submit(run_case, tree, out, k, v) for k, v in todo.items()]
        results = [f.result() for f in futs]
    total = time.perf_counter() - t0
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = ru.ru_utime + ru.ru_stime
    bad = 0
    for name, status, dt in results:
        print(f"  {name:42s} {dt:6.1f}s  {status}")
        bad += status.startswith("IMPORTED")
    imports = (out / results[0][0] / "imports.txt").read_text().splitlines()[0]
    print(f"{len(results)} cases in {total:.1f}s wall, {cpu:.1f}s CPU; imported: {imports}")
    (out / "record.txt").write_text(
        f"tree {tree}\ncases {len(results)}\nwall_s {total:.1f}\ncpu_s {cpu:.1f}\n"
    )
    return 1 if bad else 0


def _timing(col: str) -> bool:
    c = col.lower()
    return "wall" in c or "time" in c


def _read(path: Path) -> tuple[list[str], list[list[str]]]:
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    return (rows[0], rows[1:]) if rows else ([], [])


def compare_case(old: Path, new: Path) -> str:
    """'ok', 'ok (refused by both)', or why not."""
    ro, rn = old / "refused.txt", new / "refused.txt"
    mo, mn = old / "run" / "metrics.csv", new / "run" / "metrics.csv"
    if ro.exists() or rn.exists():
        if ro.exists() and rn.exists():
            a, b = ro.read_text(), rn.read_text()
            if a == b:
                return "ok (refused by both)"
            return f"DIFFERENT refusal: old {a.strip()!r} new {b.strip()!r}"
        which, other = ("old", "new") if ro.exists() else ("new", "old")
        msg = (ro if ro.exists() else rn).read_text().strip()
        return f"DIFFERENT: only {which} refused ({msg}); {other} ran"
    if not mo.exists() or not mn.exists():
        return "missing metrics.csv in " + " and ".join(
            w for w, p in (("old", mo), ("new", mn)) if not p.exists()
        )
    ho, rows_o = _read(mo)
    hn, rows_n = _read(mn)
    problems = []
    if ho != hn:
        only_o = [c for c in ho if c not in hn]
        only_n = [c for c in hn if c not in ho]
        order = "" if only_o or only_n else ", same columns in another order"
        problems.append(f"columns differ (old only {only_o}, new only {only_n}{order})")
    if len(rows_o) != len(rows_n):
        problems.append(f"rows: old {len(rows_o)}, new {len(rows_n)}")
    cols = [c for c in ho if c in hn and not _timing(c)]
    io, inn = {c: i for i, c in enumerate(ho)}, {c: i for i, c in enumerate(hn)}
    for r, (a, b) in enumerate(zip(rows_o, rows_n, strict=False)):
        diff = [c for c in cols if a[io[c]] != b[inn[c]]]
        if diff:
            rnd = a[io["round"]] if "round" in io else str(r + 1)
            c = diff[0]
            problems.append(
                f"first at round {rnd}: {', '.join(diff)} (e.g. {c}: {a[io[c]]} vs {b[inn[c]]})"
            )
            break
    so, sn = old / "run" / "samples.npy", new / "run" / "samples.npy"
    if so.exists() or sn.exists():
        if not (so.exists() and sn.exists()):
            problems.append("samples.npy only in " + ("old" if so.exists() else "new"))
        else:
            import numpy as np

            a, b = np.load(so), np.load(sn)
            if a.shape != b.shape or a.dtype != b.dtype or a.tobytes() != b.tobytes():
                problems.append(f"samples.npy differs ({a.shape} {a.dtype} vs {b.shape} {b.dtype})")
    return "ok" if not problems else "DIFFERENT: " + "; ".join(problems)


def compare(args) -> int:
    old, new = Path(args.old), Path(args.new)
    names = sorted({p.name for d in (old, new) if d.is_dir() for p in d.iterdir() if p.is_dir()})
    expected = set(cases())
    unknown = [n for n in names if n not in expected]
    bad = 0
    for name in names:
        o, n = old / name, new / name
        if not o.is_dir() or not n.is_dir():
            status = f"missing in {'old' if not o.is_dir() else 'new'}"
        else:
            status = compare_case(o, n)
        bad += not status.startswith("ok")
        print(f"{name:42s} {status}")
    for what, why in SKIPPED:
        print(f"{'skipped: ' + what:42s} {why}")
    not_recorded = sorted(expected - set(names))
    if not_recorded:
        print(f"note: {len(not_recorded)} cases of this script's list are in neither folder")
    if unknown:
        print(f"note: {len(unknown)} cases not in this script's list: {', '.join(unknown)}")
    print(f"total: {len(names)} cases, {len(names) - bad} ok, {bad} different or missing")
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="run the cases with the tree at --tree")
    r.add_argument("--tree", required=True, help="a fedhmc source tree (repository root)")
    r.add_argument("--out", required=True, help="folder for the cases' run folders")
    r.add_argument("-j", "--jobs", type=int, default=4, help="runs at a time (default 4)")
    r.add_argument("--only", help="record only the cases whose name contains this")
    r.add_argument("--force", action="store_true", help="replace a non-empty --out")
    c = sub.add_parser("compare", help="compare two records")
    c.add_argument("old")
    c.add_argument("new")
    sub.add_parser("list", help="print the cases and the skipped combinations")
    args = ap.parse_args(argv)
    if args.cmd == "record":
        return record(args)
    if args.cmd == "compare":
        return compare(args)
    for name, opts in cases().items():
        print(f"{name:42s} {' '.join(opts)}")
    for what, why in SKIPPED:
        print(f"skipped: {what}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
