"""fedhmc: Federated Averaging Hamiltonian Monte Carlo in pure PyTorch.

The package is layered; each layer imports only from the ones before it:

- ``fedhmc.core``: counter-based RNG and its stream table, integrators, momentum, averaging,
  gradient wrappers;
- ``fedhmc.models``: networks and targets (the clients' energies);
- ``fedhmc.analysis``: predictive metrics, MCMC diagnostics, exact laws on Gaussian targets;
- ``fedhmc.algorithms``: one module per algorithm, each with ``init`` and ``step``;
- ``fedhmc.runtime``: the run configuration, problem building, the round loop every backend
  shares and the in-process engine;
- (the Flower apps, ``fedhmc_clients`` and ``fedhmc_server``, outside this package);
- ``fedhmc.runner``: sends a run to its backend, the engine or Flower;
- ``fedhmc.sweep``, ``fedhmc.viz``, ``fedhmc.experiments``, ``fedhmc.cli``: tools on top.

The names most users need are available here: ``from fedhmc import RunConfig, run``, and
for data of your own ``from_tensors``, ``from_datasets``, ``load_npz`` and ``save_npz``.
"""

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "RunConfig",
    "run",  # any --backend (fedhmc.runner.run_config)
    "RunResult",
    "FedHMCError",
    "ConfigError",
    # Your own data (fedhmc_datasets.user): RunConfig(dataset=from_tensors(...)).
    "from_tensors",
    "from_datasets",
    "load_npz",
    "save_npz",
]


def __getattr__(name: str):
    # Lazy, so that importing one layer (say fedhmc.core.rng) does not import them all; with
    # import statements, which tests/unit/test_layers.py sees.
    if name == "run":
        from fedhmc.runner import run_config

        return run_config
    if name == "RunConfig":
        from fedhmc.runtime.config import RunConfig

        return RunConfig
    if name == "RunResult":
        from fedhmc.runtime.loop import RunResult

        return RunResult
    if name in ("FedHMCError", "ConfigError"):
        from fedhmc import errors

        return getattr(errors, name)
    if name in ("from_tensors", "from_datasets", "load_npz", "save_npz"):
        from fedhmc_datasets import user

        return getattr(user, name)
    raise AttributeError(f"module 'fedhmc' has no attribute {name!r}")
