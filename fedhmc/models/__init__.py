"""Likelihood models on flat parameter vectors, and federated targets."""

BATCHINGS = ("auto", "vmap", "loop")
"""How a network given as an ``nn.Module`` evaluates its rows (``--model-batching``): ``vmap``
(one batched computation), ``loop`` (one row at a time) or ``auto`` (``loop`` for
convolutions on a CPU with large inputs per row, else ``vmap``; see
``fedhmc.models.module``). Here, free of torch, so that the run configuration names it."""
