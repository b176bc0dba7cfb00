"""Splitting a dataset over federated clients, and describing the split.

`partition` maps labels to one sorted int64 index array per client; together the arrays
cover every example exactly once. The result depends only on the labels, the arguments and
``seed``. Methods (`PARTITIONERS`):

``iid``
    A random permutation cut into ``num_clients`` parts whose sizes differ by at most one.
``dirichlet``
    Label skew (Hsu et al. 2019; Yurochkin et al. 2019): for each class, shares
    ``p ~ Dirichlet(alpha * 1_N)`` of its examples go to the N clients; clients that already
    hold at least n/N examples get no share of the next classes (the usual balancing of that
    scheme). Small ``alpha`` = strong skew, large ``alpha`` = close to iid. Draws are repeated
    (at most `MAX_DIRICHLET_TRIES` times) until every client has ``min_size`` examples.
``shards``
    Pathological label skew (McMahan et al. 2017): each class is cut into label-pure shards,
    ``num_clients * classes_per_client`` shards in all, and each client gets
    ``classes_per_client`` shards of that many DISTINCT classes. Shard counts per class are
    proportional to class sizes (at least 1, at most ``num_clients``), and shards are dealt
    round-robin in class order, which guarantees the distinctness.
``quantity``
    Quantity skew: client sizes proportional to ``w_i ~ LogNormal(0, sigma)``, rounded to sum
    to n with every client at least 1; examples assigned at random (labels iid).

The methods see only the labels (any non-negative integers; classes may be missing), so they
work on user data as on the named datasets. A split the user already has (one client id per
example) is turned into the same format by ``partition_given``.
"""

from __future__ import annotations

import math
import numbers
from pathlib import Path

import numpy as np

from fedhmc.errors import ConfigError, DataError

PARTITIONERS = ("iid", "dirichlet", "shards", "quantity")
MAX_DIRICHLET_TRIES = 100


def _as_labels(labels) -> np.ndarray:
    if hasattr(labels, "detach"):  # torch.Tensor
        labels = labels.detach().cpu().numpy()
    arr = np.asarray(labels)
    if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
        raise DataError(
            f"labels must be a non-empty 1-D array of integers, got shape {arr.shape} "
            f"and dtype {arr.dtype}"
        )
    if arr.min() < 0:
        raise DataError(f"labels must be non-negative, got {arr.min()}")
    return arr.astype(np.int64, copy=False)


def _missing_ids(ids: np.ndarray, limit: int = 10) -> tuple[int, str]:
    """Count the ids in ``0 .. max`` that never occur, and name the first ``limit`` of them."""
    present = np.unique(ids)
    total = int(ids.max()) + 1 - len(present)
    # The first `limit` missing ids all lie below len(present) + limit.
    first = np.setdiff1d(np.arange(min(int(ids.max()) + 1, len(present) + limit)), present)
    shown = ", ".join(str(int(i)) for i in first[:limit])
    return total, shown + (f" and {total - limit} more" if total > limit else "")


def as_client_ids(client_ids, name: str = "client_ids", length: int | None = None) -> np.ndarray:
    """Check one client id per example and return them as int64.

    Ids must be integers (whole-number floats are accepted) in ``0 .. N - 1`` with every id
    holding at least one example; ``length``, when given, is the required number of ids.

    Raises
    ------
    DataError
        With a one-line message naming ``name`` and the problem.
    """
    if hasattr(client_ids, "detach"):  # torch.Tensor
        client_ids = client_ids.detach().cpu().numpy()
    arr = np.asarray(client_ids)
    if arr.ndim != 1:
        raise DataError(
            f"{name} must be a 1-D array with one client id per training example, got shape "
            f"{arr.shape}; flatten it with .reshape(-1)"
        )
    if length is not None and len(arr) != length:
        raise DataError(
            f"{name} has {len(arr)} entries but there are {length} training examples; give "
            "exactly one client id per training row"
        )
    if arr.size == 0:
        raise DataError(f"{name} is empty; give one client id per example")
    if np.issubdtype(arr.dtype, np.floating):
        whole = np.isfinite(arr) & (arr == np.round(arr)) & (np.abs(arr) < 2.0**62)
        if not whole.all():
            bad = arr[~whole][0]
            raise DataError(
                f"{name} must hold integer client ids, but {int((~whole).sum())} entries are "
                f"not whole numbers (e.g. {bad}); use ids 0 .. N-1"
            )
    elif not (np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_):
        raise DataError(
            f"{name} must hold integer client ids, got dtype {arr.dtype}; use ids 0 .. N-1"
        )
    if arr.min() < 0:
        raise DataError(f"{name} holds negative client id {arr.min()}; client ids must be 0 .. N-1")
    ids = arr.astype(np.int64)
    total, shown = _missing_ids(ids)
    if total:
        top = int(ids.max())
        raise DataError(
            f"{name} has ids up to {top} but client(s) {shown} hold no example; every client "
            f"0 .. {top} needs at least one row, so renumber the ids consecutively from 0"
        )
    return ids


def _is_int(x: object) -> bool:
    return isinstance(x, int | np.integer) and not isinstance(x, bool)


def _is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def _split_by_sizes(perm: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    return [np.sort(p).astype(np.int64) for p in np.split(perm, np.cumsum(sizes)[:-1])]


def _iid(y: np.ndarray, n_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [np.sort(p).astype(np.int64) for p in np.array_split(rng.permutation(len(y)), n_clients)]


def _dirichlet(
    y: np.ndarray, n_clients: int, rng: np.random.Generator, alpha: float, min_size: int
) -> list[np.ndarray]:
    n = len(y)
    by_class = [np.flatnonzero(y == c) for c in np.unique(y)]
    smallest = 0
    for _ in range(MAX_DIRICHLET_TRIES):
        parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
        sizes = np.zeros(n_clients, dtype=np.int64)
        for idx in by_class:
            idx = rng.permutation(idx)
            p = rng.dirichlet(np.full(n_clients, alpha)) * (sizes < n / n_clients)
            if not p.sum() > 0:
                break
            cuts = (np.cumsum(p / p.sum()) * len(idx)).astype(np.int64)[:-1]
            for client, chunk in enumerate(np.split(idx, cuts)):
                parts[client].append(chunk)
                sizes[client] += len(chunk)
        else:
            smallest = max(smallest, int(sizes.min()))
            if sizes.min() >= min_size:
                return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]
    raise DataError(
        f"dirichlet partition with alpha={alpha} could not give each of {n_clients} clients "
        f"min_size={min_size} examples in {MAX_DIRICHLET_TRIES} draws (best smallest client: "
        f"{smallest}); use a larger alpha, fewer clients, or a smaller min_size "
        "(--min-client-size)"
    )


def _shard_counts(class_sizes: np.ndarray, n_clients: int, k: int) -> np.ndarray:
    """Shards per class: >= 1, <= min(N, size), sum N*k, as equal in shard size as possible."""
    caps = np.minimum(class_sizes, n_clients)
    counts = np.ones(len(class_sizes), dtype=np.int64)
    for _ in range(n_clients * k - len(class_sizes)):
        avg = np.where(counts < caps, class_sizes / counts, -1.0)
        counts[int(np.argmax(avg))] += 1
    return counts


def _shards(y: np.ndarray, n_clients: int, rng: np.random.Generator, k: int) -> list[np.ndarray]:
    classes, class_sizes = np.unique(y, return_counts=True)
    total = n_clients * k
    if len(classes) > total:
        raise DataError(
            f"shards: {n_clients} clients x {k} classes per client = {total} shards cannot cover "
            f"{len(classes)} classes; raise classes_per_client or num_clients"
        )
    if np.minimum(class_sizes, n_clients).sum() < total:
        raise DataError(
            f"shards: {len(y)} examples in {len(classes)} classes are too few to give each of "
            f"{n_clients} clients {k} distinct classes; lower classes_per_client or num_clients"
        )
    counts = _shard_counts(class_sizes, n_clients, k)
    shards: list[np.ndarray] = []
    for c in rng.permutation(len(classes)):  # class order random; each class contiguous
        idx = rng.permutation(np.flatnonzero(y == classes[c]))
        shards.extend(np.array_split(idx, counts[c]))
    # Shard j goes to client j mod N: a class's <= N consecutive shards hit distinct clients.
    owner = rng.permutation(n_clients)
    parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
    for j, shard in enumerate(shards):
        parts[owner[j % n_clients]].append(shard)
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]


def _quantity(
    y: np.ndarray, n_clients: int, rng: np.random.Generator, sigma: float
) -> list[np.ndarray]:
    n = len(y)
    log_w = rng.normal(0.0, sigma, n_clients)  # w ~ LogNormal(0, sigma), scaled to max 1
    w = np.exp(log_w - log_w.max())
    share = (n - n_clients) * w / w.sum()
    sizes = 1 + np.floor(share).astype(np.int64)
    short = n - int(sizes.sum())
    sizes[np.argsort(-(share - np.floor(share)), kind="stable")[:short]] += 1
    return _split_by_sizes(rng.permutation(n), sizes)


def partition(
    labels,
    num_clients: int,
    method: str = "iid",
    *,
    seed: int = 0,
    alpha: float = 0.5,
    classes_per_client: int = 2,
    min_size: int | None = None,
    sigma: float = 1.0,
) -> list[np.ndarray]:
    """Split examples over clients.

    Parameters
    ----------
    labels : array-like of int or torch.Tensor
        Class label of each example, shape ``(n,)``.
    num_clients : int
        Number of clients N, ``1 <= N <= n``.
    method : {"iid", "dirichlet", "shards", "quantity"}
        See the module docstring.
    seed : int
        Seed; the same arguments and seed always give the same split.
    alpha : float
        Dirichlet concentration (``dirichlet``), finite and > 0.
    classes_per_client : int
        Distinct classes per client (``shards``), between 1 and the number of classes present.
    min_size : int, optional
        Smallest client size (``dirichlet``). Default ``max(1, min(10, n // (2 N)))``: 10
        examples, but at most half the mean client size.
    sigma : float
        Log-normal spread of client sizes (``quantity``), finite and >= 0 (0 = equal sizes).

    Returns
    -------
    list of np.ndarray
        ``num_clients`` sorted int64 index arrays, disjoint and covering ``range(n)``.

    Raises
    ------
    ConfigError
        Unknown method or an invalid parameter.
    DataError
        Invalid labels, or a split that cannot be made (e.g. dirichlet min_size unmet).
    """
    y = _checked_partition_args(labels, num_clients, method, seed)
    rng = np.random.default_rng(seed)
    if method == "iid":
        return _iid(y, num_clients, rng)
    if method == "dirichlet":
        alpha, min_size = _dirichlet_options(alpha, min_size, len(y), num_clients)
        return _dirichlet(y, num_clients, rng, alpha, min_size)
    if method == "shards":
        return _shards(y, num_clients, rng, _checked_classes_per_client(y, classes_per_client))
    if not _is_real(sigma) or sigma < 0:
        raise ConfigError(f"sigma must be a finite number >= 0, got {sigma!r}")
    return _quantity(y, num_clients, rng, float(sigma))


def _checked_partition_args(labels, num_clients, method: str, seed) -> np.ndarray:
    """partition's labels as an int64 array, after checking the method, the client count
    and the seed."""
    if method not in PARTITIONERS:
        raise ConfigError(
            f"unknown partition method {method!r}; choose one of {', '.join(PARTITIONERS)}"
        )
    y = _as_labels(labels)
    n = len(y)
    if not _is_int(num_clients) or not 1 <= num_clients <= n:
        raise ConfigError(
            f"num_clients must be an integer between 1 and the number of examples ({n}), "
            f"got {num_clients!r}"
        )
    if not _is_int(seed) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    return y


def _dirichlet_options(alpha, min_size, n: int, num_clients: int) -> tuple[float, int]:
    """The dirichlet split's alpha and min_size, checked (min_size's default filled in)."""
    if not _is_real(alpha) or alpha <= 0:
        raise ConfigError(
            f"alpha must be a finite number > 0, got {alpha!r}; small alpha (e.g. 0.1) "
            "gives strong label skew, large alpha (e.g. 100) nearly iid"
        )
    if min_size is None:
        min_size = max(1, min(10, n // (2 * num_clients)))
    if not _is_int(min_size) or not 0 <= min_size <= n // num_clients:
        raise ConfigError(
            f"min_size must be an integer between 0 and n / num_clients = "
            f"{n // num_clients}, got {min_size!r}"
        )
    return float(alpha), int(min_size)


def _checked_classes_per_client(y: np.ndarray, classes_per_client) -> int:
    """The shards split's classes per client, checked against the classes present."""
    n_classes = len(np.unique(y))
    if not _is_int(classes_per_client) or not 1 <= classes_per_client <= n_classes:
        raise ConfigError(
            f"classes_per_client must be an integer between 1 and the number of classes "
            f"({n_classes}), got {classes_per_client!r}"
        )
    return int(classes_per_client)


def partition_given(client_ids) -> list[np.ndarray]:
    """Turn one client id per example into one index array per client.

    Parameters
    ----------
    client_ids : array-like of int or torch.Tensor
        Client of each example, shape ``(n,)``, ids ``0 .. N - 1``, each id used at least once.

    Returns
    -------
    list of np.ndarray
        ``N`` sorted int64 index arrays, disjoint and covering ``range(n)`` (the format of
        ``partition``); array ``i`` holds the examples whose id is ``i``.

    Raises
    ------
    DataError
        Ids that are not 1-D non-negative integers, or an id in ``0 .. max`` with no example.
    """
    ids = as_client_ids(client_ids)
    order = np.argsort(ids, kind="stable")  # stable: indices stay sorted within a client
    counts = np.bincount(ids)
    return [p.astype(np.int64) for p in np.split(order, np.cumsum(counts)[:-1])]


def label_histogram(labels, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """Return the ``(N, C)`` int64 matrix of label counts per client."""
    y = _as_labels(labels)
    if y.max() >= num_classes:
        raise DataError(f"label {y.max()} is out of range for num_classes={num_classes}")
    return np.stack([np.bincount(y[p], minlength=num_classes) for p in parts]).astype(np.int64)


def label_entropy(labels, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """Return each client's label entropy in bits (0 for one class or an empty client).

    The maximum, ``log2(num_classes)``, means a uniform label mix.
    """
    hist = label_histogram(labels, parts, num_classes).astype(np.float64)
    totals = hist.sum(axis=1, keepdims=True)
    p = np.divide(hist, totals, out=np.zeros_like(hist), where=totals > 0)
    logp = np.log2(p, out=np.zeros_like(p), where=p > 0)
    return -(p * logp).sum(axis=1) + 0.0


def format_partition_table(labels, parts: list[np.ndarray], num_classes: int) -> str:
    """Return a text table, one row per client: size, label counts per class, entropy (bits)."""
    hist = label_histogram(labels, parts, num_classes)
    ent = label_entropy(labels, parts, num_classes)
    width = max(5, len(str(int(hist.max(initial=0)))) + 1)
    head = f"{'client':>6} {'size':>7} " + "".join(
        f"{f'c{c}':>{width}}" for c in range(num_classes)
    )
    lines = [head + f" {'entropy':>8}"]
    for i, (row, e) in enumerate(zip(hist, ent, strict=True)):
        counts = "".join(f"{int(v):>{width}}" for v in row)
        lines.append(f"{i:>6} {int(row.sum()):>7} {counts} {e:>8.3f}")
    total = hist.sum(axis=0)
    counts = "".join(f"{int(v):>{width}}" for v in total)
    q = total[total > 0] / max(int(total.sum()), 1)
    pooled = float(-(q * np.log2(q)).sum())
    lines.append(f"{'all':>6} {int(total.sum()):>7} {counts} {pooled:>8.3f}")
    lines.append(
        f"mean label entropy per client: {np.mean(ent):.3f} bits "
        f"(all labels pooled: {pooled:.3f}; lower means more skewed)"
    )
    return "\n".join(lines)


def plot_label_heatmap(
    labels, parts: list[np.ndarray], num_classes: int, path, title: str | None = None
) -> Path:
    """Save a clients x classes heat-map of label counts; format from the suffix (.png, .pdf).

    Each row is a client, labelled with its size; ``title`` goes above the plot.

    Uses matplotlib's Agg canvas directly, so no display and no global backend change.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    if path.suffix.lower() not in (".png", ".pdf"):
        raise ConfigError(f"heat-map file {path} must end in .png or .pdf")
    hist = label_histogram(labels, parts, num_classes)
    n_clients = hist.shape[0]
    fig = Figure(figsize=(1.5 + 0.45 * num_classes, 1.2 + 0.3 * min(n_clients, 60)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    im = ax.imshow(hist, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    ax.set_xticks(range(num_classes))
    if n_clients <= 40:
        ax.set_yticks(range(n_clients))
        ax.set_yticklabels([f"{i} (n={int(r.sum())})" for i, r in enumerate(hist)], fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, label="examples")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path
