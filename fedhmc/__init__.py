"""fedhmc: Federated Averaging Hamiltonian Monte Carlo in pure PyTorch.

The package is layered; each layer imports only from the ones before it:

- ``fedhmc.core``: counter-based RNG and its stream table, integrators, momentum, averaging,
  gradient wrappers;
- ``fedhmc.models``: networks and targets (the clients' energies);
- ``fedhmc.analysis``: predictive metrics, MCMC diagnostics, exact laws on Gaussian targets;
- ``fedhmc.algorithms``: one module per algorithm, each with ``init`` and ``step``;
- ``fedhmc.runtime``: the run configuration, problem building and the round loop;
- ``fedhmc.sweep``, ``fedhmc.viz``, ``fedhmc.experiments``, ``fedhmc.cli``: tools on top.

The names most users need are available here: ``from fedhmc import RunConfig, run``, and
for data of your own ``from_tensors``, ``from_datasets``, ``load_npz`` and ``save_npz``.
"""

__version__ = "0.1.0"

_PUBLIC = {
    "RunConfig": "fedhmc.runtime.config",
    "run": "fedhmc.runtime.backends:run_config",  # any --backend
    "RunResult": "fedhmc.runtime.engine",
    "FedHMCError": "fedhmc.errors",
    "ConfigError": "fedhmc.errors",
    # Your own data (fedhmc_datasets.user): RunConfig(dataset=from_tensors(...)).
    "from_tensors": "fedhmc_datasets.user",
    "from_datasets": "fedhmc_datasets.user",
    "load_npz": "fedhmc_datasets.user",
    "save_npz": "fedhmc_datasets.user",
}
__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str):
    # Lazy, so that importing one layer (say fedhmc.core.rng) does not import them all.
    if name in _PUBLIC:
        import importlib

        module, _, attr = _PUBLIC[name].partition(":")
        return getattr(importlib.import_module(module), attr or name)
    raise AttributeError(f"module 'fedhmc' has no attribute {name!r}")
