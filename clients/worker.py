"""The node's warm worker: torch, the data partition and the target stay loaded across rounds.

Flower 1.41 starts a fresh ``flwr-clientapp`` process for every message, and importing
torch and rebuilding the partition in it costs seconds per round. So the deploy recipe
starts one worker per SuperNode (``deploy/supernode.sh``, on by default) and passes its
socket to the node as ``worker-socket`` in the node config; the ClientApp, which then
imports neither torch nor fedhmc's sampler, forwards each message to the worker and
checks its reply (`call`). Without a worker (or if it is gone) the ClientApp
computes in its own process, with the same result.

    python -m fedhmc_clients.worker --socket PATH

The channel is a Unix socket that only the node's user can open: its folder is created
with mode 0700, the socket with 0600, and the worker also refuses any peer whose uid
(SO_PEERCRED) is not its own. Frames are an 8-byte length, then a 4-byte header length,
a JSON header and the arrays as an ``.npz`` (read with ``allow_pickle=False``). Requests
are computed one at a time.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import socket
import stat
import struct
import sys
import threading
import time
from pathlib import Path

import numpy as np

from fedhmc.errors import FedHMCError

MAX_FRAME = 1 << 31


class WarmWorkerError(RuntimeError):
    """The worker could not be reached, or its reply is not valid."""


# --------------------------------------------------------------------------- framing
def _pack(header: dict, arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in arrays.items()})
    head = json.dumps(header).encode()
    body = struct.pack(">I", len(head)) + head + buf.getvalue()
    return struct.pack(">Q", len(body)) + body


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise ConnectionError("connection closed mid-frame")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _unpack(sock: socket.socket) -> tuple[dict, dict[str, np.ndarray]]:
    (size,) = struct.unpack(">Q", _recv_exact(sock, 8))
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes is too large")
    body = _recv_exact(sock, size)
    (hlen,) = struct.unpack(">I", body[:4])
    header = json.loads(body[4 : 4 + hlen])
    with np.load(io.BytesIO(body[4 + hlen :]), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return header, arrays


# --------------------------------------------------------------------------- client side
def call(
    path: str,
    kind: str,
    run_config: dict,
    node_config: dict,
    config: dict,
    arrays: dict[str, np.ndarray],
    timeout: float | None = None,
) -> tuple[dict[str, np.ndarray], dict]:
    """Send one message to the worker at ``path``; its validated (arrays, metrics)."""
    header = {
        "kind": kind,
        "run_config": run_config,
        "node_config": node_config,
        "config": config,
    }
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(path)
            s.sendall(_pack(header, arrays))
            reply, out = _unpack(s)
    except (OSError, ValueError, struct.error) as e:
        raise WarmWorkerError(f"worker at {path}: {e}") from None
    if not reply.get("ok") and reply.get("user_error"):  # this node's error: no retry helps
        raise FedHMCError(str(reply["user_error"]))
    if not reply.get("ok"):
        raise WarmWorkerError(f"worker at {path} failed: {reply.get('error', 'no reason given')}")
    validate(kind, arrays, out, reply.get("metrics"))
    return out, reply["metrics"]


def validate(kind: str, sent: dict, arrays: dict, metrics) -> None:
    """A reply's arrays must be float, finite and shaped like θ sent (the algorithm's
    reply: its module names them), a train reply's at least one; what the client keeps
    (``kept/`` arrays, for its node state) may be any finite array."""
    if not isinstance(metrics, dict) or not all(
        isinstance(k, str) and isinstance(v, int | float) for k, v in metrics.items()
    ):
        raise WarmWorkerError(f"worker reply: metrics must map names to numbers, got {metrics!r}")
    sends = {k: a for k, a in arrays.items() if not k.startswith("kept/")}
    for k, a in arrays.items():
        if k not in sends and (a.dtype.kind not in "fiu" or not np.isfinite(a).all()):
            raise WarmWorkerError(f"worker reply: {k!r} must be finite numbers")
    if kind in ("train", "grad"):
        if kind == "grad" and "grad" not in sends:
            raise WarmWorkerError("worker reply: missing 'grad'")
        if not sends:
            raise WarmWorkerError("worker reply: no arrays")
        shape = sent["theta"].shape
        for k, a in sends.items():
            if a.dtype.kind != "f" or a.shape != shape or not np.isfinite(a).all():
                raise WarmWorkerError(
                    f"worker reply: {k!r} must be finite floats of shape {shape}, "
                    f"got {a.dtype} {a.shape}"
                )


# --------------------------------------------------------------------------- server side
def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    return uid


def prepare_socket_path(path: Path) -> None:
    """A folder only this user can enter (created 0700, or checked), no stale socket."""
    folder = path.parent
    if not folder.exists():
        folder.mkdir(parents=True, mode=0o700)
    st = folder.stat()
    if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
        raise SystemExit(
            f"worker: {folder} must belong to you and be closed to others (chmod 700 {folder})"
        )
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise SystemExit(f"worker: {path} exists and is not a socket")
        path.unlink()


def warm_imports() -> None:
    """Import what a first message would: the dataset loaders and scikit-learn (seconds),
    so that the run's first query costs the data's load only."""
    import fedhmc_datasets.registry  # noqa: F401
    import sklearn.datasets  # noqa: F401
    import sklearn.model_selection  # noqa: F401


def _listening_socket(path: Path) -> socket.socket:
    """A Unix socket listening on ``path``, readable and writable by this user alone."""
    prepare_socket_path(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        server.bind(str(path))
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    server.listen(8)
    server.settimeout(0.5)  # to notice a stop
    return server


def _serve_one(conn: socket.socket, compute, lock: threading.Lock) -> None:
    """Answer one connection of this user's (another user's is closed unanswered): the
    message computed under ``lock``, or the error as the ClientApp reports it."""
    with conn:
        try:
            if _peer_uid(conn) != os.getuid():
                return
            header, arrays = _unpack(conn)
            t0 = time.perf_counter()
            with lock:
                out, metrics = compute(
                    header["kind"],
                    header["run_config"],
                    header["node_config"],
                    header["config"],
                    arrays,
                )
            reply = {"ok": True, "metrics": metrics}
            r = header["config"].get("round", "")
            print(
                f"fedhmc worker: served {header['kind']}{f' round {r}' if r else ''} "
                f"in {time.perf_counter() - t0:.2f} s",
                flush=True,
            )
        except Exception as e:  # noqa: BLE001 (reported to the ClientApp)
            out, reply = {}, {"ok": False, "error": f"{type(e).__name__}: {e}"}
            if isinstance(e, FedHMCError):  # the user's: one line, nothing to retry
                reply["user_error"] = str(e)
        try:
            conn.sendall(_pack(reply, out))
        except OSError:
            pass


def serve_worker(
    path: str | Path,
    ready: threading.Event | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Accept connections on ``path`` until SIGTERM/SIGINT, or until ``stop`` is set."""
    from fedhmc_clients.compute import compute  # the heavy imports, once

    warm_imports()
    path = Path(path)
    server = _listening_socket(path)
    lock = threading.Lock()
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: (stop.set(), server.close()))
    if ready is not None:
        ready.set()
    print(f"fedhmc worker: listening on {path} (pid {os.getpid()})", flush=True)
    try:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                break
            threading.Thread(target=_serve_one, args=(conn, compute, lock), daemon=True).start()
    finally:
        server.close()
        try:
            path.unlink()
        except OSError:
            pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fedhmc_clients.worker", description=__doc__)
    ap.add_argument("--socket", required=True, help="the Unix socket to listen on")
    args = ap.parse_args(argv)
    serve_worker(args.socket)
    return 0


if __name__ == "__main__":
    sys.exit(main())
