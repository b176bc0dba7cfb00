"""The FA-HMC ServerApp (``flwr run .`` loads ``fedhmc_server.app:app``).

Settings come from the run config: ``[tool.flwr.app.config]`` in pyproject.toml, with
``--run-config "k=v ..."`` overrides, parsed by the same RunConfig as ``fedhmc run``.
``algorithm = "async-sghmc"`` or ``"async-sgld"`` selects the asynchronous mode
(`fedhmc_server.async_loop`); every other algorithm runs `fedhmc_server.loop`.
This module imports no PyTorch: the ServerApp sends the size query
(`fedhmc_server.startup`) before it loads the heavy modules.
"""

from __future__ import annotations

from fedhmc_server.progress import log_final, round_logger
from fedhmc_server.startup import begin
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedhmc.algorithms import registry
from fedhmc.runtime.config import RunConfig


def make_server_app(
    cfg: RunConfig | None = None, result: dict | None = None, on_round=None
) -> ServerApp:
    """A ServerApp running ``cfg`` (or the context's run config); stores the RunResult, or
    the exception that stopped it, in ``result`` (the in-process simulation reads it), and
    calls ``on_round`` with each round's metrics row there."""
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        run_cfg = cfg if cfg is not None else RunConfig.from_mapping(dict(context.run_config))
        try:
            c = run_cfg.resolve()  # the run's one resolution (none for a ResolvedConfig)
            # The clients answer the size query while this process imports PyTorch.
            started = begin(
                grid, c.min_clients or c.num_clients, c.node_wait_timeout, c.round_timeout
            )
            if registry.entry(c.algorithm).asynchronous:
                from fedhmc_server.async_loop import serve_async as body
            else:
                from fedhmc_server.loop import serve as body
            if result is None:  # deployed: one log line per round for `flwr run --stream`
                out = body(grid, c, on_round=round_logger(c.rounds), started=started)
                log_final(out)
            else:
                out = body(grid, c, progress=True, on_round=on_round, started=started)
        except Exception as e:  # handed to the caller, which reports it on one line
            if result is None:
                raise
            result["error"] = e
            return
        if result is not None:
            result["result"] = out

    return server


app = make_server_app()
