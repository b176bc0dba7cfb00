"""fed-sghmc, a federated sampler for fedhmc in a package of its own (``fedsghmc.sampler``).

Installing the package registers it: its ``pyproject.toml`` declares ``fedsghmc.sampler:ENTRY``
in the entry-point group ``fedhmc.algorithms``, and ``fedhmc run --algorithm fed-sghmc`` runs it
on the engine, on Flower and through ``--resume``.
"""

# fedhmc's registry first: importing fedsghmc.sampler before fedhmc (a script, a notebook)
# then lets the registry load this package's entry point while the sampler is not yet half
# imported, so fed-sghmc is listed in that process too.
import fedhmc.algorithms.registry  # noqa: F401
