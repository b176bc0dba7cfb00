r"""Federated targets: the clients' local energies f^(c) and their stochastic gradients.

The target (docs/algorithms.md). Client c holds n_c points, n = Σ n_c, w_c = n_c / n, and

    f^(c)(θ) = (n / n_c) Σ_i ℓ(θ; z_i^c) − log p₀(θ),     f = Σ_c w_c f^(c),

so every local energy is the client's own data scaled up to the full data size plus the
whole prior, and π ∝ exp(−f) is the full-data posterior. A minibatch S of size B gives the
unbiased estimate $\frac{n}{B} \sum_{i \in S} \nabla\ell(\theta; z_i^c) - \nabla\log p_0(\theta)$.

A target is evaluated on positions of shape (S, N, D): S chains × N clients. Its ``grad`` takes
per-(chain, client) int64 keys from which it draws its minibatches (counter-based, see
[`fedhmc.core.rng`][fedhmc.core.rng]), so a target restricted to one client (``client(c)``) draws
exactly what the full target draws for that client.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

from fedhmc.core import MINIBATCH_LAWS, rng

PREFETCH_MAX_VALUES = 1 << 21
"""At most this many minibatch uniforms are drawn ahead in one
[`DataTarget.prefetch`][fedhmc.models.targets.DataTarget.prefetch]."""
PREFETCH_MAX_GATHER_BYTES = 16 << 20
"""Prefetched minibatches up to this size are also gathered ahead, all in one go."""


class DataTarget:
    """A model's negative log posterior over data split across clients.

    Parameters
    ----------
    model
        A model from [`fedhmc.models.nets`][fedhmc.models.nets].
    parts
        One (X_c, y_c) pair per client: features (n_c, *feature_shape), such as (n_c, F) or
        (n_c, C, H, W), and integer labels (n_c,).
    batch_size
        Minibatch size B per client and gradient evaluation; 0 (or ≥ n_c) means the full
        local data set. A client with n_c < B uses B_c = n_c (its full data).
    prior_std
        σ₀ of the N(0, σ₀² I) prior; ``math.inf`` for a flat prior.
    num_total
        n, the total number of training points. Defaults to Σ n_c; a single client's view
        passes the global n so that its gradient scale n / B is the global one.
    minibatch
        ``"uniform"``: every evaluation draws B of the client's points uniformly without
        replacement, independently of the others. ``"reshuffle"`` (random reshuffling):
        each client's data is permuted once per pass and cut into consecutive batches of
        B, so a pass visits every point exactly once; when B does not divide n_c the last
        batch of a pass is smaller (and scaled by n / its size). The evaluation counter is
        then the client's global minibatch number, and the keys are the run's
        [`fedhmc.algorithms.fahmc.data_keys`][fedhmc.algorithms.fahmc.data_keys].
    """

    graphs = None
    """A `fedhmc.core.graphs.RoundGraphs` that replays the clients' rounds (CUDA), or None."""

    def __init__(
        self,
        model,
        parts: list[tuple[torch.Tensor, torch.Tensor]],
        batch_size: int,
        prior_std: float,
        num_total: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        minibatch: str = "uniform",
    ):
        if not parts:
            raise ValueError("a DataTarget needs at least one client")
        if minibatch not in MINIBATCH_LAWS:
            raise ValueError(f"minibatch must be one of {MINIBATCH_LAWS}, got {minibatch!r}")
        self.minibatch = minibatch
        self.model = model
        self.dim = model.dim
        self.batch_size = int(batch_size)
        self.prior_std = float(prior_std)
        self.dtype, self.device = dtype, torch.device(device)
        counts = [int(y.shape[0]) for _, y in parts]
        self._counts_host = counts
        if min(counts) < 1:
            raise ValueError("every client needs at least one example")
        self.counts = torch.tensor(counts, dtype=torch.int64, device=self.device)
        self.num_total = int(num_total if num_total is not None else sum(counts))
        self.num_clients = len(parts)
        self.weights = self.counts.to(torch.float64) / self.num_total
        self._n_max = max(counts)
        # The features keep their shape (F,) or (C, H, W), …: the model sees what the data
        # holds. Minibatches are gathered from every client's rows one after another
        # (``_flat``), the full-batch kernel reads them padded to (N, n_max, …) (``X``, ``y``);
        # both are built on first use, so a target whose rounds only ever use subsets of its
        # clients (partial participation) holds neither.
        self.feature_shape = tuple(model.prepare(parts[0][0][:1].to(dtype)).shape[1:])
        self._feature_size = math.prod(self.feature_shape)
        self._parts = parts
        self._store: dict = {}  # shared with with_batch_size's copies
        n_rows = torch.arange(self._n_max, device=self.device)
        self._valid = n_rows < self.counts.unsqueeze(1)
        # Client c's rows start at n_1 + … + n_{c−1} in the flat (Σ n_c, F) data.
        starts = torch.cumsum(self.counts, 0) - self.counts
        self._row_offsets = starts.view(1, -1, 1)
        self._last_row = (self.counts - 1).view(1, -1, 1)
        self._set_batch(self.batch_size)

    @property
    def max_client_size(self) -> int:
        """n_max, the largest client's number of examples."""
        return self._n_max

    @property
    def X(self) -> torch.Tensor:
        """Every client's features, padded with zeros to n_max rows: (N, n_max, *features)."""
        return self._pad()[0]

    @property
    def y(self) -> torch.Tensor:
        """Every client's labels, padded with zeros to n_max: (N, n_max), int64."""
        return self._pad()[1]

    def _flat(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every client's features and labels, their rows one client after another:
        (Σ n_c, *features) and (Σ n_c,)."""
        flat = self._store.get("flat")
        if flat is None:
            X = torch.cat([self.model.prepare(Xc.to(self.dtype)) for Xc, _ in self._parts])
            y = torch.cat([yc.to(torch.int64) for _, yc in self._parts])
            flat = self._store["flat"] = (X.to(self.device), y.to(self.device))
        return flat

    def _pad(self) -> tuple[torch.Tensor, torch.Tensor]:
        padded = self._store.get("padded")
        if padded is None:
            # Data loading: padded on the CPU, where the clients' parts are, then moved once.
            shape = (self.num_clients, self._n_max, *self.feature_shape)
            X = torch.zeros(shape, dtype=self.dtype, device="cpu")
            y = torch.zeros(self.num_clients, self._n_max, dtype=torch.int64, device="cpu")
            for c, (Xc, yc) in enumerate(self._parts):
                X[c, : yc.shape[0]] = self.model.prepare(Xc.to(self.dtype))
                y[c, : yc.shape[0]] = yc.to(torch.int64)
            padded = self._store["padded"] = (X.to(self.device), y.to(self.device))
        return padded

    def _set_batch(self, batch_size: int) -> None:
        dtype, n_max = self.dtype, self._n_max
        self.batch_size = int(batch_size)
        self._plan = None
        full = self.batch_size <= 0 or self.batch_size >= n_max
        self.full_batch = full
        if full:
            scale = (self.num_total / self.counts.to(torch.float64)).to(dtype)
            self._full_sw = self._valid.to(dtype) * scale.unsqueeze(1)
        else:
            b_c = torch.clamp(self.counts, max=self.batch_size)
            self._b_max = self.batch_size
            self._ragged = bool((b_c < self.batch_size).any())
            self._batch_scale = (self.num_total / b_c.to(torch.float64)).to(dtype)
            self._batch_mask = (
                torch.arange(self.batch_size, device=self.device) < b_c.unsqueeze(1)
            ).to(dtype)
            self._batch_sw = self._batch_mask * self._batch_scale.unsqueeze(1)
        # Minibatch buffers, reused across evaluations (keyed by chains and batch size).
        self._buffers: dict = {}
        self._views: dict = {}  # round_view's, by (drawn clients, width)
        self._views_buffers: dict = {}  # their minibatch buffers, by drawn clients
        # Random reshuffling: (keys, first pass (N,), permutations (S, N, m, n_max), the
        # minibatch numbers [a, b) they cover when known on the host, else None).
        self._window = None
        if not full:
            self._b_c, self._slot = b_c, torch.arange(self.batch_size, device=self.device)
            self._per_pass = (self.counts + b_c - 1) // b_c  # P_c, minibatches per pass
            self._per_pass_host = [-(-n // min(n, self.batch_size)) for n in self._counts_host]

    def with_batch_size(self, batch_size: int) -> DataTarget:
        """The same target (sharing its data tensors) with another minibatch size."""
        if int(batch_size) == self.batch_size:
            return self
        other = copy.copy(self)
        other._set_batch(batch_size)
        return other

    def client(self, c: int) -> DataTarget:
        """The same target restricted to client ``c`` (keeps the global n)."""
        return self.subset([c])

    def subset(self, clients) -> DataTarget:
        """The same target restricted to ``clients`` (ids, in the order given; keeps the
        global n): a target of its own, holding only those clients' data (a Flower
        client's). The rounds of partial participation use
        [`round_view`][fedhmc.models.targets.DataTarget.round_view]."""
        return DataTarget(
            self.model,
            [self._parts[c] for c in _ids(clients)],
            self.batch_size,
            self.prior_std,
            num_total=self.num_total,
            dtype=self.dtype,
            device=self.device,
            minibatch=self.minibatch,
        )

    def round_view(self, clients) -> DataTarget:
        """The clients ``clients`` of a round (M distinct ids), computing on this target's
        data: what the drawn clients of a round compute under partial participation, and
        nothing for the others.

        The view's shapes are M and a width W: the largest drawn client's n_c rounded up to
        a power of two (at least B, at most n_max), the padding of its minibatch draws and
        full batches. Every round with the same (M, W) gets the same view, whose per-client
        tensors (sizes, row offsets, minibatch weights, …) are refilled from ``clients`` in
        place, on the device: its rounds run the same kernels on the same tensors, and a
        CUDA graph captures them like full participation's rounds. A client draws the same
        minibatch (the same points) in every view, whichever clients are drawn with it.
        """
        ids = _ids(clients)
        largest = max(self._counts_host[c] for c in ids)
        width = 1 << max(largest - 1, 0).bit_length()  # the power of two ≥ largest
        if not self.full_batch:
            width = max(width, self.batch_size)
        width = min(width, self._n_max)
        for other in self._views.values():  # what earlier rounds drew: free it
            other._plan = other._window = None
        return _refilled(self, ids, (len(ids), width), lambda: _DataView(self, len(ids), width))

    def prefetch(
        self, keys: torch.Tensor, start: int, count: int, horizon: int | None = None
    ) -> None:
        """Draw the minibatch indices of evaluations ``start … start+count−1`` in one go.

        The result is exactly what [`grad`][fedhmc.models.targets.DataTarget.grad] would draw one
        evaluation at a time; doing it for many evaluations at once saves most of the per-call
        overhead. With ``horizon`` > ``count``, up to ``horizon`` evaluations are drawn ahead as far
        as [`PREFETCH_MAX_VALUES`][fedhmc.models.targets.PREFETCH_MAX_VALUES] uniforms allow (the
        engine asks for the rest of the round), and a later call whose range is already drawn does
        nothing.
        """
        if self.full_batch or self.minibatch == "reshuffle":
            return
        plan = self._plan
        if (
            plan is not None
            and plan[0] is keys
            and plan[1] <= start
            and start + count <= plan[1] + plan[2].shape[0]
        ):
            return
        per_eval = keys.numel() * self._n_max
        if horizon is not None and horizon > count:
            count = max(count, min(horizon, PREFETCH_MAX_VALUES // max(per_eval, 1)))
        u = rng.uniform_block(keys, start, count, self._n_max)  # (S, N, count, n_max)
        u.masked_fill_(~self._valid.unsqueeze(1), 2.0)
        # The B_c smallest uniforms of client c: a uniformly random subset of its points.
        idx = torch.topk(u, self._b_max, dim=-1, largest=False, sorted=self._ragged).indices
        if self._ragged:  # a client with n_c < B: its unused slots (weight 0) take its last row
            idx = torch.minimum(idx, self._last_row.unsqueeze(-1))
        # Stored as rows of the flat (Σ n_c, F) data, evaluation-major, so that an
        # evaluation's rows are one contiguous (S, N, B) block.
        flat = (idx + self._row_offsets.unsqueeze(-1)).permute(2, 0, 1, 3).contiguous()
        # Where the drawn minibatches are small, gather all their rows now: one index_select
        # per round instead of two per evaluation (the same rows).
        rows = None
        if flat.numel() * self._feature_size * self.dtype.itemsize <= PREFETCH_MAX_GATHER_BYTES:
            X_all, y_all = self._flat()
            Xg = torch.index_select(X_all.view(-1, self._feature_size), 0, flat.view(-1))
            yg = torch.index_select(y_all, 0, flat.view(-1))
            rows = (Xg.view(*flat.shape, *self.feature_shape), yg.view(flat.shape))
        self._plan = (keys, start, flat, rows)

    def _flat_indices(self, keys: torch.Tensor, index: int) -> torch.Tensor:
        """Evaluation ``index``'s minibatch as rows of the flattened data, (S, N, B)."""
        plan = self._plan
        if plan is not None and plan[0] is keys and 0 <= index - plan[1] < plan[2].shape[0]:
            return plan[2][index - plan[1]]
        self.prefetch(keys, index, 1)
        return self._plan[2][0]

    def reshuffle_window(self, keys: torch.Tensor, first: int | torch.Tensor, count: int) -> None:
        """Random reshuffling: draw the permutations that minibatches ``first … first+count−1``
        of every (chain, client) come from, for the
        [`reshuffle_indices`][fedhmc.models.targets.DataTarget.reshuffle_indices] calls that
        follow (one argsort per pass instead of one per minibatch).

        ``first`` is a Python int, or a 0-d int64 tensor on the target's device: then nothing
        is read back to the host, so the draw can be captured in a CUDA graph and replayed
        with the next round's counter; it draws the permutations of every pass that a window
        of ``count`` minibatches can reach wherever it starts. Where those would hold more
        than [`PREFETCH_MAX_VALUES`][fedhmc.models.targets.PREFETCH_MAX_VALUES] values, each
        minibatch draws its own pass's permutation instead (the same numbers).
        """
        if self.full_batch:
            raise ValueError("a full-batch target has no minibatches to reshuffle")
        per_pass = self._per_pass_host
        if isinstance(first, torch.Tensor):
            m = (count - 2) // min(per_pass) + 2  # the most passes `count` minibatches reach
            window = None
        else:
            first = int(first)
            m = max((first + count - 1) // P - first // P + 1 for P in per_pass)
            window = (first, first + count)
        if count > 1 and m * keys.numel() * self._n_max > PREFETCH_MAX_VALUES:
            self._window = (keys, None, None, None)  # each minibatch draws its own pass
            return
        p0, perms = self._pass_permutations(keys, first, m)
        self._window = (keys, p0, perms, window)

    def _pass_permutations(
        self, keys: torch.Tensor, index: int | torch.Tensor, m: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The pass p0 (N,) of minibatch ``index`` of every client and the permutations of its
        passes p0 … p0 + m − 1, (S, N, m, n_max)."""
        p0 = index // self._per_pass  # (N,), whether index is an int or a 0-d tensor
        passes = p0.view(-1, 1) + torch.arange(m, device=self.device)  # (N, m)
        u = rng.uniform(rng.derive(keys.unsqueeze(-1), passes), 0, self._n_max)
        u.masked_fill_(~self._valid.unsqueeze(1), 2.0)  # (S, N, m, n_max)
        return p0, torch.argsort(u, dim=-1)

    def reshuffle_indices(
        self, keys: torch.Tensor, index: int | torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Random reshuffling: the points of minibatch number ``index`` of every (chain,
        client), (S, N, B), and their weights n / (batch size) (0 on padding), (S, N, B).

        Client c cuts each pass into P_c = ⌈n_c / B_c⌉ batches; batch ``index`` is batch
        ``index mod P_c`` of pass ``index // P_c``, whose permutation is the argsort of
        uniforms drawn under ``derive(key, pass)``. ``index`` may be a 0-d int64 tensor on
        the target's device, once ``reshuffle_window`` has drawn a window holding it (which
        is not checked: checking would read the index back to the host).
        """
        if self.full_batch:
            raise ValueError("a full-batch target has no minibatches to reshuffle")
        win = self._window
        if isinstance(index, torch.Tensor):
            if win is None or win[0] is not keys:
                raise ValueError(
                    "a minibatch number given as a tensor needs reshuffle_window first"
                )
        elif (
            win is None
            or win[0] is not keys
            or win[3] is None
            or not win[3][0] <= index < win[3][1]
        ):
            self.reshuffle_window(keys, index, 1)
            win = self._window
        p0, perms = win[1:3]
        if perms is None:  # a window too large to draw at once: this minibatch's pass alone
            p0, perms = self._pass_permutations(keys, index, 1)
        b_c, slot = self._b_c, self._slot  # (N,), (B,)
        rel = index // self._per_pass - p0  # (N,): the pass within the window
        start = (index % self._per_pass) * b_c
        size = torch.minimum(b_c, self.counts - start)  # the last batch may be smaller
        pos = (start.view(-1, 1) + slot).clamp_(max=self._n_max - 1)  # (N, B)
        S = perms.shape[0]  # perms: (S, N, m, n_max)
        perm = perms.gather(2, rel.view(1, -1, 1, 1).expand(S, -1, 1, self._n_max)).squeeze(2)
        idx = perm.gather(-1, pos.unsqueeze(0).expand(S, -1, -1))
        idx = torch.minimum(idx, self._last_row)  # unused slots (weight 0): the last row
        valid = slot < size.view(-1, 1)
        scale = (self.num_total / size.to(torch.float64)).to(self.dtype)
        sw = (valid.to(self.dtype) * scale.view(-1, 1)).unsqueeze(0).expand_as(idx)
        return idx, sw

    def _batch(self, keys: torch.Tensor, index: int, S: int):
        N = self.num_clients
        if self.full_batch:
            X = self.X.unsqueeze(0).expand(S, *self.X.shape)
            y = self.y.unsqueeze(0).expand(S, *self.y.shape)
            sw = self._full_sw.unsqueeze(0).expand(S, *self._full_sw.shape)
            return X, y, sw
        if self.minibatch == "reshuffle":
            idx, sw = self.reshuffle_indices(keys, index)
            flat = (idx + self._row_offsets).reshape(-1)
        else:
            flat = self._flat_indices(keys, index)  # prefetched, (S, N, B)
            sw = self._batch_sw.unsqueeze(0).expand(S, N, -1)
            rows = self._plan[3]
            if rows is not None:  # gathered ahead by prefetch
                j = index - self._plan[1]
                return rows[0][j], rows[1][j], sw
            flat = flat.view(-1)
        # One flat index_select into reused buffers: the same rows as X[c, idx[s, c]], with
        # fewer and cheaper kernels than advanced indexing.
        B = sw.shape[-1]
        bufs = self._buffers.get((S, B))
        if bufs is None:
            bufs = (
                torch.empty(S * N * B, self._feature_size, dtype=self.dtype, device=self.device),
                torch.empty(S * N * B, dtype=torch.int64, device=self.device),
            )
            self._buffers[(S, B)] = bufs
        X_all, y_all = self._flat()
        X = torch.index_select(X_all.view(-1, self._feature_size), 0, flat, out=bufs[0])
        y = torch.index_select(y_all, 0, flat, out=bufs[1])
        return X.view(S, N, B, *self.feature_shape), y.view(S, N, B), sw

    def grad(
        self, theta: torch.Tensor, keys: torch.Tensor, index: int, need_energy: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Stochastic gradient and energy estimate of every (chain, client).

        Parameters
        ----------
        theta
            Positions, (S, N, D).
        keys
            Minibatch keys, int64 (S, N).
        index
            Gradient-evaluation counter: selects the minibatch drawn under each key.
        need_energy
            Also return the energy estimate (costs a little more).

        Returns
        -------
        (grad, energy)
            (S, N, D) and (S, N) (or None): the minibatch estimates of ∇f^(c) and f^(c).
        """
        S, N, D = theta.shape
        if self.full_batch and hasattr(self.model, "shared_loss_grad"):
            g, nll = self.model.shared_loss_grad(theta, self.X, self.y, self._full_sw, need_energy)
            return self._add_prior(theta, g, nll, need_energy)
        X, y, sw = self._batch(keys, index, S)
        rows = S * N
        g, nll = self.model.loss_grad(
            theta.reshape(rows, D),
            X.reshape(rows, *X.shape[2:]),
            y.reshape(rows, -1),
            sw.reshape(rows, -1),
            need_energy,
        )
        g = g.view(S, N, D)
        energy = nll.view(S, N) if need_energy else None
        return self._add_prior(theta, g, energy, need_energy)

    def _add_prior(self, theta, g, energy, need_energy):
        if math.isfinite(self.prior_std):
            prec = 1.0 / (self.prior_std**2)
            g = g.add_(theta, alpha=prec)
            if need_energy:
                energy = energy + 0.5 * prec * theta.square().sum(-1)
        return g, energy


@dataclass(frozen=True)
class GaussianPosterior:
    """Isotropic Gaussian N(mean·1_d, var·I)."""

    mean: float
    var: float
    dim: int


class GaussianTarget:
    """Clients with quadratic energies f^(c)(θ) = ‖θ − μ_c 1_d‖² / (2 s_c²).

    Stochastic gradients come only from the engine's injected noise σ_g; this target's
    gradients are exact. The global energy f = Σ_c w_c f^(c) gives the exact posterior
    N(m 1_d, v I) with 1/v = Σ_c w_c / s_c² and m = v Σ_c w_c μ_c / s_c².
    """

    graphs = None
    """A `fedhmc.core.graphs.RoundGraphs` that replays the clients' rounds (CUDA), or None."""

    def __init__(
        self,
        means: torch.Tensor | list[float],
        variances: torch.Tensor | list[float],
        dim: int,
        weights: torch.Tensor | list[float] | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ):
        self.device = torch.device(device)
        self.dtype = dtype
        self.means = torch.as_tensor(means, dtype=torch.float64, device=self.device)
        self.variances = torch.as_tensor(variances, dtype=torch.float64, device=self.device)
        self.num_clients = int(self.means.shape[0])
        if weights is None:
            weights = torch.full((self.num_clients,), 1.0 / self.num_clients, device=self.device)
        w = torch.as_tensor(weights, dtype=torch.float64, device=self.device)
        self.weights = w / w.sum()
        self.dim = int(dim)
        self._mu = self.means.to(dtype).view(1, -1, 1)
        self._prec = (1.0 / self.variances).to(dtype).view(1, -1, 1)
        self._views: dict = {}  # round_view's, by drawn clients

    def client(self, c: int) -> GaussianTarget:
        return self.subset([c])

    def subset(self, clients) -> GaussianTarget:
        """The clients ``clients`` (ids, in the order given), with their global weights."""
        idx = torch.as_tensor(_ids(clients), dtype=torch.int64, device=self.device)
        t = GaussianTarget(
            self.means[idx], self.variances[idx], self.dim, dtype=self.dtype, device=self.device
        )
        t.weights = self.weights[idx]
        return t

    def round_view(self, clients) -> GaussianTarget:
        """The clients ``clients`` of a round (M distinct ids), with their global weights:
        one view per M, refilled in place (see `DataTarget.round_view`)."""
        ids = _ids(clients)
        return _refilled(self, ids, len(ids), lambda: _GaussianView(self, len(ids)))

    def prefetch(
        self, keys: torch.Tensor, start: int, count: int, horizon: int | None = None
    ) -> None:
        """Nothing to draw: the gradients are exact."""

    def with_batch_size(self, batch_size: int) -> GaussianTarget:
        """The gradients are exact at any batch size: the same target."""
        return self

    def grad(self, theta: torch.Tensor, keys: torch.Tensor, index: int, need_energy=True):
        diff = theta - self._mu
        energy = 0.5 * (diff.square() * self._prec).sum(-1) if need_energy else None
        return diff.mul_(self._prec), energy

    def posterior(self, temperature: float = 1.0) -> GaussianPosterior:
        """The exact posterior of exp(−f / temperature)."""
        prec = float((self.weights / self.variances).sum())
        mean = float((self.weights * self.means / self.variances).sum()) / prec
        return GaussianPosterior(mean, temperature / prec, self.dim)


def hetero_gaussian(
    num_clients: int, dim: int, dtype: torch.dtype = torch.float32, device="cpu"
) -> GaussianTarget:
    """The heterogeneous Gaussian of the paper's §5.2, as the core issue defines it.

    The first ⌈N/2⌉ clients have (μ_c, s_c²) = (20, 1), the others (1, 2); equal weights.
    With N even the exact posterior is N(m 1_d, v I) with v = 4/3 and m = 41/3 ≈ 13.67.
    (The paper quotes N(16.2 1_d, 1.6 I), which is what s² = 4 for the second half gives.)
    """
    first = (num_clients + 1) // 2
    means = [20.0] * first + [1.0] * (num_clients - first)
    variances = [1.0] * first + [2.0] * (num_clients - first)
    return GaussianTarget(means, variances, dim, dtype=dtype, device=device)


def _refilled(target, ids: list[int], key, make):
    """``target``'s round view ``key`` (built by ``make()`` the first time), refilled with
    the clients ``ids``."""
    view = target._views.get(key)
    if view is None:
        view = target._views[key] = make()
    view.gather(torch.as_tensor(ids, dtype=torch.int64, device=target.device))
    return view


class _Gathered:
    """A round's drawn clients of a parent target: the parent's per-client tensors
    ``_PER_CLIENT`` (name → the clients' axis) gathered into tensors of M clients that
    `gather` refills in place, everything else shared with the parent (its data, model,
    shapes; ``graphs`` read from it)."""

    _PER_CLIENT: dict[str, int] = {}
    _WIDE: tuple[str, ...] = ()
    """Per-client tensors whose last axis (the rows, n_max) the view cuts to its width."""
    _width: int | None = None

    def _setup(self, parent, size: int) -> None:
        skip = ("graphs", "_views", "_views_buffers")
        state = {k: v for k, v in parent.__dict__.items() if k not in skip}
        self.__dict__.update(state)
        self._parent = parent
        self.num_clients = size
        self._per_client = []
        for name, axis in self._PER_CLIENT.items():
            source = self._source(name)
            if isinstance(source, torch.Tensor):
                shape = list(source.shape)
                shape[axis] = size
                setattr(self, name, source.new_empty(shape))
                self._per_client.append((name, axis))

    def _source(self, name: str):
        source = getattr(self._parent, name, None)
        if name in self._WIDE and isinstance(source, torch.Tensor):
            return source[..., : self._width]
        return source

    @property
    def graphs(self):
        return self._parent.graphs

    def gather(self, ids: torch.Tensor) -> None:
        """Refill the per-client tensors with the clients ``ids`` (M,) of the parent."""
        for name, axis in self._per_client:
            torch.index_select(self._source(name), axis, ids, out=getattr(self, name))

    def subset(self, clients):
        raise ValueError("a round's view has no subsets: take them of the target it views")

    def client(self, c: int):
        return self.subset([c])

    def round_view(self, clients):
        raise ValueError("a round's view has no views: take them of the target it views")


class _DataView(_Gathered, DataTarget):
    """`DataTarget.round_view`'s view of M clients."""

    _PER_CLIENT = {
        "counts": 0,
        "weights": 0,
        "_valid": 0,
        "_row_offsets": 1,
        "_last_row": 1,
        "_full_sw": 0,
        "_b_c": 0,
        "_per_pass": 0,
        "_batch_scale": 0,
        "_batch_mask": 0,
        "_batch_sw": 0,
    }
    _WIDE = ("_valid", "_full_sw")

    def __init__(self, parent: DataTarget, size: int, width: int):
        self._width = width  # read by _setup's cuts
        self._setup(parent, size)
        self._n_max = width
        # Its own prefetch plan and reshuffle window; its minibatch buffers (shapes of M)
        # are those of every view of M clients: a round uses one view.
        self._plan, self._window = None, None
        self._buffers = parent._views_buffers.setdefault(size, {})
        self._padded = None

    def gather(self, ids: torch.Tensor) -> None:
        super().gather(ids)
        if self._padded is not None:
            self._fill_padded()

    def _pad(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The drawn clients' rows padded to the view's width (zeros beyond n_c), as
        `DataTarget.X` and ``y`` hold them: gathered from the parent's flat data into
        buffers that `gather` refills."""
        if self._padded is None:
            M, n_max = self.num_clients, self._n_max
            X = torch.empty(M, n_max, *self.feature_shape, dtype=self.dtype, device=self.device)
            y = torch.empty(M, n_max, dtype=torch.int64, device=self.device)
            self._padded = (X, y)
            self._fill_padded()
        return self._padded

    def _fill_padded(self) -> None:
        X, y = self._padded
        X_all, y_all = self._flat()
        first = self._row_offsets.view(-1, 1)
        rows = first + torch.arange(self._n_max, device=self.device)
        rows = torch.minimum(rows, first + self._last_row.view(-1, 1)).view(-1)
        flat_X = X.view(-1, self._feature_size)
        torch.index_select(X_all.view(-1, self._feature_size), 0, rows, out=flat_X)
        torch.index_select(y_all, 0, rows, out=y.view(-1))
        invalid = ~self._valid
        X.masked_fill_(invalid.view(*invalid.shape, *([1] * len(self.feature_shape))), 0)
        y.masked_fill_(invalid, 0)

    def with_batch_size(self, batch_size: int) -> DataTarget:
        if int(batch_size) == self.batch_size:
            return self
        raise ValueError(
            "a round's view keeps its target's batch size: take with_batch_size of that target"
        )


class _GaussianView(_Gathered, GaussianTarget):
    """`GaussianTarget.round_view`'s view of M clients."""

    _PER_CLIENT = {"means": 0, "variances": 0, "weights": 0, "_mu": 1, "_prec": 1}

    def __init__(self, parent: GaussianTarget, size: int):
        self._setup(parent, size)


def _ids(clients) -> list[int]:
    """Client ids as Python ints (a tensor's in one transfer, not one per client)."""
    if isinstance(clients, torch.Tensor):
        return [int(c) for c in clients.tolist()]
    return [int(c) for c in clients]
