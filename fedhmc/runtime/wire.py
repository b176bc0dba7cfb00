"""What a Flower message carries besides the arrays, declared once: the round's settings
(sent by the ServerApp, read by the ClientApp) and an asynchronous worker's request.

The server is authoritative for every sampler setting, so a client never runs a round with
settings of its own. These are plain dicts of Python scalars (what Flower's ConfigRecord
holds); the Flower layer wraps them. Keys are kebab-case, as in Flower's run config.
"""

from __future__ import annotations

from fedhmc.algorithms import api, federated, registry
from fedhmc.runtime.config import RunConfig

DATA = {
    # wire key: (RunConfig field, type)
    "batch-size": ("batch_size", int),
    "prior-std": ("prior_std", float),
    "minibatch": ("minibatch", str),
}
"""The settings of a client's target that the server decides. (How a client computes its
gradients, ``--device`` and ``--compile``, is its own: from its run config and node
config.)"""


def encode_round(
    cfg: RunConfig, round_: int, num_total: int, round_seed: int | None = None, settings=None
) -> dict:
    """Round ``round_``'s settings: its number and seed, n, the chains, the algorithm,
    every field of the sampler's Settings (`fedhmc.algorithms.api.to_wire`; ``settings``:
    the sampler's where the caller holds them, else built from ``cfg``) and the data
    settings."""
    seed = federated.round_seed(cfg.seed, round_) if round_seed is None else round_seed
    out = {
        "round": int(round_),
        "round-seed": int(seed),
        "num-examples-total": int(num_total),
        "chains": int(cfg.chains),
        "algorithm": str(cfg.algorithm),
    }
    if cfg.data_sha256:  # the server's data: a client whose own copy differs refuses the round
        out["data-sha256"] = str(cfg.data_sha256)  # (Flower cannot count an empty string)
    if settings is None:
        settings = registry.entry(cfg.algorithm).build_settings(cfg)
    out.update(api.to_wire(settings))
    out.update({k: t(getattr(cfg, f)) for k, (f, t) in DATA.items()})
    return out


def algorithm_entry(message: dict) -> registry.Entry:
    """The registry entry of the algorithm a round's settings name (FA-HMC's when they name
    none)."""
    return registry.entry(message.get("algorithm") or registry.DEFAULT_ALGORITHM)


def decode_sampler(message: dict):
    """The sampler's settings that a round's settings carry: its module's ``Settings``
    made from them (`fedhmc.algorithms.api.from_wire`)."""
    return api.from_wire(algorithm_entry(message).module.Settings, message)


def _tables(algorithm) -> tuple[dict, dict]:
    """(message, reply): the algorithm module's tables of wire name → field."""
    return dict(algorithm.MESSAGE), dict(algorithm.REPLY)


def _names(fields, table: dict) -> tuple[str, ...]:
    by_field = {f: k for k, f in table.items()}
    return tuple(by_field[f] for f in fields)


def reply_names(algorithm, layout) -> tuple[str, ...]:
    """The array names of a client's reply in a round of ``layout`` (the algorithm's)."""
    return _names(layout.up, _tables(algorithm)[1])


def encode_message(
    cfg: RunConfig, message, num_total: int, layout, algorithm, settings=None
) -> tuple[dict, dict]:
    """A round's message as the (settings, arrays) of a Flower message: the arrays the
    round's ``layout`` names, θ̄ first, by the names the algorithm's module gives them
    (``MESSAGE``), on the CPU, and its declared scalars (``MESSAGE_VALUES``)."""
    config = encode_round(cfg, message.round, num_total, message.round_seed, settings)
    for key, f in getattr(algorithm, "MESSAGE_VALUES", {}).items():
        if getattr(message, f) is not None:
            config[key] = getattr(message, f)
    if message.client_ids is not None:  # partial participation: the round's drawn clients
        config["round-clients"] = [int(c) for c in message.client_ids.tolist()]
    down = layout.down
    # The wire carries CPU arrays, whatever device the server computes on.
    arrays = {
        k: getattr(message, f).detach().cpu()
        for k, f in zip(_names(down, _tables(algorithm)[0]), down, strict=True)
        if getattr(message, f) is not None
    }
    return config, arrays


def decode_message(config: dict, arrays: dict, dtype, device="cpu"):
    """The message a round's (settings, arrays) carry, as the algorithm's ``Broadcast``,
    its arrays as tensors of ``dtype`` on ``device`` (the client's)."""
    import torch

    algorithm = algorithm_entry(config).module
    tensors = {
        f: torch.as_tensor(arrays[k], device=device).to(dtype)
        for k, f in _tables(algorithm)[0].items()
        if k in arrays
    }
    values = {
        f: config[k] for k, f in getattr(algorithm, "MESSAGE_VALUES", {}).items() if k in config
    }
    clients = config.get("round-clients")  # partial participation (not the coefficients)
    return algorithm.Broadcast(
        round=int(config["round"]),
        round_seed=int(config["round-seed"]),
        client_ids=torch.tensor([int(c) for c in clients], device=device) if clients else None,
        **tensors,
        **values,
    )


def encode_reply(update, up: tuple[str, ...], algorithm, c: int = 0) -> dict:
    """Client ``c``'s arrays of ``update`` (on the CPU) by their wire names: the fields
    ``up`` (the layout's) as (S, D) numpy arrays."""
    names = _names(up, _tables(algorithm)[1])
    return {k: getattr(update, f)[:, c].numpy() for k, f in zip(names, up, strict=True)}


def decode_reply(arrays: dict, device, algorithm, **values):
    """A client's update (M = 1), the algorithm's ``ClientUpdate``, from its validated
    reply's arrays (S, D), with ``values`` (its energies and gradient evaluations)."""
    import torch

    table = _tables(algorithm)[1]
    fields = {table[k]: torch.as_tensor(v, device=device).unsqueeze(1) for k, v in arrays.items()}
    return algorithm.ClientUpdate(**fields, **values)


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
