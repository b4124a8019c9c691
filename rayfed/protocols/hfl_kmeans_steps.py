"""Public parameters and step functions of ``hfl-kmeans`` (the driver and config are in
:mod:`rayfed.protocols.hfl_kmeans`): what each client and the server run, as plain functions of
(ctx, inputs) -> message, testable without Ray.

Values travel on the fixed-point grid 2^-f (f = 16): a client's NMA upload is its per-cluster sums
of grid-rounded points and its counts x 2^f (exact integers); an AMN upload is its local centroids
/ M rounded to the grid. Uploads are words of Z_(2^b) (b = 32 or 64) under one-time pads; the
server adds discrete-Laplace noise on the grid to the padded sum, so it never sees a plaintext.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from dp_accounting import dp_event

from rayfed import rng
from rayfed.actors.base import Message, StepContext
from rayfed.clustering import dplloyd
from rayfed.clustering.constrained import (
    assign,
    cluster_sums,
    data_random,
    domain_random,
    kmeans_plus_plus,
    post_process,
    sphere_packing,
)
from rayfed.data.scaling import features_of, to_unit
from rayfed.errors import ConfigError
from rayfed.privacy import discrete_laplace, discrete_laplace_event
from rayfed.secagg import pads

DATA_INITS = ("data-random", "kmeans++")
COUNT_FLOOR = 0.5  # a noisy count below this divides as 0.5 (diffprivlib's clamp, A10)
NOISE_TAIL = 50.0  # overflow check: |Laplace| > 50 scales has probability e^-50


# --- public parameters --------------------------------------------------------------------------
@dataclass(frozen=True)
class Noise:
    """One block of the aggregate and its discrete-Laplace noise: ``length`` entries, each drawn
    with parameter ε/Δ₁ (grid units); the block's charge is (``l1_sensitivity``, ``epsilon``)."""

    label: str
    length: int
    l1_sensitivity: int
    epsilon: float

    @property
    def event(self):
        return discrete_laplace_event(self.l1_sensitivity, self.epsilon)

    @property
    def scale(self) -> float:
        """Laplace scale of one entry in grid units (1/parameter)."""
        return self.l1_sensitivity / self.epsilon


@dataclass(frozen=True)
class Params:
    """Everything public the server derives from N and the options (§1.6 S1-S2)."""

    n: int
    d: int
    k: int
    clients: int
    bounds: dplloyd.SizeBounds
    contribution: int  # E as the sensitivity sees it (k for non-exclusive)
    length: int  # words per upload: k(d+1) for NMA, k·d for AMN
    frac_bits: int
    ring_bits: int
    t_max: int
    epsilon_m: float | None = None
    split: dict[str, float] = field(default_factory=dict)  # eps_sum/eps_count or eps_mu
    noise: tuple[Noise, ...] = ()  # per iteration (per client on the ring); () if non-private
    sensitivity: dict[str, float] = field(default_factory=dict)  # AMN: thesis and true Δ^μ
    claimed_epsilon: float | None = None  # the thesis's ε where the mode's true ε differs

    @property
    def scale(self) -> int:
        return 1 << self.frac_bits

    @property
    def epsilon_per_iteration(self) -> float:
        return sum(block.epsilon for block in self.noise)


def derive_params(cfg: Any, n: int, d: int) -> Params:
    """The thesis's public arithmetic for N points in d dimensions under ``cfg``."""
    k, m = cfg.k, cfg.clients
    bounds = dplloyd.size_bounds(
        n,
        k,
        m,
        None if cfg.min_size == "auto" else cfg.min_size,
        None if cfg.max_size == "auto" else cfg.max_size,
    )
    e = {"unconstrained": 1, "non-exclusive": k}.get(cfg.assignment, cfg.contribution)
    nma = cfg.aggregation == "nma"
    common = dict(
        n=n,
        d=d,
        k=k,
        clients=m,
        bounds=bounds,
        contribution=e,
        length=k * (d + 1) if nma else k * d,
        frac_bits=cfg.frac_bits,
        ring_bits=cfg.ring_bits,
    )
    fixed = None if cfg.iterations == "auto" else cfg.iterations
    if cfg.noise == "none":
        return Params(**common, t_max=fixed or dplloyd.NON_PRIVATE_ITERATIONS)
    constrained = cfg.assignment != "unconstrained"
    if nma:
        eps_m = dplloyd.nma_epsilon_m(n, k, d, e, cfg.rho)
    else:
        eps_m = dplloyd.amn_epsilon_m(bounds.c_min if constrained else 0, k, d, e)
    t_max = fixed or dplloyd.iterations(cfg.epsilon, eps_m)
    scale = 1 << cfg.frac_bits
    if nma:
        eps_sum, eps_count = dplloyd.nma_split(cfg.epsilon, t_max, d, cfg.rho)
        # one point moves a sum coordinate by its own grid value, at most B·2^f — or, where a
        # non-exclusive cluster keeps its size, swaps out another point: 2B·2^f
        swap = 2 if cfg.assignment == "non-exclusive" else 1
        grid_bound = swap * round(dplloyd.BOUND * scale)
        noise = (
            Noise("sums", k * d, e * d * grid_bound, d * eps_sum),
            Noise("counts", k, e * scale, eps_count),
        )
        split = {"eps_sum": eps_sum, "eps_count": eps_count}
        return Params(**common, t_max=t_max, epsilon_m=eps_m, split=split, noise=noise)
    eps_mu = dplloyd.amn_epsilon(cfg.epsilon, t_max, d)
    true = dplloyd.centroid_sensitivity(m, bounds.client_min, cfg.assignment)
    thesis = dplloyd.centroid_sensitivity_thesis(bounds.c_min, e, constrained)
    # one coordinate of one rounded local centroid moves by at most floor(true·2^f) + 1 grid units
    l1 = e * d * (math.floor(true * scale) + 1)
    claimed = None
    epsilon = d * eps_mu
    if cfg.sensitivity == "thesis":
        # the thesis's noise scale Δ^μ/ε^μ; the charge is what that scale buys against the truth
        epsilon, claimed = eps_mu * l1 / (thesis * scale), cfg.epsilon
    return Params(
        **common,
        t_max=t_max,
        epsilon_m=eps_m,
        split={"eps_mu": eps_mu},
        noise=(Noise("centroids", k * d, l1, epsilon),),
        sensitivity={"thesis": thesis, "true": true * e},
        claimed_epsilon=claimed,
    )


def overflow_check(params: Params, assignment: str, aggregation: str, topology: str) -> None:
    """A possible wrap-around of Z_(2^b) is a ConfigError naming the limit (§2.3): every decoded
    value must stay below 2^(b-1)/2^f in magnitude, noise included (50 Laplace scales)."""
    limit = 2.0 ** (params.ring_bits - 1) / params.scale
    b = params.bounds
    cap = {
        "unconstrained": params.n,
        "non-exclusive": params.clients * b.client_min,
        "constrained": min(params.n, params.clients * b.client_max),
    }[assignment]
    draws = params.clients if topology == "ring" else 1
    tails = [NOISE_TAIL * draws * block.scale / params.scale for block in params.noise] or [0.0]
    if aggregation == "nma":  # sums reach B·cap, counts cap, each with its own noise
        reach, which = max((dplloyd.BOUND * cap + tails[0], "sum"), (cap + tails[-1], "count"))
        what = f"a cluster {which} can reach ±{reach:,.0f} ({cap:,} points"
    else:
        reach = dplloyd.BOUND + tails[0]
        what = f"a centroid coordinate can reach ±{reach:,.4g} (B"
    what += " + 50 noise scales)" if params.noise else ")"
    if reach >= limit:
        raise ConfigError(
            "ring_bits",
            f"Z_2^{params.ring_bits} at precision 2^-{params.frac_bits} holds values below "
            f"±{limit:,.0f}; {what}: the aggregate could overflow",
            "ring_bits=64, or a constrained assignment with a smaller max_size",
        )


# --- data ---------------------------------------------------------------------------------------
def synthetic_table(users: int, dims: int, k: int, spread: float, seed: int) -> pa.Table:
    """k Gaussian blobs in [-1, 1]^d: centers uniform in [-0.8, 0.8]^d, N(0, spread²) per
    coordinate, clipped; ``label`` is the generating component."""
    gen = rng.stream(seed, "synthetic", 0, "hfl-kmeans")
    centers = gen.uniform(-0.8, 0.8, (k, dims))
    labels = gen.integers(0, k, users)
    x = np.clip(centers[labels] + gen.normal(0.0, spread, (users, dims)), -1.0, 1.0)
    cols: dict[str, Any] = {f"x{j}": x[:, j] for j in range(dims)}
    cols["label"] = labels
    return pa.table(cols)


def unit_features(ctx: StepContext) -> np.ndarray:
    meta = ctx.meta
    x = features_of(ctx.table, meta["columns"])
    return np.clip(to_unit(x, np.asarray(meta["lo"]), np.asarray(meta["hi"])), -1.0, 1.0)


# --- clients ------------------------------------------------------------------------------------
def size_step(ctx: StepContext, *, to: str) -> Message:
    """Client: its row count N_l, in the clear (N is treated as public, A3)."""
    return Message("size", int(ctx.table.num_rows), to=to)


def data_init_step(ctx: StepContext, *, init: str, k: int) -> Message:
    """First client, non-private runs only: initial centroids drawn from its own rows."""
    x = unit_features(ctx)
    gen = ctx.rng("init")
    centers = data_random(x, k, gen) if init == "data-random" else kmeans_plus_plus(x, k, gen)
    return Message("initial_centroids", centers, to="parties")


def prepare_step(
    ctx: StepContext, params: Params, given: Any = None, *, settings: dict, order: list[str]
) -> None:
    """Client: keep the public parameters; derive the initial centroids from the group key
    (every client gets the same, the server none), or take the data-driven ones ``given``."""
    st = ctx.state
    st.update(params=params, settings=settings, order=order, me=order.index(ctx.name))
    st["x"] = unit_features(ctx)
    st["xq"] = np.rint(st["x"] * params.scale).astype(np.int64)
    if given is not None:
        st["centers"] = np.asarray(next(iter(given.values())), dtype=np.float64)
        return
    key = pads.subkey(st["group_key"], pads.INFO_INIT)
    gen = np.random.Generator(np.random.PCG64(int.from_bytes(key, "little")))
    init = sphere_packing if settings["init"] == "sphere-packing" else domain_random
    st["centers"] = init(params.k, params.d, gen)


def _values(ctx: StepContext) -> np.ndarray:
    """This iteration's upload as signed grid integers (before masking)."""
    st, p = ctx.state, ctx.state["params"]
    s = st["settings"]
    members = assign(
        st["x"],
        st["centers"],
        s["assignment"],
        min_size=p.bounds.client_min,
        max_size=p.bounds.client_max,
        contribution=p.contribution,
    )
    if s["aggregation"] == "nma":
        sums, counts = cluster_sums(st["xq"], members, p.k)
        return np.concatenate([sums.ravel(), counts.astype(np.int64) * p.scale])
    sums, counts = cluster_sums(st["x"], members, p.k)
    # an empty local cluster uploads the previous centroid ([C], A9), kept in the box so that the
    # sensitivity's 2B bound holds even with centroid_post=none
    previous = np.clip(st["centers"], -dplloyd.BOUND, dplloyd.BOUND)
    local = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None], previous)
    return np.rint(local.ravel() / p.clients * p.scale).astype(np.int64)


def _pad(ctx: StepContext, t: int) -> np.ndarray:
    """This client's pad for iteration t: its shared-seed pad, plus pairwise masks if chosen."""
    st, p = ctx.state, ctx.state["params"]
    masking = st["settings"]["masking"]
    if masking == "none":
        return np.zeros(p.length, pads.ring_dtype(p.ring_bits))
    pad_key = pads.subkey(st["group_key"], pads.INFO_PADS)
    words = pads.party_pad(pad_key, t, st["me"], p.length, p.ring_bits)
    if masking == "pairwise":
        words = words + pads.pairwise_mask(st["pair_keys"], st["me"], t, p.length, p.ring_bits)
    return words


def _unpad(ctx: StepContext, words: np.ndarray, t: int) -> np.ndarray:
    """Signed grid values of the aggregate: remove r = Σ_l r_l (the pairwise masks cancelled)."""
    st, p = ctx.state, ctx.state["params"]
    words = np.asarray(words, dtype=pads.ring_dtype(p.ring_bits))
    if st["settings"]["masking"] != "none" and st["settings"]["topology"] == "server":
        pad_key = pads.subkey(st["group_key"], pads.INFO_PADS)
        all_pads = pads.shared_pads(pad_key, t, p.clients, p.length, p.ring_bits)
        words = words - all_pads.sum(axis=0, dtype=words.dtype)
    return pads.from_ring(words, p.ring_bits)


def _update(ctx: StepContext, values: np.ndarray) -> None:
    """New centroids from the decoded (noisy) aggregate, post-processed as configured (§3.4)."""
    st, p = ctx.state, ctx.state["params"]
    s, b = st["settings"], p.bounds
    k, d = p.k, p.d
    real = values.astype(np.float64) / p.scale
    if s["aggregation"] == "nma":
        constrained = s["assignment"] != "unconstrained"
        c_lo, c_hi = (b.c_min, b.c_max) if constrained else (0, p.n)
        sums = post_process(real[: k * d].reshape(k, d), s["sum_post"], -c_hi, c_hi)
        counts = post_process(real[k * d :], s["count_post"], c_lo, c_hi)
        centers = sums / np.maximum(counts, COUNT_FLOOR)[:, None]
    else:
        centers = real.reshape(k, d)
    st["centers"] = post_process(centers, s["centroid_post"], -dplloyd.BOUND, dplloyd.BOUND)


def iterate_step(ctx: StepContext, aggregate: Any = None, *, t: int) -> Message | None:
    """Client, one round trip: decode the previous aggregate (none before iteration 1) and
    update; then, for t <= t_max, assign, encode and upload (server) or hold the values for the
    ring; after the last iteration, keep the final centroids as this client's output."""
    st, p = ctx.state, ctx.state["params"]
    if aggregate is not None:
        _update(ctx, _unpad(ctx, aggregate, t - 1))
    if t > p.t_max:
        return Message("centroids", st["centers"], to=ctx.name)
    values = _values(ctx)
    if st["settings"]["topology"] == "ring":
        st["values"] = values
        return None
    words = pads.to_ring(values, p.ring_bits) + _pad(ctx, t)
    return Message("masked_upload", words)


def ring_step(ctx: StepContext, running: Any = None, *, t: int) -> Message:
    """Client on the serverless ring (§1.8 F1): add its values and its own full Laplace noise to
    the running sum and pass it on; the first client opens the ring with a random mask."""
    st, p = ctx.state, ctx.state["params"]
    noisy, event = _local_noise(ctx, st["values"], t)
    words = pads.to_ring(noisy, p.ring_bits)
    if running is None:
        st["ring_mask"] = _ring_mask(ctx, t)
        total = st["ring_mask"] + words
    else:
        total = np.asarray(next(iter(running.values())), dtype=words.dtype) + words
    order = st["order"]
    after = order[(st["me"] + 1) % len(order)]
    return Message("ring_partial", total, to=after, dp_event=event, scope=ctx.name)


def _ring_mask(ctx: StepContext, t: int) -> np.ndarray:
    """The first client's one-time pad of the running sum (zero with masking=none), from its
    noise source (the OS in a secure run)."""
    p = ctx.state["params"]
    dtype = pads.ring_dtype(p.ring_bits)
    if ctx.state["settings"]["masking"] == "none":
        return np.zeros(p.length, dtype)
    size = p.length * dtype.itemsize
    raw = ctx.noise.secret_bytes("secagg-masks", size, t)
    return np.frombuffer(raw, dtype=dtype).copy()


def ring_close_step(ctx: StepContext, running: dict) -> Message:
    """First client: remove its mask and broadcast Σ_l (values_l + noise_l)."""
    total = np.asarray(next(iter(running.values())))
    return Message("ring_release", total - ctx.state.pop("ring_mask"), to="parties")


def _local_noise(ctx: StepContext, values: np.ndarray, t: int):
    blocks = ctx.state["params"].noise
    if not blocks:
        return values, None
    return _add_noise(ctx, values, blocks, t)


# --- server -------------------------------------------------------------------------------------
def setup_step(ctx: StepContext, sizes: dict[str, int], *, cfg: Any, d: int) -> Message:
    """Server (or the ring's first client): N = Σ N_l, then t_max and the rest of the public
    parameters; broadcast to the clients."""
    return Message("parameters", derive_params(cfg, int(sum(sizes.values())), d), to="parties")


def aggregate_step(ctx: StepContext, uploads: dict[str, np.ndarray], *, params: Params, t: int):
    """Server: add the padded uploads in Z_(2^b) and discrete-Laplace noise on the grid; the
    result is still padded, so the server learns nothing and the clients only the noisy sum."""
    dtype = pads.ring_dtype(params.ring_bits)
    total = np.zeros(params.length, dtype=dtype)
    for words in uploads.values():
        total = total + np.asarray(words, dtype=dtype)
    if not params.noise:
        return Message("masked_aggregate", total, to="parties")
    noise, event = _add_noise(ctx, np.zeros(params.length, np.int64), params.noise, t)
    total = total + pads.to_ring(noise, params.ring_bits)
    return Message("masked_aggregate", total, to="parties", dp_event=event, scope="clients")


def _add_noise(ctx: StepContext, values: np.ndarray, blocks: tuple[Noise, ...], t: int):
    """Discrete Laplace per block from the actor's noise source; the event is the block's, or
    their composition."""
    out, events, start = values.copy(), [], 0
    for block in blocks:
        part = slice(start, start + block.length)
        out[part], event = discrete_laplace(
            ctx.noise,
            values[part],
            l1_sensitivity=block.l1_sensitivity,
            epsilon=block.epsilon,
            round=t,
        )
        events.append(event)
        start += block.length
    return out, noise_event(events)


def noise_event(events: list):
    return events[0] if len(events) == 1 else dp_event.ComposedDpEvent(events)
