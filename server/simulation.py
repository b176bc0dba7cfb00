"""``fedhmc run --backend flower``: the same run through Flower's simulation engine.

The ServerApp and ClientApp are the real ones; Flower's in-process simulation runtime
(Ray) hosts N virtual SuperNodes, each with ``partition-id`` and ``num-partitions`` in its
node config. Flower's runner takes no run config, so the config reaches both apps through
the factories. Nothing is left running afterwards: the runtime stops its Ray workers.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import warnings

from fedhmc.algorithms import registry
from fedhmc.errors import FedHMCError, RunFailed, RunInterrupted, first_line
from fedhmc.runtime.backends import prepare
from fedhmc.runtime.config import MODELS, RunConfig
from fedhmc.runtime.loop import RunResult


def flower_environment(home: str | None = None) -> None:
    """The environment Flower needs here: offline, quiet, with a writable FLWR_HOME."""
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    home = (
        home
        or os.environ.get("FLWR_HOME")
        or os.path.join(os.path.expanduser("~"), ".cache", "fedhmc", "flwr-home")
    )
    os.makedirs(home, exist_ok=True)
    os.environ["FLWR_HOME"] = home


def _hard_stop(signum: int) -> None:
    """The second signal: shut Ray down (no worker left behind) and exit at once. The last
    checkpoint stays valid; ``--resume`` continues from it."""
    try:
        import ray

        ray.shutdown()
    except Exception:  # noqa: BLE001 - exiting anyway
        pass
    print("fedhmc: stopped at once; --resume continues from the last checkpoint", file=sys.stderr)
    os._exit(128 + int(signum))


def run_flower(cfg: RunConfig, progress: bool = True, client_app=None, on_round=None) -> RunResult:
    """Run ``cfg`` through Flower's simulation engine.

    It writes the same files as `fedhmc.runtime.engine.run`. ``on_round`` is called with
    each round's metrics row; ``client_app`` replaces the ClientApp (tests use it to
    inject failures).
    """
    flower_environment()
    cfg = _checked_before_start(cfg)
    from fedhmc_clients.app import make_client_app
    from fedhmc_clients.compute import COLOCATED_KEY
    from fedhmc_server.app import make_server_app
    from flwr.simulation import run_simulation

    result: dict = {}
    server = make_server_app(cfg, result, on_round)
    from fedhmc.runtime.loop import StopRequest

    StopRequest.signum = None
    on_signal = _stop_on_signal(progress)
    old_handlers = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            old_handlers[sig] = signal.signal(sig, on_signal)
    # The virtual clients share this machine: a federated sampler's clients compute each
    # round in one batch, in one Ray worker with every core and, under --device cuda, a GPU
    # (fedhmc_clients.task.colocated_update; the resources: client_resources).
    colocated = client_app is None and registry.find(cfg.algorithm).federated
    client = client_app or make_client_app({**cfg.to_run_config(), COLOCATED_KEY: colocated})
    from fedhmc_server.flower_log import FlowerOutput
    from fedhmc_server.reaper import start_reaper

    reaper = start_reaper()  # Ray's processes end with this one, even under kill -9

    def simulate() -> None:
        _simulate(run_simulation, server, client, cfg, colocated)

    output, stopped = FlowerOutput(), None  # Flower's and Ray's account: to flower.log
    try:
        with output:
            if old_handlers:
                _run_keeping_handlers(simulate, old_handlers, on_signal)
            else:
                simulate()
    except Exception as e:  # Flower's runtime failed; the run's own error is in `result`
        stopped = e
    finally:
        _clean_up(old_handlers, reaper)
    return _outcome(result, output.write(cfg.out), stopped)


def _outcome(result: dict, flower_log, stopped: Exception | None) -> RunResult:
    """The run's result, or its error on one line naming ``flower_log`` (where Flower's
    own account of the failure went) when one was written; ``stopped``: what Flower's
    runtime raised, if it did."""
    where = f"; Flower's log is in {flower_log}" if flower_log else ""
    error = result.get("error")
    named = isinstance(error, FedHMCError) and not isinstance(error, RunInterrupted)
    if named and error.args and where:
        error.args = (f"{error.args[0]}{where}", *error.args[1:])
    if error is not None:
        raise error
    if "result" not in result:
        cause = first_line(stopped) if stopped is not None else "no reason given"
        raise RunFailed(
            f"Flower's simulation stopped before the run ended ({cause}){where}"
        ) from stopped
    log = logging.getLogger("fedhmc.server")
    if stopped is not None:  # after the run's end: its files are complete
        log.warning(
            "Flower's simulation failed after the run ended (%s)%s", first_line(stopped), where
        )
    elif flower_log:  # a run that went on despite failures, which Flower logged
        log.warning("Flower's log is in %s", flower_log)
    return result["result"]


def _checked_before_start(cfg: RunConfig) -> RunConfig:
    """``cfg`` prepared, with the checks that can fail done before Ray starts: the run
    config the apps rebuild the run from, a resume's checkpoint, and a user's model (made
    importable in Ray's workers)."""
    cfg = prepare(cfg)
    cfg.to_run_config()  # one line, before start-up, if the apps could not rebuild the run
    if cfg.resume:  # the checkpoint's checks too, before Ray starts (they take seconds)
        from fedhmc.runtime.loop import prepare_out

        prepare_out(cfg)
    if cfg.model not in MODELS:
        # The user's model module must import in Ray's workers too, from where it imports
        # here (the current folder, as `python -m` and `fedhmc run` allow).
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if os.getcwd() not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([os.getcwd(), *paths])
        from fedhmc.runtime.problem import build_evaluator

        build_evaluator(cfg)  # a module that cannot be sampled is refused now, in one line
    return cfg


def _stop_on_signal(progress: bool):
    """The SIGINT/SIGTERM handler: the first signal stops the run after this round (said
    on stderr when ``progress``), a second one at once (`_hard_stop`)."""
    from fedhmc.runtime.loop import StopRequest, request_stop

    def on_signal(signum, frame):
        if StopRequest.signum is not None:  # a second signal: stop at once
            _hard_stop(signum)
        request_stop(signum)
        if progress:
            print(
                "\nfedhmc: stopping after this round (signal again to stop at once)",
                file=sys.stderr,
                flush=True,
            )

    return on_signal


def _run_keeping_handlers(simulate, old_handlers: dict, on_signal) -> None:
    """Run ``simulate`` in a thread of its own so that this (main) thread keeps the signal
    handlers: Ray installs its own SIGTERM handler when started from the main thread, which
    would abort the run mid-round. What ``simulate`` raises is raised here."""
    failure: list[BaseException] = []

    def body() -> None:
        try:
            simulate()
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
            failure.append(e)

    worker = threading.Thread(target=body, name="flower-simulation", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(timeout=0.2)
        # Ray's native code installs handlers of its own once it has started;
        # take SIGINT and SIGTERM back (a cheap call).
        for sig in old_handlers:
            signal.signal(sig, on_signal)
    if failure:
        raise failure[0]


def _clean_up(old_handlers: dict, reaper) -> None:
    """After the run: the old signal handlers back, no stop pending, and the reaper (Ray's
    watchdog) ended."""
    from fedhmc.runtime.loop import StopRequest

    for sig, handler in old_handlers.items():
        signal.signal(sig, handler)
    StopRequest.signum = None
    if reaper is not None:  # the run ended here: nothing for the watchdog to do
        reaper.kill()
        reaper.wait()


def on_cuda(device: str) -> bool:
    """Whether ``device`` names a CUDA GPU (``cuda``, ``cuda:N``)."""
    return device == "cuda" or device.startswith("cuda:")


def client_resources(cfg: RunConfig, cpus: int, colocated: bool) -> dict:
    """What each simulated client asks Ray for: CPUs and a share of a GPU.

    Co-located clients compute a round in one batch: one worker holding every core does
    it once. Clients that compute alone get a worker per core. Under ``--device cuda``
    each client asks for ``--client-gpus`` of a GPU (default 1: the co-located batch holds
    one GPU, and clients that compute alone take a whole GPU each, so as many compute at
    once as there are GPUs)."""
    share = 0.0
    if on_cuda(cfg.device):
        share = 1.0 if cfg.client_gpus is None else float(cfg.client_gpus)
    return {"num_cpus": cpus if colocated else 1, "num_gpus": share}


def ray_init_args(cfg: RunConfig, cpus: int, gpus: int) -> dict:
    """Ray's start-up settings: ``cpus`` cores and, under ``--device cuda``, the machine's
    ``gpus`` GPUs (``cuda:N``: GPU N alone, see `ray_visible_devices`)."""
    num_gpus = 0
    if on_cuda(cfg.device):
        num_gpus = 1 if ":" in cfg.device else int(gpus)
    return {
        "num_cpus": cpus,
        "num_gpus": num_gpus,
        "logging_level": "ERROR",
        "log_to_driver": False,
        "include_dashboard": False,
    }


def ray_visible_devices(device: str, visible: str | None) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for Ray's processes under ``--device cuda:N``: GPU N alone,
    as this process numbers it (``visible``: this process's ``CUDA_VISIBLE_DEVICES``, or
    None); None to leave it as it is. A client that holds a share of a GPU computes on the
    one Ray gives it (``fedhmc_clients.compute.client_device``), here GPU N."""
    if not on_cuda(device) or ":" not in device:
        return None
    index = int(device.split(":", 1)[1])
    ids = [v.strip() for v in visible.split(",") if v.strip()] if visible else []
    return ids[index] if index < len(ids) else str(index)


def _simulate(run_simulation, server, client, cfg: RunConfig, colocated: bool = True) -> None:
    cpus = max(1, min(os.cpu_count() or 1, cfg.num_clients))
    gpus = 0
    pinned = ray_visible_devices(cfg.device, os.environ.get("CUDA_VISIBLE_DEVICES"))
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    if on_cuda(cfg.device):
        import torch

        torch.cuda.init()  # this process keeps every GPU it sees (the server's cuda:N)
        gpus = torch.cuda.device_count()
    if pinned is not None:  # Ray's processes see GPU N alone, as cuda:0
        os.environ["CUDA_VISIBLE_DEVICES"] = pinned
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run_simulation(
                server_app=server,
                client_app=client,
                num_supernodes=cfg.num_clients,
                backend_config={
                    "client_resources": client_resources(cfg, cpus, colocated),
                    "init_args": ray_init_args(cfg, cpus, gpus),
                },
            )
    finally:
        if pinned is not None:
            if saved is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = saved
