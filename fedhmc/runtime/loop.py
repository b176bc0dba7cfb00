"""The round loop every backend shares: [`run_loop`][fedhmc.runtime.loop.run_loop], what it
drives (a [`Backend`][fedhmc.runtime.loop.Backend], which reports each round as
[`RoundStats`][fedhmc.runtime.loop.RoundStats]) and what it returns
([`RunResult`][fedhmc.runtime.loop.RunResult]).

`run_loop` owns everything that happens between rounds: the non-finite check, collecting the
global sample every ``thin`` rounds after ``burn_in``, evaluating it, the progress bar, a stop
asked for by SIGINT or SIGTERM, the checkpoints and the run's files. A backend runs one round
at a time and holds θ̄: the in-process engine
([`EngineBackend`][fedhmc.runtime.engine.EngineBackend]) advances all clients and chains in
one batched computation; the Flower ServerApp (``fedhmc_server``) sends θ̄ to the clients and
combines their replies. Both go through this loop, so their runs write the same files.
"""

from __future__ import annotations

import csv
import math
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from fedhmc.algorithms import registry
from fedhmc.errors import (
    DISK_FULL,
    ConfigError,
    FedHMCError,
    NonFiniteError,
    RunFailed,
    RunInterrupted,
    loads_json,
)
from fedhmc.runtime import checkpoint
from fedhmc.runtime.backends import prepare
from fedhmc.runtime.config import ResolvedConfig, RunConfig
from fedhmc.runtime.output import RunWriter, check_metrics_file
from fedhmc.runtime.problem import bits_up_per_round

ROUND_COLUMNS = ("clients", "failed", "bytes_down", "bytes_up")


def sampler_settings(cfg: RunConfig):
    """The Settings of the algorithm a resolved config runs (its registry entry's)."""
    return registry.entry(cfg.algorithm).build_settings(cfg)


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
        "restart_trajectories": settings.restart_trajectories,
        "minibatch": cfg.minibatch,
        "grad_evals_per_leapfrog_step": 2 if settings.fresh_gradients else "1 + 1/trajectory",
        "round": (
            f"{cfg.local_steps} leapfrog steps, then positions and momenta averaged"
            if settings.leapfrog_sync
            else f"{cfg.local_steps} trajectories of {cfg.leapfrog_steps} leapfrog steps, "
            "then positions averaged"
        ),
    }
    if settings.restart_trajectories:
        rec["outer_iteration"] = (
            f"{cfg.leapfrog_steps} rounds ({cfg.local_steps} trajectories, each restarting "
            "from the position broadcast at the outer iteration's start)"
        )
    return rec


def setup_rounds_of(module, settings) -> int:
    """The rounds of a sampler's set-up phase: its module's ``setup_rounds(settings)``, 0
    without one."""
    declared = getattr(module, "setup_rounds", None)
    return 0 if declared is None else int(declared(settings))


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
    bits_up: int | None = None
    """The bits the replies really take, where the algorithm compresses them (its module's
    ``REPLY_BITS``); None otherwise (no ``bits_up`` column)."""
    """Mean |ΔH| per leapfrog trajectory over chains and clients (None where the algorithm
    has no leapfrog trajectories)."""


@dataclass
class RunResult:
    """What a run returns in Python (the files hold the same)."""

    config: ResolvedConfig
    theta_bar: torch.Tensor
    history: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)

    @property
    def final(self) -> dict:
        return self.history[-1] if self.history else {}


class Backend(Protocol):
    """What [`run_loop`][fedhmc.runtime.loop.run_loop] drives: a run's rounds, one at a
    time, and θ̄, which the backend alone holds.

    ``round(r)`` runs round ``r`` (1-based) and advances ``position``; when it raises a
    FedHMCError nothing of round ``r`` may have been applied (the loop then checkpoints
    round ``r − 1``). ``state_dict()`` is what a checkpoint keeps of the backend, θ̄
    included, or None when the backend cannot be resumed (``--resume`` is then refused);
    the loop asks for it once at the start and at each checkpoint. ``load_state_dict``
    takes a saved one back, its tensors already on ``position``'s device. ``summary()``'s
    items join ``summary.json`` at the end of the run, also after a failure.
    """

    name: str
    """``summary.json``'s ``backend``: ``"engine"`` or ``"flower"``."""

    @property
    def position(self) -> torch.Tensor:
        """θ̄ (S, D) now: θ₀ before round 1."""
        ...

    def round(self, r: int) -> RoundStats: ...

    setup_rounds: int
    """The rounds ``1 − k … 0`` of the sampler's set-up phase (``k``: its module's
    ``setup_rounds(settings)``, 0 without one), run through ``round`` before round 1."""

    def state_dict(self) -> dict | None: ...

    def load_state_dict(self, saved: dict) -> None: ...

    def summary(self) -> dict: ...


CHECKPOINT_SECONDS = 60.0
"""With ``--checkpoint-every`` unset, a checkpoint at most once a minute (and on a stop)."""
ENERGY_EXPLODED = 1e4
"""A round whose mean |ΔH| per leapfrog trajectory exceeds this many times the dimension
ends the run as diverged: every coordinate gained about 2 × 10⁴ times the kinetic energy of
a fresh momentum in one trajectory, which a stable integrator does not do. (At the
authors' tuned Fashion-MNIST settings it is about 50–400 × d in the first rounds.)"""


class StopRequest:
    """A stop asked for from another thread: the Flower simulation runs the server's round
    loop in a thread of its own, so the main thread's signal handler records the signal
    here and the loop stops after its round (`request_stop`)."""

    signum: int | None = None


def request_stop(signum: int) -> None:
    StopRequest.signum = signum


class StoppedAtOnce(KeyboardInterrupt):
    """A second SIGINT or SIGTERM: the run stops at once (exit status 128 + the signal)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = int(signum)


class _Stop:
    """Signal handling for the duration of a run: the first SIGINT/SIGTERM asks the run to
    stop after the round in flight; a second one stops it at once (KeyboardInterrupt).
    Outside the main thread no handler can be installed; the loop then polls
    [`StopRequest`][fedhmc.runtime.loop.StopRequest]."""

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
            raise StoppedAtOnce(signum)
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
    ``--overwrite`` (replace it) is given, so that no folder ever mixes two runs;
    ``--overwrite`` removes the files fedhmc wrote there and no other. A resume's checkpoint
    must be this run's, and its metrics.csv what the checkpoint says the run wrote.
    """
    from fedhmc.runtime import checkpoint

    out = Path(cfg.out)
    if cfg.resume:
        state, problems = checkpoint.load(out)
        try:
            checkpoint.check_run_payload(state)
        except ValueError as e:
            raise ConfigError(
                f"cannot resume from {str(out)!r}: {state['_file']} is unusable ({e}); run it "
                "again without --resume (add --overwrite to replace it)"
            ) from None
        for p in problems:
            print(f"fedhmc: warning: {p}; using {state['_file']}", file=sys.stderr)
        version = state["_header"]["version"]
        checkpoint.check_resumable(state["config"], state["round"], version, cfg)
        check_metrics_file(out, state.get("metrics"), int(state["round"]))
        return state
    holds = [n for n in ("config.json", "summary.json", "checkpoint.pt") if (out / n).exists()]
    if holds and not cfg.overwrite:
        status = ""
        try:
            summary = loads_json((out / "summary.json").read_text())
            said, rounds = summary.get("status"), summary.get("rounds_completed")
            if isinstance(said, str) and isinstance(rounds, int):
                status = f" ({said}, {rounds} rounds)"
        except (OSError, ValueError, AttributeError):
            pass
        raise ConfigError(
            f"--out {cfg.out} already holds a run{status}; continue it with "
            f"--resume {cfg.out}, replace it with --overwrite, or choose another --out"
        )
    if holds:
        # The folder is fedhmc's (its lock checked the marker): the earlier run's files go,
        # and any other file stays. config.json and metrics.csv are written anew.
        for name in (
            "checkpoint.pt",
            "checkpoint.prev.pt",
            "samples.npy",
            "summary.json",
            "staleness.csv",
            "workers.csv",
            "flower.log",
            EXPORT,
            OUTDATED_EXPORT,
        ):
            (out / name).unlink(missing_ok=True)
    return None


def resume_or_replace(cfg: RunConfig) -> ResolvedConfig:
    """For a sweep or experiment cell (``cfg`` with its ``out``, resolved here): continue the
    run in ``cfg.out`` from its checkpoint when it is compatible, else replace whatever the
    folder holds."""
    from fedhmc.runtime import checkpoint

    out = Path(cfg.out)
    if (out / checkpoint.NAME).exists() or (out / checkpoint.PREVIOUS).exists():
        try:
            resumed = prepare(cfg.replace(resume=True, overwrite=False))
            prepare_out(resumed)
            return resumed
        except ConfigError:
            pass
    return prepare(cfg.replace(resume=False, overwrite=True))


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
    cfg: ResolvedConfig,
    evaluator,
    backend: Backend,
    *,
    dim: int,
    num_clients: int,
    description: str,
    progress: bool = True,
    on_round: Callable[[dict], None] | None = None,
) -> RunResult:
    """Run rounds ``1 … cfg.rounds`` of ``backend`` and write the run's files to ``cfg.out``
    (``cfg``: resolved, as `fedhmc.runtime.backends.prepare` gives it).

    After each round the loop reads θ̄ from ``backend.position``, checks it, evaluates it
    and collects it; ``dim``, ``num_clients`` and ``description`` are what ``summary.json``
    says of the problem. Checkpoints (`fedhmc.runtime.checkpoint`) are written every
    ``--checkpoint-every`` rounds (unset: at most once a minute), at the end, and when
    SIGINT or SIGTERM stops the run after the round in flight. With ``--resume`` the run
    continues from its checkpoint and gives the same numbers as a run never stopped.

    Raises
    ------
    NonFiniteError
        When θ̄ or an energy becomes non-finite; the files written so far stay valid.
    RunInterrupted
        When a signal stopped the run (its checkpoint and summary are written).
    """
    from fedhmc.runtime.lock import FolderLock

    resumable = backend.state_dict() is not None
    if cfg.resume and not resumable:
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
        about = (dim, num_clients, description)
        run = _Run(cfg, evaluator, backend, about, resumable=resumable, progress=progress)
        run.on_round = on_round
        run.open(resumed)
        return run.loop()
    finally:
        lock.release(discard=not started)


class _Run:
    """One run of `run_loop`, while its folder's lock is held: its files, running totals,
    collected draws, time and status, and the round in flight."""

    def __init__(
        self,
        cfg: ResolvedConfig,
        evaluator,
        backend: Backend,
        about: tuple[int, int, str],
        *,
        resumable: bool,
        progress: bool,
    ):
        self.cfg, self.evaluator, self.backend = cfg, evaluator, backend
        self.about = about  # dim, num_clients, description: what summary.json says of them
        self.resumable, self.progress = resumable, progress
        self.on_round: Callable[[dict], None] | None = None
        theta0 = backend.position
        self.device = theta0.device  # the backend's state's, as θ₀'s
        self.result = RunResult(cfg, theta0)
        bits = ("bits_up",) if bits_up_per_round(cfg, about[0], 1, 1) is not None else ()
        self.columns = (*evaluator.columns, *ROUND_COLUMNS, *bits, "energy_error")
        self.grad_evals, self.wall_before = 0, 0.0
        self.totals = dict.fromkeys(ROUND_COLUMNS, 0)
        self.draws: list[torch.Tensor] = []
        self.keep_draws = theta0.dim() == 2 and theta0.shape[0] >= 2
        self.start, self.resumed = 1, False
        self.saved_round: int | None = None  # the newest checkpoint's round
        self.disk_full: OSError | None = None  # a file the disk had no room for
        self.r: int | None = None  # the round in flight
        self.status, self.stop_round = "running", None
        self.writer: RunWriter | None = None
        self.tb = self.bar = None
        self.t0, self.last_checkpoint = time.perf_counter(), time.monotonic()

    def wall(self) -> float:
        return self.wall_before + time.perf_counter() - self.t0

    # ------------------------------------------------------------------ start
    def _check_width(self, saved: int) -> None:
        """A model of another size than the checkpoint's θ̄ (the user's module changed
        since the run), refused before any file of the run is touched."""
        dim = int(self.about[0])
        if saved != dim:
            raise ConfigError(
                f"cannot resume: the model has {dim} parameters now and the run's checkpoint "
                f"{saved}: its module changed since the run; restore the module the run "
                "used, or start a new run (--overwrite)"
            )

    def open(self, resumed: dict | None) -> None:
        """Take back the checkpoint a resumed run continues from (``resumed``; None: a new
        run) and open the run's files."""
        keep = None
        if resumed is not None:
            # The sampler's state first: a checkpoint whose state this run cannot take is
            # refused before any file of the run is touched.
            saved = checkpoint.to_device(resumed.get("backend") or {}, self.device)
            self.backend.load_state_dict(saved)
            self._check_width(int(self.backend.position.shape[-1]))
            device = _evaluator_device(self.evaluator, self.device)  # (its running average)
            self.evaluator.load_state_dict(checkpoint.to_device(resumed["evaluator"], device))
            _note_extension(self.cfg, resumed)
            keep = _history_from_csv(Path(self.cfg.out) / "metrics.csv", int(resumed["round"]))
        written = resumed["metrics"] if resumed is not None else None  # checked: prepare_out
        self.writer = RunWriter(self.cfg.out, self.columns, written=written)
        self.writer.write_config(_config_record(self.cfg, self.evaluator))
        if resumed is not None:
            retire_export(self.cfg.out)
        if self.cfg.tensorboard:
            from fedhmc.runtime.output import TensorBoardLog

            start_round = int(resumed["round"]) + 1 if resumed is not None else 1
            self.tb = TensorBoardLog(self.cfg.tensorboard, self.cfg.to_dict(), start_round)
        if resumed is not None:
            self._resume(resumed, keep)
        self.t0 = time.perf_counter()

    def _resume(self, resumed: dict, history: list[dict]) -> None:
        """The loop's own part of the checkpoint: counters, draws, samples, the evaluator's
        running average and the metrics so far. θ̄ is the backend's: its state holds it."""
        _note_device_change(self.cfg, resumed)
        # The checkpoint's tensors were loaded on the CPU; each goes to the device of the
        # part of the run that uses it (the backend's state: θ₀'s; the evaluator's running
        # average: its test data's). The draws and samples stay on the CPU.
        self.start = int(resumed["round"]) + 1
        self.saved_round, self.resumed = self.start - 1, True
        self.result.theta_bar = self.backend.position
        self.grad_evals = int(resumed["grad_evals"])
        self.wall_before = float(resumed["wall_s"])
        self.totals = {k: int(v) for k, v in resumed["totals"].items()}
        self.keep_draws = bool(resumed["keep_draws"])
        if resumed.get("draws") is not None:
            self.draws = list(resumed["draws"].cpu().unbind(0))
        if resumed.get("samples") is not None:
            self.writer.samples = [x.cpu().numpy() for x in resumed["samples"].unbind(0)]
        self.result.history = history

    # ------------------------------------------------------------------ rounds
    def loop(self) -> RunResult:
        """Rounds ``start`` … ``cfg.rounds``; the summary is written however they end."""
        self.last_checkpoint = time.monotonic()
        if self.start == 1:
            self._setup()
        self.writer.write_summary(self._running(self.start - 1))
        self.bar = _progress(self.cfg.rounds, self.progress, initial=self.start - 1)
        try:
            with _Stop(announce=True) as stop:
                for r in range(self.start, self.cfg.rounds + 1):
                    self.r = r
                    self._round(r)
                    self._after_round(r, stop)
            self.status = "completed"
        except KeyboardInterrupt:
            self.status = "interrupted"
            raise
        except RunInterrupted:
            raise
        except FedHMCError as e:
            self.status = "diverged" if self.status == "diverged" else "failed"
            self._explain(e)
            raise
        except OSError as e:
            self.status = "failed"
            if e.errno not in DISK_FULL:
                raise
            self.disk_full = e
            raise RunFailed(self._disk_full()) from None
        except Exception:
            self.status = "diverged" if self.status == "diverged" else "failed"
            raise
        finally:
            self._finish()
        if self.disk_full is not None:  # the rounds ended, but not their files
            raise RunFailed(self._disk_full())
        return self.result

    def _setup(self) -> None:
        """The sampler's set-up phase (rounds ``1 − k … 0``, before round 1: QLSD*'s or
        FSGLD's), through the backend's ``round`` like any round: its gradient evaluations
        start the run's count, and its bytes join the totals (``setup_*`` in
        ``summary.json``). It has no metrics row: nothing is sampled yet."""
        k = int(getattr(self.backend, "setup_rounds", 0))
        for r in range(1 - k, 1):
            stats = self.backend.round(r)
            self.grad_evals += stats.grad_evals
            if not stats.finite:
                raise NonFiniteError(f"the sampler's set-up round {r} diverged")
            for key in ("bytes_down", "bytes_up", "bits_up", "grad_evals"):
                value = getattr(stats, key)
                if value is not None:
                    self.totals["setup_" + key] = self.totals.get("setup_" + key, 0) + value
        if k:
            self.totals["setup_rounds"] = k

    def _disk_full(self) -> str:
        e = self.disk_full
        return (
            f"the disk is full ({e.strerror}: {e.filename or 'a run file'}); the run stopped "
            f"after round {self.r}; {_kept(self.cfg, self.saved_round)} (free some space first)"
        )

    def _round(self, r: int) -> None:
        """Round ``r``: the backend's, then θ̄'s checks, evaluation and collection, and the
        round's row in every output."""
        try:
            stats = self.backend.round(r)
        except FedHMCError as e:  # the user's module, or the clients, failed
            resumable = self.resumable and not isinstance(e, (NonFiniteError, RunInterrupted))
            if resumable and r > self.start:  # nothing of round r was applied yet
                self._checkpoint(r - 1)
            raise
        self.grad_evals += stats.grad_evals
        theta = self.backend.position
        self._check(r, stats, theta)
        collect = is_collect_round(self.cfg, r)
        metrics = self.evaluator(theta, collect)
        sick = self.evaluator.health(metrics) if hasattr(self.evaluator, "health") else None
        if sick is not None:
            self._diverged(f"round {r}: {sick}", 10)
        self._collect(theta, collect)
        self._record(self._row(r, metrics, stats), metrics, theta)

    def _check(self, r: int, stats: RoundStats, theta: torch.Tensor) -> None:
        """A non-finite θ̄ or energy, or an exploded energy error, ends the run as diverged."""
        if not (stats.finite and torch.isfinite(theta).all()):
            self._diverged(f"round {r}: the chain diverged (non-finite position or energy)", 2)
        de, dim = stats.energy_error, self.about[0]
        if de is not None and not de <= ENERGY_EXPLODED * max(dim, 1):
            self._diverged(
                f"round {r}: the leapfrog's energy error exploded (|ΔH| = {de:.3g} "
                f"per trajectory for d = {dim}, above {ENERGY_EXPLODED:g}·d)",
                10,
            )

    def _diverged(self, why: str, smaller: int):
        """Stop the run as diverged, for ``why``, suggesting a step size ``smaller`` times
        smaller."""
        self.status = "diverged"
        h = self.cfg.step_size
        raise NonFiniteError(f"{why}; try a smaller --step-size than {h:g}, e.g. {h / smaller:g}")

    def _collect(self, theta: torch.Tensor, collect: bool) -> None:
        if collect and self.cfg.save_samples:
            self.writer.add_sample(theta)
        if collect and self.keep_draws:
            self.draws.append(theta.detach().to("cpu", torch.float32).clone())
            self.keep_draws = len(self.draws) * theta.numel() <= DIAGNOSTICS_MAX_VALUES

    def _row(self, r: int, metrics: dict, stats: RoundStats) -> dict:
        """metrics.csv's row of round ``r`` (the totals counted)."""
        extra = {k: getattr(stats, k) for k in ROUND_COLUMNS}
        if stats.bits_up is not None:  # a compressed reply: the bits it really takes
            extra["bits_up"] = stats.bits_up
        for k in extra:
            self.totals[k] = self.totals.get(k, 0) + extra[k]
        return {
            "round": r,
            **metrics,
            **extra,
            "energy_error": stats.energy_error,
            "wall_s": self.wall(),
            "grad_evals": self.grad_evals,
        }

    def _record(self, row: dict, metrics: dict, theta: torch.Tensor) -> None:
        self.writer.write_row(row)
        if self.tb is not None:
            self.tb.log(row)
        self.result.history.append(row)
        self.result.theta_bar = theta
        if self.on_round is not None:
            self.on_round(row)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(_postfix(metrics), refresh=False)

    def _after_round(self, r: int, stop: _Stop) -> None:
        """A checkpoint when one is due (or a stop was asked for), then the stop."""
        every = self.cfg.checkpoint_every
        due = (
            time.monotonic() - self.last_checkpoint >= CHECKPOINT_SECONDS
            if every is None
            else every > 0 and r % every == 0
        )
        if stop.signum is not None or r == self.cfg.rounds or due:
            self._checkpoint(r)
            self.last_checkpoint = time.monotonic()
        if stop.signum is not None and r < self.cfg.rounds:
            self.stop_round = r
            self.status = "interrupted"
            flags = checkpoint.resume_flags(self.cfg.to_dict())
            raise RunInterrupted(stop.signum, r, str(self.cfg.out), flags)

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint(self, r: int) -> None:
        checkpoint.save(self.cfg.out, self._payload(r))
        self.saved_round = r
        if r < self.cfg.rounds:  # how far the run got, should it be killed before its end
            self.writer.write_summary(self._running(r))

    def _payload(self, r: int) -> dict:
        """The checkpoint of round ``r`` (`fedhmc.runtime.checkpoint`, format 4): θ̄ is
        in the backend's state, not beside it."""
        import numpy as np

        samples = self.writer.samples
        return {
            "round": r,
            "config": self.cfg.to_dict(),
            "device": checkpoint.device_name(self.cfg.device),
            "grad_evals": self.grad_evals,
            "wall_s": self.wall(),
            "totals": self.totals,
            "keep_draws": self.keep_draws,
            "draws": torch.stack(self.draws) if self.draws and self.keep_draws else None,
            "samples": torch.from_numpy(np.stack(samples)) if samples else None,
            "evaluator": self.evaluator.state_dict(),
            "backend": self.backend.state_dict(),
            "metrics": self.writer.written(),  # what a resume checks metrics.csv against
        }

    def _running(self, rounds_completed: int) -> dict:
        return {
            "status": "running",
            "rounds_completed": rounds_completed,
            "backend": self.backend.name,
        }

    def _explain(self, e: FedHMCError) -> None:
        """A failure's message, with what the run keeps and how to go on once fixed."""
        if self.resumable and not isinstance(e, NonFiniteError) and e.args:
            r = self.r
            where = "" if r is None or str(e).startswith("round ") else f"round {r}: "
            e.args = (f"{where}{e.args[0]}; {_kept(self.cfg, self.saved_round)}", *e.args[1:])

    # ------------------------------------------------------------------ the end
    def _finish(self) -> None:
        """summary.json and samples.npy, however the rounds ended; the files closed."""
        if self.bar is not None:
            self.bar.close()
        self.result.summary = self._summary()
        if not self._written(self.writer.write_samples):  # (no .tmp left: the summary may fit)
            self.result.summary = {**self._summary(), "failure": "the disk is full"}
        self._written(lambda: self.writer.write_summary(self.result.summary))
        self.writer.close()
        if self.tb is not None:
            self.tb.close()

    def _written(self, write) -> bool:
        """``write()``, or False when the disk had no room for it (the run has failed)."""
        try:
            write()
        except OSError as e:
            if e.errno not in DISK_FULL:
                raise
            self.disk_full, self.status = self.disk_full or e, "failed"
            return False
        return True

    def _summary(self) -> dict:
        cfg, result = self.cfg, self.result
        total_wall = self.wall()
        dim, num_clients, description = self.about
        final = {k: v for k, v in result.final.items() if k not in ("wall_s", "grad_evals")}
        summary = {
            "status": self.status,
            "rounds_completed": len(result.history),
            "rounds": cfg.rounds,
            "final": finite_or_none(final),
            "wall_s": total_wall,
            "grad_evals": self.grad_evals,
            "grad_evals_per_s": self.grad_evals / max(total_wall, 1e-9),
            "threads": torch.get_num_threads(),
            "bytes_down": self.totals["bytes_down"],
            "bytes_up": self.totals["bytes_up"],
            "bytes_total": sum(
                self.totals.get(k, 0)
                for k in ("bytes_down", "bytes_up", "setup_bytes_down", "setup_bytes_up")
            ),
            **({"bits_up": self.totals["bits_up"]} if "bits_up" in self.totals else {}),
            **{k: v for k, v in self.totals.items() if k.startswith("setup_")},
            "client_failures": self.totals["failed"],
            "dim": dim,
            "num_clients": num_clients,
            "data": description,
            "backend": self.backend.name,
            "protocol": protocol_record(cfg),
            "diagnostics": _diagnostics(self.draws, self.keep_draws),
        }
        self._notes(summary)
        summary.update(_model_summary(self.evaluator))
        summary.update(self.backend.summary())
        return summary

    def _notes(self, summary: dict) -> None:
        """The summary's notes: a convergence warning, where a resumed run started, how
        to continue an interrupted one."""
        diag = summary["diagnostics"]
        if diag is not None and self.status == "completed":
            from fedhmc.analysis.diagnostics import warning

            text = warning(diag)
            if text is not None:
                summary["convergence_warning"] = text
        if self.resumed:
            summary["resumed_from_round"] = self.start - 1
        if self.status == "interrupted" and self.saved_round is None:
            self.saved_round = _round_on_disk(self.cfg.out)
        if self.status == "interrupted" and self.saved_round is None:
            summary["note"] = (
                "stopped before the first checkpoint: nothing to resume; start the run again "
                f"with --overwrite --out {self.cfg.out}"
            )
        elif self.status == "interrupted":
            summary["resume"] = checkpoint.resume_command(self.cfg.out, self.cfg.to_dict())
            if self.stop_round is None:
                summary["note"] = (
                    "stopped at once by a second signal: the last checkpoint is older than "
                    "the last round in metrics.csv; --resume continues from the checkpoint"
                )


def _config_record(cfg: RunConfig, evaluator) -> dict:
    """config.json: the run's settings, what its step size means, and the parameters a
    module keeps fixed (not in θ)."""
    from fedhmc.runtime.config import step_size_meaning

    record = {**cfg.recorded(), "step_size_means": step_size_meaning(cfg.algorithm)}
    model = getattr(evaluator, "model", None)
    if hasattr(model, "frozen_layout"):  # a module: the parameters it keeps fixed, not in θ
        record["model_frozen"] = [[n, list(s), d] for n, s, d in model.frozen_layout()]
        record["model_frozen_sha256"] = model.frozen_sha256()
    return record


def _model_summary(evaluator) -> dict:
    """What summary.json says of the evaluator's model: its ECE bins, and the parameters'
    layout (fedhmc export names them)."""
    out = {}
    if getattr(evaluator, "ece_bins", None) is not None:
        out["ece_bins"] = evaluator.ece_bins
    model = getattr(evaluator, "model", None)
    if model is None:
        return out
    out["model"] = getattr(model, "name", None)
    out["model_shapes"] = {
        "num_features": getattr(model, "num_features", None),
        "num_classes": getattr(model, "num_classes", None),
    }
    if hasattr(model, "parameter_layout"):  # a module: its parameters, in θ's order
        out["model_parameters"] = [[name, list(shape)] for name, shape in model.parameter_layout()]
    if hasattr(model, "frozen_layout"):  # its parameters that were not sampled
        out["model_frozen"] = [
            [name, list(shape), dtype] for name, shape, dtype in model.frozen_layout()
        ]
    if hasattr(model, "batching"):
        out["model_batching"] = model.batching
    return out


def _round_on_disk(out) -> int | None:
    """The round of the checkpoint in ``out``, or None: a second signal may stop a run after
    its checkpoint was written and before the run noted it."""
    try:
        head = checkpoint.peek(out)
    except (OSError, FedHMCError):
        return None
    return None if head is None else int(head["round"])


def _kept(cfg: RunConfig, saved_round: int | None) -> str:
    """What a run that a failure stopped mid-way keeps, and how to go on once it is fixed."""
    if saved_round is not None:
        return (
            f"the checkpoint of round {saved_round} is kept: once fixed, continue with "
            + checkpoint.resume_command(cfg.out, cfg.to_dict())
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


def _evaluator_device(evaluator, device: torch.device) -> torch.device:
    """Where the evaluator keeps its tensors: its test inputs' device, else ``device``
    (θ₀'s)."""
    X = getattr(evaluator, "X", None)
    return X.device if isinstance(X, torch.Tensor) else device


DIAGNOSTICS_MAX_VALUES = 20_000_000
"""Collected θ̄ values kept in memory for R-hat / ESS (beyond that, no diagnostics)."""


def _diagnostics(draws: list[torch.Tensor], complete: bool) -> dict | None:
    """Split R-hat and ESS of the collected global samples across chains (None if fewer
    than 4 samples, fewer than 2 chains, or too many values to keep)."""
    if not complete or len(draws) < 4:
        return None
    from fedhmc.analysis.diagnostics import convergence_summary

    out = convergence_summary(torch.stack(draws).to(torch.float64))
    out["samples_per_chain"] = len(draws)
    out["chains"] = int(draws[0].shape[0])
    return out


def _progress(total: int, enabled: bool, initial: int = 0):
    if not enabled:
        return None
    from fedhmc.core.progress import bar

    return bar(total, "rounds", "round", initial=initial)


def _postfix(metrics: dict) -> dict:
    keys = ("accuracy", "nll_mean") if "accuracy" in metrics else ("w2", "mean_error")
    return {k: f"{metrics[k]:.4g}" for k in keys if k in metrics}
