"""Fault injection for a fedhmc deployment: what a run loses when things break.

    python deploy/faults.py [--out DIR] [--only NAME ...] [--soak-rounds N]

Each case starts its own loopback deployment with TLS and SuperNode authentication
(deploy/loopback.py, through the deploy/*.sh recipe), breaks something on purpose while a
run is in flight, and records what happened, round by round:

- ``supernode-kill``: ``kill -9`` of one SuperNode, its worker and everything they
  started, mid-round; restarted two rounds later with the same key;
- ``straggler``: one SuperNode, its worker and their children frozen (SIGSTOP) for longer
  than ``round-timeout``, then resumed (SIGCONT);
- ``superlink-restart``: the SuperLink machine's processes killed (SuperLink, its
  executor and the ServerApp), the SuperLink restarted on its database, and the run
  submitted again with ``resume=true``; compared with the same run without the fault;
- ``soak``: a long Flower simulation (``fedhmc run --backend flower``), with the resident
  memory, open files and processes of the whole process tree sampled as it runs;
- ``bad-replies``: the test-suite cases for malformed replies (NaN, shapes, dtypes,
  sizes; synchronous, debiased and asynchronous) and an unregistered SuperNode.

Results go to ``DIR/faults.json`` and a table ``DIR/faults.md`` (default
``docs/results/faults``). Needs Flower's executables on PATH (the project's environment).
The whole suite takes about 15 minutes on 2 cores. Exits with 1 when a case run now failed
(it could not run, its run did not complete, or a test-suite selection did not pass or ran
no test), each failure named on stderr; 2 when a tool is missing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Run as a script, this file's folder is first on the path: loopback is deploy/loopback.py.
from loopback import (
    ROOT,
    SEARCH_PATH,
    Deployment,
    metrics_rows,
    missing_tools,
    processes,
    signal_tree,
    summary,
    tree,
    wait_until,
)

RUN = (
    'num-clients=3 local-steps=2 leapfrog-steps=3 on-failure="renormalize" '
    "node-wait-timeout=120 checkpoint-every=1 save-samples=true"
)
COMPARE = ("round", "samples", "accuracy", "brier", "ece", "nll_mean", "nll_sum", "grad_evals")


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, flush=True)


def per_round(out: Path) -> list[dict]:
    return [
        {"round": int(r["round"]), "clients": int(r["clients"]), "failed": int(r["failed"])}
        for r in metrics_rows(out)
    ]


def rounds_done(proc: subprocess.Popen, out: Path, n: int, log_file: Path) -> None:
    """Wait until ``n`` rounds are in metrics.csv; fail at once if ``flwr run`` ended."""

    def ready():
        if len(metrics_rows(out)) >= n:
            return True
        if proc.poll() is not None and summary(out).get("status") != "running":
            raise RuntimeError(f"the run ended before round {n}: {log_file.read_text()[-600:]}")
        return False

    wait_until(ready, 600, f"round {n}")


def finish(dep: Deployment, proc: subprocess.Popen, out: Path, timeout: float) -> dict:
    """Wait for the submitted run's summary to leave "running"."""
    wait_until(
        lambda: summary(out).get("status") not in (None, "running"), timeout, "the run's end", 1.0
    )
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
    return summary(out)


# --------------------------------------------------------------------------- cases
@contextlib.contextmanager
def started(work: Path, num_nodes: int = 3):
    """A set-up loopback deployment with its SuperNodes started; everything is stopped
    afterwards, and anything left running is reported."""
    dep = Deployment(work, num_nodes=num_nodes)
    try:
        dep.setup()
        dep.start_nodes()
        yield dep
    finally:
        left = dep.stop_all()
        if left:
            log(f"left running: {left}")


def case_supernode_kill(work: Path) -> dict:
    with started(work) as dep:
        out = work / "run"
        proc = dep.submit(f'{RUN} rounds=8 round-timeout=60 out="{out}"', work / "flwr.log")
        rounds_done(proc, out, 2, work / "flwr.log")
        time.sleep(1.0)  # round 3 is in flight
        t_kill = time.monotonic()
        killed = [p for pid in dep.pids("client2") for p in signal_tree(pid, signal.SIGKILL)]
        log(f"supernode-kill: killed client2 ({len(killed)} processes) during round 3")
        rounds_done(proc, out, 3, work / "flwr.log")
        detect_s = time.monotonic() - t_kill
        rounds_done(proc, out, 4, work / "flwr.log")
        dep.start_nodes([2])
        log("supernode-kill: client2 restarted")
        s = finish(dep, proc, out, 600)
        rounds = per_round(out)
        back = [r["round"] for r in rounds if r["round"] > 4 and r["clients"] == 3]
        return {
            "status": s.get("status"),
            "rounds": rounds,
            "round_3_detected_after_s": round(detect_s, 1),
            "client_failures": s.get("client_failures"),
            "rejoined_in_round": back[0] if back else None,
        }


def case_straggler(work: Path, timeout_s: float = 30.0) -> dict:
    """Freeze one node in round 3 for longer than the round timeout and for at least two
    more rounds, then let it go on, and see whether it takes part again."""
    with started(work) as dep:
        out = work / "run"
        proc = dep.submit(
            f'{RUN} rounds=10 round-timeout={timeout_s:g} out="{out}"', work / "flwr.log"
        )
        rounds_done(proc, out, 2, work / "flwr.log")
        time.sleep(1.0)
        frozen = [p for pid in dep.pids("client1") for p in signal_tree(pid, signal.SIGSTOP)]
        t0 = time.monotonic()
        log(f"straggler: froze client1 ({len(frozen)} processes) in round 3")
        rounds_done(proc, out, 5, work / "flwr.log")
        time.sleep(max(0.0, timeout_s + 10 - (time.monotonic() - t0)))
        pause_s = time.monotonic() - t0
        for p in frozen:
            try:
                os.kill(p, signal.SIGCONT)
            except ProcessLookupError:
                pass
        resumed_at = len(metrics_rows(out))
        log(f"straggler: client1 resumed after {pause_s:.0f} s, after round {resumed_at}")
        s = finish(dep, proc, out, 900)
        rounds = per_round(out)
        missed = [r["round"] for r in rounds if r["failed"]]
        back = [r["round"] for r in rounds if r["round"] > resumed_at and not r["failed"]]
        return {
            "status": s.get("status"),
            "rounds": rounds,
            "pause_s": round(pause_s, 1),
            "round_timeout_s": timeout_s,
            "resumed_after_round": resumed_at,
            "rounds_missed": missed,
            "late_replies": s.get("late_replies"),
            "back_in_round": back[0] if back else None,
        }


def still_alive(pids: list[int]) -> list[int]:
    """The PIDs of ``pids`` still alive (a zombie is dead: it only waits to be reaped)."""
    procs = processes()
    return [p for p in pids if p in procs and not procs[p][1].startswith("Z")]


def _same(a: Path, b: Path) -> dict:
    import numpy as np

    ra, rb = metrics_rows(a), metrics_rows(b)
    rows_equal = len(ra) == len(rb) and all(
        x[k] == y[k] for x, y in zip(ra, rb, strict=True) for k in COMPARE
    )
    sa, sb = np.load(a / "samples.npy"), np.load(b / "samples.npy")
    return {
        "metrics_equal": rows_equal,
        "samples_equal": bool(sa.shape == sb.shape and np.array_equal(sa, sb)),
        "samples_shape": list(sa.shape),
    }


def case_superlink_restart(work: Path) -> dict:
    with started(work) as dep:
        ref = work / "reference"
        proc = dep.submit(f'{RUN} rounds=6 round-timeout=60 out="{ref}"', work / "ref.log")
        s_ref = finish(dep, proc, ref, 900)
        log(f"superlink-restart: reference run {s_ref.get('status')}")
        out = work / "run"
        proc = dep.submit(f'{RUN} rounds=6 round-timeout=60 out="{out}"', work / "flwr.log")
        rounds_done(proc, out, 3, work / "flwr.log")
        time.sleep(1.0)
        in_round = len(metrics_rows(out)) + 1
        killed = signal_tree(dep.pid("superlink"), signal.SIGKILL)
        # A machine crash takes its ServerApp too, wherever it runs.
        for pid, (_, st, cmd) in processes().items():
            if "flwr-serverapp" in cmd and dep.marker.search(cmd) and not st.startswith("Z"):
                killed += signal_tree(pid, signal.SIGKILL)
        proc.kill()
        log(f"superlink-restart: killed {len(killed)} processes at round {len(metrics_rows(out))}")
        # The machine is down only once they are gone: a process killed while it waits on the
        # disk (the SuperLink's database) dies late, and superlink.sh refuses a live PID.
        wait_until(lambda: not still_alive(killed), 60, "the killed processes to exit", 0.1)
        t0 = time.monotonic()
        dep.start_link()
        proc = dep.submit(
            f'{RUN} rounds=6 round-timeout=60 resume=true out="{out}"', work / "resume.log"
        )
        s = finish(dep, proc, out, 900)
        return {
            "status": s.get("status"),
            "killed_in_round": in_round,
            "resumed_from_round": s.get("resumed_from_round"),
            "restart_to_end_s": round(time.monotonic() - t0, 1),
            "rounds": per_round(out),
            **_same(out, ref),
        }


def case_soak(work: Path, rounds: int) -> dict:
    """A long Flower simulation with the whole process tree sampled every few seconds."""
    out = work / "soak"
    env = {
        **os.environ,
        "PATH": SEARCH_PATH,
        "FLWR_HOME": str(work / "flwr-home"),
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_TMPDIR": str(work / "ray"),
    }
    cmd = [
        sys.executable,
        "-m",
        "fedhmc",
        "run",
        "--backend",
        "flower",
        "--num-clients",
        "3",
        "--local-steps",
        "1",
        "--leapfrog-steps",
        "1",
        "--rounds",
        str(rounds),
        "--out",
        str(out),
        "--quiet",
    ]
    proc = subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    samples = []
    t0 = time.monotonic()
    while proc.poll() is None:
        time.sleep(5.0)
        pids = tree(proc.pid)
        rss = fds = 0
        for p in pids:
            try:
                with open(f"/proc/{p}/statm") as f:
                    rss += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
                fds += len(os.listdir(f"/proc/{p}/fd"))
            except OSError:
                pass
        n = len(metrics_rows(out))
        if proc.poll() is not None or not pids:
            break  # ended while being sampled: not a steady-state sample
        samples.append(
            {
                "t": round(time.monotonic() - t0, 1),
                "round": n,
                "rss_mib": rss / 2**20,
                "fds": fds,
                "processes": len(pids),
            }
        )
    proc.wait()
    err = proc.stderr.read() if proc.stderr else ""
    time.sleep(3.0)
    left = [p for p, (_, st, c) in processes().items() if str(work) in c and not st.startswith("Z")]
    s = summary(out)
    # Steady state: after the first rounds (start-up) and before the last (shutdown).
    steady = [x for x in samples if min(200, rounds // 5) <= x["round"] < rounds]
    slope = None
    if len(steady) >= 3:
        import numpy as np

        r = np.array([x["round"] for x in steady], float)
        m = np.array([x["rss_mib"] for x in steady], float)
        slope = float(np.polyfit(r, m, 1)[0] * 1000)
    return {
        "status": s.get("status"),
        "exit_code": proc.returncode,
        "rounds": len(metrics_rows(out)),
        "wall_s": round(time.monotonic() - t0, 1),
        "rss_mib_first": round(steady[0]["rss_mib"], 1) if steady else None,
        "rss_mib_last": round(steady[-1]["rss_mib"], 1) if steady else None,
        "rss_slope_mib_per_1000_rounds": None if slope is None else round(slope, 2),
        "fds_first_last": [steady[0]["fds"], steady[-1]["fds"]] if steady else None,
        "processes_first_last": [steady[0]["processes"], steady[-1]["processes"]]
        if steady
        else None,
        "processes_left_after_exit": len(left),
        "stderr_tail": err[-500:],
        "samples": samples,
    }


def case_bad_replies(work: Path) -> dict:
    """The quick cases of the test suite, run and counted."""
    selections = {
        "synchronous replies (NaN, ±inf, shape, dtype, missing key, n_c)": [
            "tests/integration/test_flower.py",
            "-k",
            "bad_reply or validate_reply",
        ],
        "debiased replies: bad grad arrays": [
            "tests/integration/test_flower.py",
            "-k",
            "debiased_grad",
        ],
        "asynchronous gradients (NaN, inf, shape, dtype, missing)": [
            "tests/integration/test_async_flower.py",
            "-k",
            "bad_async_gradient",
        ],
        "a late reply to a timed-out round": [
            "tests/integration/test_flower.py",
            "-k",
            "late_reply",
        ],
        "an unregistered SuperNode": ["tests/integration/test_deploy.py", "-k", "two_rounds"],
    }
    results = {}
    for what, args in selections.items():
        if not (ROOT / args[0]).is_file():
            results[what] = {"passed": False, "pytest": f"no such file: {args[0]}"}
            continue
        res = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={**os.environ, "PATH": SEARCH_PATH},
        )
        last = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else res.stderr[-200:]
        results[what] = {"passed": res.returncode == 0, "pytest": last}
    return results


# --------------------------------------------------------------------------- report
def failures(results: dict, names) -> list[str]:
    """One line for each of the cases ``names`` that failed: it could not run, its run did
    not complete, a resumed run differs from the one without the fault, the soak left
    processes behind or exited with an error, or a test-suite selection did not pass (no
    test run counts as a failure)."""
    out = []
    for name in names:
        r = results.get(name)
        if not isinstance(r, dict):
            out.append(f"{name}: no result")
        elif "error" in r:
            out.append(f"{name}: could not run: {r['error']}")
        elif name == "bad-replies":
            out += [f"{name}: {what}: {v['pytest']}" for what, v in r.items() if not v["passed"]]
        elif r.get("status") != "completed":
            out.append(f"{name}: the run ended {r.get('status')!r}, not 'completed'")
        elif name == "superlink-restart" and not (r["metrics_equal"] and r["samples_equal"]):
            out.append(f"{name}: the resumed run differs from the run without the fault")
        elif name == "soak" and (r["exit_code"] != 0 or r["processes_left_after_exit"]):
            out.append(
                f"{name}: exit code {r['exit_code']}, "
                f"{r['processes_left_after_exit']} processes left after exit"
            )
    return out


def table(results: dict) -> str:
    lines = ["| fault | what happened | lost |", "|---|---|---|"]
    k = results.get("supernode-kill")
    if k and "error" not in k:
        fail = [r["round"] for r in k["rounds"] if r["failed"]]
        lines.append(
            f"| `kill -9` of 1 of 3 SuperNodes in round 3; restarted after round 4 | "
            f"run {k['status']}; rounds {fail} averaged the 2 others (round 3 ended "
            f"{k['round_3_detected_after_s']} s after the kill); the node rejoined in round "
            f"{k['rejoined_in_round']} | that node's contribution to rounds {fail} |"
        )
    st = results.get("straggler")
    if st and "error" not in st:
        lines.append(
            f"| 1 of 3 SuperNodes (and its worker) frozen by SIGSTOP in round 3 for "
            f"{st['pause_s']:g} s, past round-timeout = {st['round_timeout_s']:g} s, then "
            f"SIGCONT after round {st['resumed_after_round']} | run {st['status']}; rounds "
            f"{st['rounds_missed']} went on without it; late replies recognised and dropped: "
            f"{st['late_replies']}; back in round {st['back_in_round']} | its contribution "
            f"to rounds {st['rounds_missed']} |"
        )
    sl = results.get("superlink-restart")
    if sl and "error" not in sl:
        same = "identical" if sl["metrics_equal"] and sl["samples_equal"] else "DIFFERENT"
        lines.append(
            f"| SuperLink, its executor and the ServerApp killed (`kill -9`) in round "
            f"{sl['killed_in_round']}; SuperLink restarted on its database; run submitted "
            f"again with `resume=true` | run {sl['status']}, resumed from round "
            f"{sl['resumed_from_round']}; metrics and samples {same} to the run without the "
            f"fault | the round in flight (recomputed) |"
        )
    so = results.get("soak")
    if so and "error" not in so:
        lines.append(
            f"| {so['rounds']}-round Flower simulation | {so['status']} in {so['wall_s']:g} s; "
            f"resident memory of the process tree {so['rss_mib_first']} → "
            f"{so['rss_mib_last']} MiB, slope {so['rss_slope_mib_per_1000_rounds']} MiB per "
            f"1,000 rounds; open files {so['fds_first_last']}; processes "
            f"{so['processes_first_last']}, {so['processes_left_after_exit']} left after exit "
            f"| nothing |"
        )
    br = results.get("bad-replies")
    if br and "error" not in br:
        for what, r in br.items():
            verdict = "refused" if r["passed"] else "FAILED"
            lines.append(f"| {what} | {verdict} ({r['pytest']}) | that reply only |")
    for name, r in results.items():
        if isinstance(r, dict) and "error" in r:
            lines.append(f"| {name} | could not run: {r['error']} | |")
    return "\n".join(lines) + "\n"


CASES = ("supernode-kill", "straggler", "superlink-restart", "soak", "bad-replies")
HEADER = """# Fault injection on a deployment

Made by `python deploy/faults.py`: each case builds the deploy/ recipe on loopback (TLS,
SuperNode authentication, 3 SuperNodes with their warm workers, `digits`, `local-steps=2`,
`leapfrog-steps=3`, `on-failure="renormalize"`, `checkpoint-every=1`), breaks something while
a run is in flight and records what happened round by round (`faults.json` has every
round). Measured on a 2-core machine that was running other jobs at the same time. What
each failure means for a user is in `deploy/README.md`, "When
things fail".

"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "faults"))
    ap.add_argument("--only", nargs="+", choices=CASES, default=list(CASES))
    ap.add_argument("--soak-rounds", type=int, default=2000)
    ap.add_argument("--keep", action="store_true", help="keep the deployments' folders")
    ap.add_argument("--table-only", action="store_true", help="rewrite faults.md from faults.json")
    args = ap.parse_args(argv)
    if args.table_only:
        out = Path(args.out)
        results = json.loads((out / "faults.json").read_text())
        (out / "faults.md").write_text(HEADER + table(results))
        return 0
    missing = missing_tools()
    if missing:
        print(f"faults.py: not found on PATH: {', '.join(missing)}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "faults.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    base = Path(tempfile.mkdtemp(prefix="fedhmc-faults-"))
    try:
        for name in args.only:
            log(f"case {name}")
            work = base / name
            work.mkdir()
            t0 = time.monotonic()
            try:
                if name == "supernode-kill":
                    r = case_supernode_kill(work)
                elif name == "straggler":
                    r = case_straggler(work)
                elif name == "superlink-restart":
                    r = case_superlink_restart(work)
                elif name == "soak":
                    r = case_soak(work, args.soak_rounds)
                else:
                    r = case_bad_replies(work)
            except Exception as e:  # noqa: BLE001 (reported in the table, the suite goes on)
                r = {"error": f"{type(e).__name__}: {' '.join(str(e).split())}"}  # one line
            if isinstance(r, dict) and "error" not in r and name != "bad-replies":
                r["case_s"] = round(time.monotonic() - t0, 1)
            results[name] = r
            log(f"case {name}: {json.dumps(r)[:400]}")
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(results, indent=1) + "\n")
            tmp.replace(path)
            (out / "faults.md").write_text(HEADER + table(results))
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print(table(results))
    failed = failures(results, args.only)
    for line in failed:
        print(f"faults.py: FAILED {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
