"""What a Flower message carries besides the arrays, declared once: the round's settings
(sent by the ServerApp, read by the ClientApp) and an asynchronous worker's request.

The server is authoritative for every sampler setting, so a client never runs a round with
settings of its own. These are plain dicts of Python scalars (what Flower's ConfigRecord
holds); the Flower layer wraps them. Keys are kebab-case, as in Flower's run config.
"""

from __future__ import annotations

from types import SimpleNamespace

from fedhmc.algorithms import fahmc, registry
from fedhmc.errors import MODEL_ERROR_CODE  # noqa: F401 (the wire's, declared there)
from fedhmc.runtime.config import RunConfig

SAMPLER = {
    # wire key: (RunConfig field, type); the algorithm's registry entry builds its Settings
    "local-steps": ("local_steps", int),
    "leapfrog-steps": ("leapfrog_steps", int),
    "step-size": ("step_size", float),
    "rho": ("rho", float),
    "grad-noise": ("grad_noise", float),
    "temperature": ("temperature", float),
    "sync-unit": ("sync_unit", str),
    "fresh-gradients": ("fresh_gradients", bool),
    "restart-trajectories": ("restart_trajectories", bool),
}
"""The sampler settings of a round."""

DATA = {
    # wire key: (RunConfig field, type)
    "batch-size": ("batch_size", int),
    "prior-std": ("prior_std", float),
    "minibatch": ("minibatch", str),
    "compile": ("compile", bool),
}
"""The settings of a client's target that the server decides."""


def encode_round(
    cfg: RunConfig, round_: int, num_total: int, round_seed: int | None = None
) -> dict:
    """Round ``round_``'s settings: its number and seed, n, the chains, the algorithm, and
    every sampler and data setting."""
    seed = fahmc.round_seed(cfg.seed, round_) if round_seed is None else round_seed
    out = {
        "round": int(round_),
        "round-seed": int(seed),
        "num-examples-total": int(num_total),
        "chains": int(cfg.chains),
        "algorithm": str(cfg.algorithm),
        "anchor-batch-size": int(cfg.anchor_batch_size),
    }
    if cfg.data_sha256:  # the server's data: a client whose own copy differs refuses the round
        out["data-sha256"] = str(cfg.data_sha256)  # (Flower cannot count an empty string)
    out.update({k: t(getattr(cfg, f)) for k, (f, t) in SAMPLER.items()})
    out.update({k: t(getattr(cfg, f)) for k, (f, t) in DATA.items()})
    return out


def algorithm_entry(message: dict) -> registry.Entry:
    """The registry entry of the algorithm a round's settings name (FA-HMC's when they name
    none)."""
    return registry.entry(message.get("algorithm") or registry.DEFAULT_ALGORITHM)


def decode_sampler(message: dict) -> fahmc.Settings:
    """The settings a round's settings describe, built by the algorithm's own registry
    entry from the round's settings (debiased FA-HMC's with the anchor batch size)."""
    fields = {f: t(message[k]) for k, (f, t) in SAMPLER.items()}
    algo = algorithm_entry(message)
    if algo.anchor:
        fields["anchor_batch_size"] = int(message["anchor-batch-size"])
    # Partial participation is the server's: a client's Settings draw no clients.
    view = SimpleNamespace(**fields, clients_per_round=None, participation=None)
    return algo.settings(view)


ARRAYS = {
    # array name: Broadcast field
    "theta": "position",
    "momentum": "momentum",
    "origin": "origin",
    "anchor": "anchor_position",
    "anchor-grad": "anchor_grad",
}
"""The arrays of a round's message, by the Broadcast field each carries."""

REPLY_ARRAYS = {
    # array name: ClientUpdate field
    "theta": "position",
    "momentum": "momentum",
    "grad": "local_grad",
}
"""The arrays of a client's reply, by the ClientUpdate field each carries."""


def _names(fields, table: dict) -> tuple[str, ...]:
    by_field = {f: k for k, f in table.items()}
    return tuple(by_field[f] for f in fields)


def reply_names(layout) -> tuple[str, ...]:
    """The array names of a client's reply in a round of ``layout`` (the algorithm's)."""
    return _names(layout.up, REPLY_ARRAYS)


def encode_message(cfg: RunConfig, message, num_total: int, layout) -> tuple[dict, dict]:
    """A round's Broadcast as the (settings, arrays) of a Flower message: the arrays the
    round's ``layout`` (its algorithm's) names, θ̄ first, by their wire names, on the CPU."""
    config = encode_round(cfg, message.round, num_total, message.round_seed)
    if message.anchor_round is not None:
        config["anchor-round"] = int(message.anchor_round)
    if message.client_ids is not None:  # partial participation: the round's drawn clients
        config["round-clients"] = [int(c) for c in message.client_ids.tolist()]
    down = layout.down
    # The wire carries CPU arrays, whatever device the server computes on.
    arrays = {
        k: getattr(message, f).detach().cpu()
        for k, f in zip(_names(down, ARRAYS), down, strict=True)
        if getattr(message, f) is not None
    }
    return config, arrays


def decode_message(config: dict, arrays: dict, dtype, device="cpu") -> fahmc.Broadcast:
    """The Broadcast a round's (settings, arrays) carry, its arrays as tensors of ``dtype``
    on ``device`` (the client's)."""
    import torch

    tensors = {
        f: torch.as_tensor(arrays[k], device=device).to(dtype)
        for k, f in ARRAYS.items()
        if k in arrays
    }
    anchor_round = config.get("anchor-round") if "anchor" in arrays else None
    clients = config.get("round-clients")  # partial participation (not the coefficients)
    return fahmc.Broadcast(
        round=int(config["round"]),
        round_seed=int(config["round-seed"]),
        anchor_round=None if anchor_round is None else int(anchor_round),
        client_ids=torch.tensor([int(c) for c in clients], device=device) if clients else None,
        **tensors,
    )


def encode_reply(update, up: tuple[str, ...], c: int = 0) -> dict:
    """Client ``c``'s arrays of ``update`` (on the CPU) by their wire names: the fields
    ``up`` (the layout's) as (S, D) numpy arrays."""
    names = _names(up, REPLY_ARRAYS)
    return {k: getattr(update, f)[:, c].numpy() for k, f in zip(names, up, strict=True)}


def decode_reply(arrays: dict, device, **values):
    """A client's ClientUpdate (M = 1) from its validated reply's arrays (S, D), with
    ``values`` (its energies and gradient evaluations)."""
    import torch

    fields = {
        REPLY_ARRAYS[k]: torch.as_tensor(v, device=device).unsqueeze(1) for k, v in arrays.items()
    }
    return fahmc.ClientUpdate(**fields, **values)


def apply_data(cfg: RunConfig, message: dict, keys=tuple(DATA)) -> RunConfig:
    """``cfg`` with the data settings ``keys`` taken from the message."""
    return cfg.replace(**{DATA[k][0]: DATA[k][1](message[k]) for k in keys})


def encode_async(cfg: RunConfig, chain: int, timestamp: int, request: int, num_total: int):
    """An asynchronous worker's request: the chain, the θ's timestamp, the request counter
    (which selects the minibatch), n, and the settings the gradient depends on."""
    return {
        "algorithm": str(cfg.algorithm),
        "chain": int(chain),
        "timestamp": int(timestamp),
        "request": int(request),
        "num-examples-total": int(num_total),
        "batch-size": int(cfg.batch_size),
        "prior-std": float(cfg.prior_std),
        "grad-noise": float(cfg.grad_noise),
    }


def check_data(cfg: RunConfig, message: dict) -> None:
    """Refuse a round whose server holds other data than this client (by SHA-256)."""
    want = message.get("data-sha256") or ""
    if want and cfg.data_sha256 and want != cfg.data_sha256:
        from fedhmc.errors import DataError

        raise DataError(
            f"this client's copy of {cfg.to_dict()['dataset']} differs from the server's "
            f"(SHA-256 {cfg.data_sha256[:12]}… against {want[:12]}…); give every machine the "
            "same file"
        )
