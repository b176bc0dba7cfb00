"""The round loop shared by both backends, and the in-process batched engine.

[`run_loop`][fedhmc.runtime.engine.run_loop] owns everything that happens between rounds: the
non-finite check, collecting the global sample every ``thin`` rounds after ``burn_in``, evaluating
it, the progress bar, and the run's files. A backend only supplies ``round_fn(theta_bar, r)``:
[`run`][fedhmc.runtime.engine.run] (``fedhmc run``) advances all clients and chains in one batched
computation; the Flower ServerApp (``fedhmc_server``) sends θ̄ to the clients and averages their
replies.
"""

from __future__ import annotations

import csv
import json
import math
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fedhmc.algorithms import fahmc, registry
from fedhmc.errors import ConfigError, FedHMCError, NonFiniteError, RunInterrupted
from fedhmc.runtime.config import RunConfig
from fedhmc.runtime.output import RunWriter
from fedhmc.runtime.problem import Problem, build_problem, bytes_per_round, initial_position
from fedhmc.runtime.threads import apply_threads, round_work

ROUND_COLUMNS = ("clients", "failed", "bytes_down", "bytes_up")


def sampler_settings(cfg: RunConfig) -> fahmc.Settings:
    """FA-HMC's settings from a resolved config (debiased FA-HMC's, with its anchor batch
    size, for ``--algorithm fahmc-debiased``)."""
    algo = registry.find(cfg.algorithm)
    return algo.settings(cfg) if algo.leapfrog else registry.fahmc_settings(cfg)


def is_collect_round(cfg: RunConfig, round_: int) -> bool:
    """Whether round ``round_`` (1-based) contributes a sample: after ``burn_in`` rounds,
    every ``thin``-th round, and under ``--sync-unit leapfrog`` only at the end of a
    trajectory (leapfrog count a multiple of lcm(T, K); of T·K with restarts)."""
    if not (round_ > cfg.burn_in and (round_ - cfg.burn_in) % cfg.thin == 0):
        return False
    if cfg.sync_unit == "leapfrog" and registry.find(cfg.algorithm).trajectory_options:
        return sampler_settings(cfg).ends_trajectory(round_)
    return True


def protocol_record(cfg: RunConfig) -> dict:
    """What ``summary.json`` and results tables say about the protocol that produced them."""
    if not registry.find(cfg.algorithm).leapfrog:
        return {"name": cfg.algorithm}
    settings = sampler_settings(cfg)
    rec = {
        "name": cfg.protocol or "algorithm3",
        "sync_unit": settings.sync_unit,
        "fresh_gradients": settings.fresh_gradients,
        "restart_trajectories": settings.restart,
        "minibatch": cfg.minibatch,
        "grad_evals_per_leapfrog_step": 2 if settings.fresh_gradients else "1 + 1/trajectory",
        "round": (
            f"{cfg.local_steps} leapfrog steps, then positions and momenta averaged"
            if settings.leapfrog_sync
            else f"{cfg.local_steps} trajectories of {cfg.leapfrog_steps} leapfrog steps, "
            "then positions averaged"
        ),
    }
    if settings.restart:
        rec["outer_iteration"] = (
            f"{cfg.leapfrog_steps} rounds ({cfg.local_steps} trajectories, each restarting "
            "from the position broadcast at the outer iteration's start)"
        )
    return rec


def finite_or_none(metrics: dict) -> dict:
    """JSON-safe metrics: non-finite floats become None."""
    return {
        k: v if not isinstance(v, float) or math.isfinite(v) else None for k, v in metrics.items()
    }


@dataclass
class RoundStats:
    """What a backend reports about one round."""

    grad_evals: int
    finite: bool
    clients: int
    failed: int = 0
    bytes_down: int = 0
    bytes_up: int = 0
    energy_error: float | None = None
    """Mean |ΔH| per leapfrog trajectory over chains and clients (None where the algorithm
    has no leapfrog trajectories)."""


@dataclass
class RunResult:
    """What a run returns in Python (the files hold the same)."""

    config: RunConfig
    theta_bar: torch.Tensor
    history: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)

    @property
    def final(self) -> dict:
        return self.history[-1] if self.history else {}


RoundFn = Callable[[torch.Tensor, int], tuple[torch.Tensor, RoundStats]]
BackendState = tuple[Callable[[], dict], Callable[[dict], None]]
"""(get, set) of what a backend keeps between rounds, for checkpoints."""

CHECKPOINT_SECONDS = 60.0
ENERGY_EXPLODED = 1e4
"""A round whose mean |ΔH| per leapfrog trajectory exceeds this many times the dimension
ends the run as diverged: every coordinate gained about 2 × 10⁴ times the kinetic energy of
a fresh momentum in one trajectory, which a stable integrator does not do. (At the
authors' tuned Fashion-MNIST settings it is about 50–400 × d in the first rounds.)"""
"""With ``--checkpoint-every`` unset, a checkpoint at most once a minute (and on a stop)."""


class StopRequest:
    """A stop asked for from another thread: the Flower simulation runs the server's round
    loop in a thread of its own, so the main thread's signal handler records the signal
    here and the loop stops after its round (`request_stop`)."""

    signum: int | None = None


def request_stop(signum: int) -> None:
    StopRequest.signum = signum


class _Stop:
    """Signal handling for the duration of a run: the first SIGINT/SIGTERM asks the run to
    stop after the round in flight; a second one stops it at once (KeyboardInterrupt).
    Outside the main thread no handler can be installed; the loop then polls
    [`StopRequest`][fedhmc.runtime.engine.StopRequest]."""

    def __init__(self, announce: bool):
        self._signum: int | None = None
        self.announce = announce
        self._old: dict = {}

    @property
    def signum(self) -> int | None:
        return self._signum if self._signum is not None else StopRequest.signum

    @signum.setter
    def signum(self, value) -> None:
        self._signum = value

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum
        if self.announce:
            print(
                "\nfedhmc: stopping after this round (signal again to stop at once)",
                file=sys.stderr,
                flush=True,
            )

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        return False


def prepare_out(cfg: RunConfig) -> dict | None:
    """Check ``--out`` before a run and, with ``--resume``, load its checkpoint.

    A directory that holds another run is refused unless ``--resume`` (continue it) or
    ``--overwrite`` (replace it) is given, so that no folder ever mixes two runs.
    """
    from fedhmc.runtime import checkpoint

    out = Path(cfg.out)
    if cfg.resume:
        state, problems = checkpoint.load(out)
        for p in problems:
            print(f"fedhmc: warning: {p}; using {state['_file']}", file=sys.stderr)
        version = state["_header"]["version"]
        checkpoint.check_resumable(state["config"], state["round"], version, cfg)
        return state
    holds = [n for n in ("config.json", "summary.json", "checkpoint.pt") if (out / n).exists()]
    if holds and not cfg.overwrite:
        status = ""
        try:
            summary = json.loads((out / "summary.json").read_text())
            status = f" ({summary.get('status')}, {summary.get('rounds_completed')} rounds)"
        except (OSError, ValueError):
            pass
        raise ConfigError(
            f"--out {cfg.out} already holds a run{status}; continue it with "
            f"--resume {cfg.out}, replace it with --overwrite, or choose another --out"
        )
    if holds:
        for name in (
            "checkpoint.pt",
            "checkpoint.prev.pt",
            "samples.npy",
            "summary.json",
            EXPORT,
            OUTDATED_EXPORT,
        ):
            (out / name).unlink(missing_ok=True)
    return None


def resume_or_replace(cfg: RunConfig) -> RunConfig:
    """For a sweep or experiment cell: continue the run in ``cfg.out`` from its checkpoint
    when it is compatible, else replace whatever the folder holds."""
    from fedhmc.runtime import checkpoint

    out = Path(cfg.out)
    if (out / checkpoint.NAME).exists() or (out / checkpoint.PREVIOUS).exists():
        try:
            prepare_out(cfg.replace(resume=True, overwrite=False))
            return cfg.replace(resume=True, overwrite=False)
        except ConfigError:
            pass
    return cfg.replace(resume=False, overwrite=True)


def _history_from_csv(path: Path, upto: int) -> list[dict]:
    rows = []
    try:
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                try:
                    rnd = int(r["round"])
                except (TypeError, ValueError):
                    break  # a partly written last line
                if rnd > upto:
                    break
                if any(v is None for v in r.values()):
                    break
                rows.append({k: _parse(v) for k, v in r.items()})
    except OSError:
        pass
    return rows


def _parse(v: str):
    try:
        i = int(v)
        return i
    except ValueError:
        pass
    try:
        return float(v)
    except ValueError:
        return v


def run_loop(
    cfg: RunConfig,
    evaluator,
    theta0: torch.Tensor,
    round_fn: RoundFn,
    *,
    dim: int,
    num_clients: int,
    description: str,
    backend: str,
    progress: bool = True,
    on_round: Callable[[dict], None] | None = None,
    summary_extra: Callable[[], dict] | None = None,
    backend_state: BackendState | None = None,
) -> RunResult:
    """Run ``cfg.rounds`` rounds of ``round_fn`` and write the run's files to ``cfg.out``.

    ``summary_extra``, if given, is called once at the end (also after a failure) and its
    items join ``summary.json``: a backend's own report. ``backend_state`` is the (get,
    set) pair of what the backend keeps between rounds, saved in checkpoints.

    Checkpoints (`fedhmc.runtime.checkpoint`) are written every ``--checkpoint-every`` rounds
    (unset: at most once a minute), at the end, and when SIGINT or SIGTERM stops the run
    after the round in flight. With ``--resume`` the run continues from its checkpoint and
    gives the same numbers as a run that was never stopped.

    Raises
    ------
    NonFiniteError
        When θ̄ or an energy becomes non-finite; the files written so far stay valid.
    RunInterrupted
        When a signal stopped the run (its checkpoint and summary are written).
    """
    from fedhmc.runtime.lock import FolderLock

    if cfg.resume and backend_state is None:
        raise ConfigError(
            f"--algorithm {cfg.algorithm} cannot be resumed (its server state is not "
            "checkpointed); start it again with --overwrite"
        )
    if cfg.tensorboard:
        from fedhmc.runtime.output import TensorBoardLog

        TensorBoardLog.require()
    lock = FolderLock(cfg.out).acquire()  # one process per run folder
    started = False
    try:
        resumed = prepare_out(cfg)
        started = True
        return _run_locked(
            cfg, resumed, evaluator, theta0, round_fn, dim, num_clients, description,
            backend, progress, on_round, summary_extra, backend_state,
        )  # fmt: skip
    finally:
        lock.release(discard=not started)


def _run_locked(
    cfg, resumed, evaluator, theta0, round_fn, dim, num_clients, description, backend,
    progress, on_round, summary_extra, backend_state,
) -> RunResult:  # fmt: skip
    """``run_loop``'s body, run while the folder's lock is held (``resumed``: the
    checkpoint a resumed run continues from, or None)."""
    from fedhmc.runtime import checkpoint

    columns = (*evaluator.columns, *ROUND_COLUMNS, "energy_error")
    keep = None
    if resumed is not None:
        # The sampler's state first: a checkpoint whose state this run cannot take is
        # refused before any file of the run is touched.
        if backend_state is not None:
            backend_state[1](checkpoint.to_device(resumed.get("backend") or {}, theta0.device))
        _note_extension(cfg, resumed)
        keep = _history_from_csv(Path(cfg.out) / "metrics.csv", int(resumed["round"]))
    writer = RunWriter(cfg.out, columns, keep_rows=keep)
    from fedhmc.runtime.config import step_size_meaning

    record = {**cfg.recorded(), "step_size_means": step_size_meaning(cfg.algorithm)}
    model = getattr(evaluator, "model", None)
    if hasattr(model, "frozen_layout"):  # a module: the parameters it keeps fixed, not in θ
        record["model_frozen"] = [[n, list(s), d] for n, s, d in model.frozen_layout()]
        record["model_frozen_sha256"] = model.frozen_sha256()
    writer.write_config(record)
    if resumed is not None:
        retire_export(cfg.out)
    tb = None
    if cfg.tensorboard:
        from fedhmc.runtime.output import TensorBoardLog

        start_round = int(resumed["round"]) + 1 if resumed is not None else 1
        tb = TensorBoardLog(cfg.tensorboard, cfg.to_dict(), start_round)
    theta_bar = theta0
    result = RunResult(cfg, theta_bar)
    grad_evals, wall_before = 0, 0.0
    totals = dict.fromkeys(ROUND_COLUMNS, 0)
    draws: list[torch.Tensor] = []
    keep_draws = theta0.dim() == 2 and theta0.shape[0] >= 2
    start = 1
    if resumed is not None:
        _note_device_change(cfg, resumed)
        # The checkpoint's tensors were loaded on the CPU; each goes to the device of the
        # part of the run that uses it (θ̄ and the backend's state: θ₀'s; the evaluator's
        # running average: its test data's). The draws and samples stay on the CPU.
        start = int(resumed["round"]) + 1
        theta_bar = resumed["theta_bar"].to(theta0.device, theta0.dtype)
        result.theta_bar = theta_bar
        grad_evals = int(resumed["grad_evals"])
        wall_before = float(resumed["wall_s"])
        totals = {k: int(v) for k, v in resumed["totals"].items()}
        keep_draws = bool(resumed["keep_draws"])
        if resumed.get("draws") is not None:
            draws = list(resumed["draws"].cpu().unbind(0))
        if resumed.get("samples") is not None:
            writer.samples = [x.cpu().numpy() for x in resumed["samples"].unbind(0)]
        evaluator.load_state_dict(
            checkpoint.to_device(resumed["evaluator"], _evaluator_device(evaluator, theta0))
        )
        result.history = keep
    t0 = time.perf_counter()

    def wall() -> float:
        return wall_before + time.perf_counter() - t0

    saved_round = int(resumed["round"]) if resumed is not None else None

    def save_checkpoint(r: int) -> None:
        nonlocal saved_round
        checkpoint.save(
            cfg.out,
            {
                "round": r,
                "config": cfg.to_dict(),
                "device": checkpoint.device_name(cfg.device),
                "theta_bar": theta_bar.detach().cpu(),
                "grad_evals": grad_evals,
                "wall_s": wall(),
                "totals": totals,
                "keep_draws": keep_draws,
                "draws": torch.stack(draws) if draws and keep_draws else None,
                "samples": (
                    torch.from_numpy(__import__("numpy").stack(writer.samples))
                    if writer.samples
                    else None
                ),
                "evaluator": evaluator.state_dict(),
                "backend": backend_state[0]() if backend_state is not None else {},
            },
        )
        saved_round = r
        if r < cfg.rounds:  # how far the run got, should it be killed before its end
            writer.write_summary({"status": "running", "rounds_completed": r, "backend": backend})

    status = "running"
    stop_round = None
    last_ckpt = time.monotonic()
    writer.write_summary({"status": "running", "rounds_completed": start - 1, "backend": backend})
    bar = _progress(cfg.rounds, progress, initial=start - 1)
    r = None  # the round in flight
    try:
        with _Stop(announce=progress) as stop:
            for r in range(start, cfg.rounds + 1):
                try:
                    new_theta, stats = round_fn(theta_bar, r)
                except FedHMCError as e:  # the user's module, or the clients, failed
                    resumable = backend_state is not None and not isinstance(
                        e, (NonFiniteError, RunInterrupted)
                    )
                    if resumable and r > start:  # nothing of round r was applied yet
                        save_checkpoint(r - 1)
                    raise
                grad_evals += stats.grad_evals
                if not (stats.finite and torch.isfinite(new_theta).all()):
                    status = "diverged"
                    raise NonFiniteError(
                        f"round {r}: the chain diverged (non-finite position or energy); "
                        f"try a smaller --step-size than {cfg.step_size:g}, "
                        f"e.g. {cfg.step_size / 2:g}"
                    )
                de = stats.energy_error
                if de is not None and not de <= ENERGY_EXPLODED * max(dim, 1):
                    status = "diverged"
                    raise NonFiniteError(
                        f"round {r}: the leapfrog's energy error exploded (|ΔH| = {de:.3g} "
                        f"per trajectory for d = {dim}, above {ENERGY_EXPLODED:g}·d); "
                        f"try a smaller --step-size than {cfg.step_size:g}, "
                        f"e.g. {cfg.step_size / 10:g}"
                    )
                theta_bar = new_theta
                collect = is_collect_round(cfg, r)
                metrics = evaluator(theta_bar, collect)
                sick = evaluator.health(metrics) if hasattr(evaluator, "health") else None
                if sick is not None:
                    status = "diverged"
                    raise NonFiniteError(
                        f"round {r}: {sick}; try a smaller --step-size than "
                        f"{cfg.step_size:g}, e.g. {cfg.step_size / 10:g}"
                    )
                if collect and cfg.save_samples:
                    writer.add_sample(theta_bar)
                if collect and keep_draws:
                    draws.append(theta_bar.detach().to("cpu", torch.float32).clone())
                    keep_draws = len(draws) * theta_bar.numel() <= DIAGNOSTICS_MAX_VALUES
                extra = {k: getattr(stats, k) for k in ROUND_COLUMNS}
                for k in ROUND_COLUMNS:
                    totals[k] += extra[k]
                row = {
                    "round": r,
                    **metrics,
                    **extra,
                    "energy_error": stats.energy_error,
                    "wall_s": wall(),
                    "grad_evals": grad_evals,
                }
                writer.write_row(row)
                if tb is not None:
                    tb.log(row)
                result.history.append(row)
                result.theta_bar = theta_bar
                if on_round is not None:
                    on_round(row)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(_postfix(metrics), refresh=False)
                every = cfg.checkpoint_every
                due = (
                    time.monotonic() - last_ckpt >= CHECKPOINT_SECONDS
                    if every is None
                    else every > 0 and r % every == 0
                )
                if stop.signum is not None or r == cfg.rounds or due:
                    save_checkpoint(r)
                    last_ckpt = time.monotonic()
                if stop.signum is not None and r < cfg.rounds:
                    stop_round = r
                    status = "interrupted"
                    raise RunInterrupted(stop.signum, r, str(cfg.out))
        status = "completed"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    except RunInterrupted:
        raise
    except FedHMCError as e:
        status = "diverged" if status == "diverged" else "failed"
        if backend_state is not None and not isinstance(e, NonFiniteError) and e.args:
            where = "" if r is None or str(e).startswith("round ") else f"round {r}: "
            e.args = (f"{where}{e.args[0]}; {_kept(cfg, saved_round)}", *e.args[1:])
        raise
    except Exception:
        status = "diverged" if status == "diverged" else "failed"
        raise
    finally:
        if bar is not None:
            bar.close()
        total_wall = wall()
        rounds_done = len(result.history)
        final = {k: v for k, v in result.final.items() if k not in ("wall_s", "grad_evals")}
        result.summary = {
            "status": status,
            "rounds_completed": rounds_done,
            "rounds": cfg.rounds,
            "final": finite_or_none(final),
            "wall_s": total_wall,
            "grad_evals": grad_evals,
            "grad_evals_per_s": grad_evals / max(total_wall, 1e-9),
            "threads": torch.get_num_threads(),
            "bytes_down": totals["bytes_down"],
            "bytes_up": totals["bytes_up"],
            "bytes_total": totals["bytes_down"] + totals["bytes_up"],
            "client_failures": totals["failed"],
            "dim": dim,
            "num_clients": num_clients,
            "data": description,
            "backend": backend,
            "protocol": protocol_record(cfg),
            "diagnostics": _diagnostics(draws, keep_draws),
        }
        diag = result.summary["diagnostics"]
        if diag is not None and status == "completed":
            from fedhmc.analysis.diagnostics import warning

            text = warning(diag)
            if text is not None:
                result.summary["convergence_warning"] = text
        if resumed is not None:
            result.summary["resumed_from_round"] = start - 1
        if status == "interrupted":
            result.summary["resume"] = f"fedhmc run --resume {cfg.out}"
            if stop_round is None:
                result.summary["note"] = (
                    "stopped at once by a second signal: the last checkpoint is older than "
                    "the last round in metrics.csv; --resume continues from the checkpoint"
                )
        if getattr(evaluator, "ece_bins", None) is not None:
            result.summary["ece_bins"] = evaluator.ece_bins
        model = getattr(evaluator, "model", None)
        if model is not None:  # the parameters' layout (fedhmc export names them)
            result.summary["model"] = getattr(model, "name", None)
            result.summary["model_shapes"] = {
                "num_features": getattr(model, "num_features", None),
                "num_classes": getattr(model, "num_classes", None),
            }
            if hasattr(model, "parameter_layout"):  # a module: its parameters, in θ's order
                result.summary["model_parameters"] = [
                    [name, list(shape)] for name, shape in model.parameter_layout()
                ]
            if hasattr(model, "frozen_layout"):  # its parameters that were not sampled
                result.summary["model_frozen"] = [
                    [name, list(shape), dtype] for name, shape, dtype in model.frozen_layout()
                ]
            if hasattr(model, "batching"):
                result.summary["model_batching"] = model.batching
        if summary_extra is not None:
            result.summary.update(summary_extra())
        writer.write_samples()
        writer.write_summary(result.summary)
        writer.close()
        if tb is not None:
            tb.close()
    return result


def _kept(cfg: RunConfig, saved_round: int | None) -> str:
    """What a run that a failure stopped mid-way keeps, and how to go on once it is fixed."""
    if saved_round is not None:
        return (
            f"the checkpoint of round {saved_round} is kept: once fixed, continue with "
            f"fedhmc run --resume {cfg.out}"
        )
    return f"no round was checkpointed: once fixed, start again with --overwrite --out {cfg.out}"


EXPORT = "posterior.nc"
"""The file ``fedhmc export --to arviz`` writes into a run's folder by default."""
OUTDATED_EXPORT = "posterior.outdated.nc"
"""What a resumed run renames an earlier ``EXPORT`` to: its draws end where the run stopped."""


def retire_export(out: str | Path) -> Path | None:
    """When a run goes on (``--resume``), rename the ArviZ export of its earlier draws,
    ``posterior.nc``, to ``posterior.outdated.nc`` (replacing an older one), with one line
    on stderr: the export no longer holds every draw of the run. Returns the new path, or
    None when there was no export."""
    src = Path(out) / EXPORT
    if not src.is_file() or src.is_symlink():
        return None
    dst = src.with_name(OUTDATED_EXPORT)
    src.replace(dst)
    print(
        f"fedhmc: {src} holds the draws up to the checkpoint only and is now {dst.name}; "
        f"export again when the run ends (fedhmc export {out} --to arviz)",
        file=sys.stderr,
    )
    return dst


def _note_extension(cfg: RunConfig, resumed: dict) -> None:
    """One line on stderr when ``--rounds`` extends a resumed run: which burn-in it keeps
    (said once the checkpoint is accepted, so that a refused resume says only why)."""
    before = (resumed.get("config") or {}).get("rounds")
    if isinstance(before, int) and cfg.rounds > before:
        s = "" if cfg.burn_in == 1 else "s"
        print(
            f"fedhmc run: extending {cfg.out} from {before} to {cfg.rounds} rounds; it keeps "
            f"its burn-in of {cfg.burn_in} round{s}, as an uninterrupted run with --rounds "
            f"{cfg.rounds} --burn-in {cfg.burn_in}",
            file=sys.stderr,
        )


def _note_device_change(cfg: RunConfig, resumed: dict) -> None:
    """One line on stderr when a run continues on another device than the one its
    checkpoint was written on (``resuming on cpu a run that was saved on cuda:0``)."""
    from fedhmc.runtime.checkpoint import device_name

    saved = resumed.get("device") or (resumed.get("config") or {}).get("device") or "cpu"
    try:
        before, now = device_name(saved), device_name(cfg.device)
    except (RuntimeError, TypeError, ValueError):
        before, now = str(saved), str(cfg.device)
    if before != now:
        print(f"fedhmc: resuming on {now} a run that was saved on {before}", file=sys.stderr)


def _evaluator_device(evaluator, theta0: torch.Tensor) -> torch.device:
    """Where the evaluator keeps its tensors: its test inputs' device, else θ₀'s."""
    X = getattr(evaluator, "X", None)
    return X.device if isinstance(X, torch.Tensor) else theta0.device


DIAGNOSTICS_MAX_VALUES = 20_000_000
"""Collected θ̄ values kept in memory for R-hat / ESS (beyond that, no diagnostics)."""


def _diagnostics(draws: list[torch.Tensor], complete: bool) -> dict | None:
    """Split R-hat and ESS of the collected global samples across chains (None if fewer
    than 4 samples, fewer than 2 chains, or too many values to keep)."""
    if not complete or len(draws) < 4:
        return None
    from fedhmc.analysis.diagnostics import summarize

    out = summarize(torch.stack(draws).to(torch.float64))
    out["samples_per_chain"] = len(draws)
    out["chains"] = int(draws[0].shape[0])
    return out


def prepare(cfg: RunConfig) -> RunConfig:
    """Resolve defaults and fix the output directory."""
    cfg = cfg.resolve()
    return cfg.replace(out=cfg.out or cfg.default_out())


def run(
    cfg: RunConfig,
    problem: Problem | None = None,
    progress: bool = True,
    on_round: Callable[[dict], None] | None = None,
    threads: int | str | None = None,
) -> RunResult:
    """Run FA-HMC in process (all clients and chains batched) and write the run's files.

    Parameters
    ----------
    cfg
        The run's settings; resolved here if not yet.
    problem
        A prebuilt problem (defaults to `fedhmc.runtime.problem.build_problem`).
    progress
        Show a progress bar over rounds (on a terminal).
    on_round
        Called with each round's metrics row.
    threads
        torch's intra-op threads for the run: a number, or ``"auto"`` (one thread for small
        gradient evaluations, every core for large ones: `fedhmc.runtime.threads`). None
        (the default) chooses as ``fedhmc run`` does: ``auto``, unless the command line's
        ``--threads`` set another for its process.
    """
    if cfg.backend != "engine":  # the run's own backend (Flower's simulation), not this one
        from fedhmc.runtime.backends import run_config

        return run_config(cfg, progress=progress, threads=threads)
    cfg = prepare(cfg)
    if cfg.on_failure != "renormalize":  # (the Flower server reads it; this engine does not)
        raise ConfigError(
            f"--on-failure {cfg.on_failure} applies to --backend flower (the engine's clients "
            "cannot fail); drop --on-failure or add --backend flower"
        )
    if "engine" not in registry.entry(cfg.algorithm).backends:
        raise ConfigError(
            f"--algorithm {cfg.algorithm} is a message exchange between a server and Flower "
            "workers; add --backend flower (or use --algorithm sghmc/sgld in process)"
        )
    device = torch.device(cfg.device)
    if problem is None:
        problem = build_problem(cfg, device=device)
    apply_threads(threads, round_work(problem.target, cfg))
    from fedhmc.runtime import checkpoint

    module, settings = registry.algorithm_of(cfg)
    target = problem.target
    theta0 = initial_position(problem.model, problem.dim, cfg, device=device)
    state = module.init(theta0, settings)
    num_clients = target.num_clients

    def round_fn(theta_bar: torch.Tensor, r: int) -> tuple[torch.Tensor, RoundStats]:
        nonlocal state
        state, info = module.step(cfg.seed, state, target, settings)
        clients = getattr(info, "clients", num_clients)  # drawn ones, under participation
        down, up = bytes_per_round(cfg, problem.dim, r, clients)
        stats = RoundStats(info.grad_evals, info.finite, clients, 0, down, up)
        stats.energy_error = getattr(info, "mean_energy_error", None)
        return state.position, stats

    def set_state(saved: dict) -> None:
        nonlocal state
        state = checkpoint.state_from_dict(saved, type(state), device)

    return run_loop(
        cfg,
        problem.evaluator,
        theta0,
        round_fn,
        dim=problem.dim,
        num_clients=num_clients,
        description=problem.description,
        backend="engine",
        progress=progress,
        on_round=on_round,
        backend_state=(lambda: checkpoint.state_dict(state), set_state),
    )


def _progress(total: int, enabled: bool, initial: int = 0):
    if not enabled:
        return None
    from fedhmc.core.progress import bar

    return bar(total, "rounds", "round", initial=initial)


def _postfix(metrics: dict) -> dict:
    keys = ("accuracy", "nll_mean") if "accuracy" in metrics else ("w2", "mean_error")
    return {k: f"{metrics[k]:.4g}" for k in keys if k in metrics}
