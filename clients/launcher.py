"""A SuperNode's ClientApp launcher that starts each ClientApp process in milliseconds.

Under ``flower-supernode --isolation subprocess`` (Flower's default) the SuperNode's
SuperExec starts a fresh ``flwr-clientapp`` process for every message, which imports
Flower again each time (1.5 to 2 s of CPU). Flower 1.41's ``flwr-clientapp`` serves one
message and exits, and its warm executor pools are for Kubernetes and other task types, so
no Flower option keeps a ClientApp warm.

This launcher takes the SuperExec's place beside a SuperNode started with ``--isolation
process``: it acquires the SuperNode's ClientApp tasks as Flower's SuperExec does
(`flwr.supercore.superexec.run_superexec`), and starts each one as a child forked from a
process that has imported Flower's ClientApp runtime once (the fork server). Every message
still runs in a process of its own, a copy of a process that never ran one: nothing one
message or run leaves in memory reaches another, as under ``--isolation subprocess``; what
a node keeps between rounds stays in the SuperNode's node state.

    python -m fedhmc_clients.launcher --runtime-api-address 127.0.0.1:9094 --insecure \\
        --parent-pid SUPERNODE_PID

``deploy/supernode.sh`` starts it (``--launcher fork``, the default).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

CLIENT_APP_TASK = "flwr-clientapp"
"""Flower's task type of a ClientApp (``flwr.supercore.constant.TaskType.CLIENT_APP``)."""


def _serve_forks(requests: int) -> None:
    """The fork server: import Flower's ClientApp runtime once, then fork one child for
    each request (a JSON line on the pipe ``requests``) that runs it for one task and
    exits. Ends when the pipe closes (its launcher ended)."""
    from flwr.supercore.tls import validate_and_resolve_root_certificates
    from flwr.supernode.runtime.run_clientapp import run_clientapp

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    with os.fdopen(requests, "r") as pipe:
        for line in pipe:
            task = json.loads(line)
            if os.fork() != 0:
                continue
            code = 1
            try:
                pipe.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                run_clientapp(
                    runtime_api_address=task["address"],
                    token=task["token"],
                    insecure=task["insecure"],
                    certificates=validate_and_resolve_root_certificates(
                        task["root_certificates"], task["insecure"]
                    ),
                    parent_pid=task["parent_pid"],
                )
                code = 0
            except SystemExit as e:  # flwr_exit: the ClientApp's exit code
                code = e.code if isinstance(e.code, int) else 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)


def _fork_executor(requests):
    """Flower's subprocess executor, but a ClientApp task goes to the fork server (the
    pipe ``requests``) instead of a new ``flwr-clientapp`` process."""
    from flwr.supercore.superexec.executor import LaunchResult
    from flwr.supercore.superexec.executor.subprocess_executor import SubprocessExecutor

    class ForkExecutor(SubprocessExecutor):
        def launch(self, spec):
            if str(spec.task_type) != CLIENT_APP_TASK or spec.runtime_dependency_install:
                return super().launch(spec)
            task = {
                "address": spec.runtime_api_address,
                "token": spec.token,
                "insecure": spec.insecure,
                "root_certificates": spec.root_certificates_path,
                "parent_pid": spec.parent_pid,
            }
            requests.write(json.dumps(task) + "\n")
            requests.flush()
            return LaunchResult.accepted()

    return ForkExecutor()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m fedhmc_clients.launcher", description=__doc__)
    p.add_argument("--runtime-api-address", required=True, help="the SuperNode's, host:port")
    p.add_argument("--insecure", action="store_true", help="the Runtime API without TLS")
    p.add_argument("--root-certificates", help="CA of the Runtime API's TLS certificate")
    p.add_argument("--parent-pid", type=int, help="end with this process (the SuperNode)")
    args = p.parse_args(argv)
    read, write = os.pipe()
    if os.fork() == 0:  # the fork server, forked while this process has one thread
        os.close(write)
        _serve_forks(read)
        os._exit(0)
    os.close(read)
    requests = os.fdopen(write, "w")
    from flwr.supercore.superexec import run_superexec as superexec

    superexec.get_executor = lambda *a, **k: _fork_executor(requests)
    superexec.run_superexec(
        runtime_api_address=args.runtime_api_address,
        insecure=args.insecure,
        root_certificates_path=args.root_certificates,
        parent_pid=args.parent_pid,
    )


if __name__ == "__main__":  # pragma: no cover
    main()
