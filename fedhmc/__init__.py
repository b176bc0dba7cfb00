"""fedhmc: Federated Averaging Hamiltonian Monte Carlo in pure PyTorch."""

__version__ = "0.1.0"
