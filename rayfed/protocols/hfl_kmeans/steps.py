"""The step functions of ``hfl-kmeans``, by role: plain functions of (ctx, inputs) -> reply,
testable without Ray. The grid and masking they use are described in
:mod:`rayfed.protocols.hfl_kmeans.params`."""

from __future__ import annotations

from typing import Any

import numpy as np

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
from rayfed.errors import DataError
from rayfed.protocols.hfl_kmeans.params import Noise, Settings, Setup, noise_event
from rayfed.secagg import RingWords, mpc, pads

#: HKDF label of the initial centroids' seed (hfl-kmeans's own; its value fixes the golden runs)
INFO_INIT = b"rayfed-hfl/v1/initial-centroids"
COUNT_FLOOR = 0.5  # a noisy count below this divides as 0.5 (diffprivlib's clamp, A10)


# --- clients ---------------------------------------------------------------------------------------
def unit_features(ctx: StepContext) -> np.ndarray:
    """The client's rows mapped from their declared bounds to [-1, 1]^d. The plan put them inside
    the bounds (clipped and counted, or refused), so nothing is clipped here; a value outside
    is a DataError, never changed."""
    meta = ctx.meta
    x = to_unit(
        features_of(ctx.table, meta["columns"]), np.asarray(meta["lo"]), np.asarray(meta["hi"])
    )
    outside = np.abs(x) > dplloyd.BOUND
    if outside.any():
        col = meta["columns"][int(np.flatnonzero(outside.any(axis=0))[0])]
        raise DataError(
            f"bounds.{col}",
            f"{int(outside.sum())} value(s) of {ctx.name}'s rows lie outside their declared bounds",
            "plan the data through hfl-kmeans (out_of_bounds decides)",
        )
    return x


def data_init_step(ctx: StepContext, *, init: str, k: int) -> Message:
    """First client, non-private runs only: initial centroids drawn from its own rows."""
    x = unit_features(ctx)
    gen = ctx.rng("init")
    centers = data_random(x, k, gen) if init == "data-random" else kmeans_plus_plus(x, k, gen)
    return Message("initial_centroids", centers, to="parties")


def prepare_step(
    ctx: StepContext,
    setup: Setup,
    given: np.ndarray | None = None,
    *,
    settings: Settings,
    order: list[str],
) -> None:
    """Client: keep the public setup; derive the initial centroids from the group key (every
    client gets the same, the server none), or take the data-driven ones ``given``."""
    st = ctx.state
    st.update(setup=setup, settings=settings, order=order, me=order.index(ctx.name))
    st["x"] = unit_features(ctx)
    st["xq"] = np.rint(st["x"] * setup.scale).astype(np.int64)
    if given is not None:
        st["centers"] = np.asarray(given, dtype=np.float64)
        return
    key = pads.subkey(st["group_key"], INFO_INIT)
    gen = np.random.Generator(np.random.PCG64(int.from_bytes(key, "little")))
    init = sphere_packing if settings.init == "sphere-packing" else domain_random
    st["centers"] = init(setup.k, setup.d, gen)


def _values(ctx: StepContext) -> np.ndarray:
    """This iteration's upload as signed grid integers (before masking)."""
    st, p = ctx.state, ctx.state["setup"]
    s = st["settings"]
    members = assign(
        st["x"],
        st["centers"],
        s.assignment,
        min_size=p.bounds.client_min,
        max_size=p.bounds.client_max,
        contribution=p.contribution,
    )
    if s.aggregation == "nma":
        sums, counts = cluster_sums(st["xq"], members, p.k)
        return np.concatenate([sums.ravel(), counts.astype(np.int64) * p.scale])
    sums, counts = cluster_sums(st["x"], members, p.k)
    # an empty local cluster uploads the previous centroid ([C], A9), kept in the box so that the
    # sensitivity's 2B bound holds even with centroid_post=none
    previous = np.clip(st["centers"], -dplloyd.BOUND, dplloyd.BOUND)
    local = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None], previous)
    return np.rint(local.ravel() / p.clients * p.scale).astype(np.int64)


def _pad(ctx: StepContext, t: int) -> np.ndarray:
    """This client's shared-seed pad for iteration t (zero with masking=none)."""
    st, p = ctx.state, ctx.state["setup"]
    if st["settings"].masking == "none":
        return np.zeros(p.length, pads.ring_dtype(p.ring_bits))
    pad_key = pads.subkey(st["group_key"], pads.INFO_PADS)
    return pads.party_pad(pad_key, t, st["me"], p.length, p.ring_bits)


def _unpad(ctx: StepContext, words: np.ndarray, t: int) -> np.ndarray:
    """Signed grid values of the aggregate: remove r = Σ_l r_l (the pairwise masks cancelled)."""
    st, p = ctx.state, ctx.state["setup"]
    words = np.asarray(words, dtype=pads.ring_dtype(p.ring_bits))
    if st["settings"].masking != "none" and st["settings"].topology == "server":
        pad_key = pads.subkey(st["group_key"], pads.INFO_PADS)
        all_pads = pads.shared_pads(pad_key, t, p.clients, p.length, p.ring_bits)
        words = words - all_pads.sum(axis=0, dtype=words.dtype)
    return pads.from_ring(words, p.ring_bits)


def _update(ctx: StepContext, values: np.ndarray) -> None:
    """New centroids from the decoded (noisy) aggregate, post-processed as configured (§3.4)."""
    st, p = ctx.state, ctx.state["setup"]
    s, b = st["settings"], p.bounds
    k, d = p.k, p.d
    real = values.astype(np.float64) / p.scale
    if s.aggregation == "nma":
        constrained = s.assignment != "unconstrained"
        c_lo, c_hi = (b.c_min, b.c_max) if constrained else (0, p.n)
        sums = post_process(real[: k * d].reshape(k, d), s.sum_post, -c_hi, c_hi)
        counts = post_process(real[k * d :], s.count_post, c_lo, c_hi)
        centers = sums / np.maximum(counts, COUNT_FLOOR)[:, None]
    else:
        centers = real.reshape(k, d)
    st["centers"] = post_process(centers, s.centroid_post, -dplloyd.BOUND, dplloyd.BOUND)


def iterate_step(ctx: StepContext, aggregate: Any = None, *, t: int) -> Message | None:
    """Client, one round trip: decode the previous aggregate (none before iteration 1) and
    update; then, for t <= t_max, assign, encode and upload (server) or hold the values for the
    ring; after the last iteration, keep the final centroids as this client's output."""
    st, p = ctx.state, ctx.state["setup"]
    if aggregate is not None:
        _update(ctx, _unpad(ctx, aggregate, t - 1))
    if t > p.t_max:
        return Message("centroids", st["centers"], to=ctx.name)
    values = _values(ctx)
    if st["settings"].topology == "ring" or st["settings"].masking == "pairwise":
        st["values"] = values  # for the ring, or for the secure sum (secure_input)
        return None
    words = pads.to_ring(values, p.ring_bits) + _pad(ctx, t)
    return Message("masked_upload", words)


def ring_step(ctx: StepContext, running: np.ndarray | None = None, *, t: int) -> Message:
    """Client on the serverless ring: add its values and its noise to the running sum and pass
    it on; the first client opens the ring with a random mask. The noise is its own full
    Laplace noise (§1.8 F1), or its share of one central noise (F3, ``ring_noise=split``), whose
    event the last client's message carries for the whole release."""
    st, p = ctx.state, ctx.state["setup"]
    last = st["me"] == len(st["order"]) - 1
    noisy, event = _ring_noise(ctx, st["values"], t, carries=last)
    words = pads.to_ring(noisy, p.ring_bits)
    if running is None:
        st["ring_mask"] = _ring_mask(ctx, t)
        total = st["ring_mask"] + words
    else:
        total = np.asarray(running, dtype=words.dtype) + words
    order = st["order"]
    after = order[(st["me"] + 1) % len(order)]
    scope = "clients" if p.honest is not None or p.joint else ctx.name
    return Message("ring_partial", total, to=after, dp_event=event, scope=scope)


def _ring_mask(ctx: StepContext, t: int) -> np.ndarray:
    """The first client's one-time pad of the running sum (zero with masking=none), from its noise
    source (the OS in a secure run). With masking=pairwise there is no ring pass: the uploads go
    through the one secure sum (:func:`secure_input`)."""
    p = ctx.state["setup"]
    dtype = pads.ring_dtype(p.ring_bits)
    if ctx.state["settings"].masking == "none":
        return np.zeros(p.length, dtype)
    size = p.length * dtype.itemsize
    raw = ctx.noise.secret_bytes("secagg-masks", size, t)
    return np.frombuffer(raw, dtype=dtype).copy()


def secure_input(ctx: StepContext, round: int, ids: np.ndarray, t: int):
    """Party, masking=pairwise: its upload for :func:`rayfed.secagg.secure_sum` over the parties
    (one SecAgg user each), as :class:`~rayfed.secagg.RingWords` of Z_2^b, which the sum adds
    exactly (without the opt-in, integers would be fixed-point encoded as values).

    On the server: values plus the shared-seed pad, so the server still learns only the padded
    aggregate (the thesis's MSA), and a semi-honest server colluding with fewer than t clients
    learns no client's upload. On the ring (F1-F3): values plus this client's noise (or noise share, whose
    event the last client's upload carries for the whole release), with no pad: the coordinator,
    relaying the secure sum, learns only the noisy sum every client gets."""
    st, p = ctx.state, ctx.state["setup"]
    values = st.pop("values")
    if not len(ids):  # dropped out of the sum (cannot happen to a live party: one user each)
        return RingWords(np.zeros((0, p.length), pads.ring_dtype(p.ring_bits)))
    if st["settings"].topology == "server":
        return RingWords((pads.to_ring(values, p.ring_bits) + _pad(ctx, t))[None])
    last = st["me"] == len(st["order"]) - 1
    noisy, event = _ring_noise(ctx, values, t, carries=last)
    words = RingWords(pads.to_ring(noisy, p.ring_bits)[None])
    if event is None:
        return words
    return words, event, "clients" if p.honest is not None or p.joint else ctx.name


def release_step(ctx: StepContext, words: np.ndarray) -> Message:
    """Coordinator, ring with masking=pairwise: broadcast the secure sum Σ_l (values_l + noise_l)
    (its own view of it: it relayed the sum) to the clients."""
    return Message("ring_release", np.asarray(words), to="parties")


def ring_close_step(ctx: StepContext, running: np.ndarray) -> Message:
    """First client: remove its mask and broadcast Σ_l (values_l + noise_l)."""
    total = np.asarray(running)
    return Message("ring_release", total - ctx.state.pop("ring_mask"), to="parties")


def _ring_noise(ctx: StepContext, values: np.ndarray, t: int, *, carries: bool):
    """This client's noise on its ring upload: its own (local), its share of one split noise, or
    its share of the jointly sampled one; a share's event rides on the last client's message."""
    setup = ctx.state["setup"]
    if not setup.noise:
        return values, None
    share = ctx.state.pop("mpc_share") if setup.joint else None
    shared = setup.joint or setup.honest is not None
    noisy, event = _add_noise(
        ctx, values, setup.noise, t, carried=carries or not shared, share=share
    )
    return noisy, event if carries or not shared else None


# --- F2: the clients' MPC that samples the noise in shares (rayfed.secagg.mpc) ---------------------
def _samplers(setup: Setup) -> tuple[list, list[int]]:
    return [b.sampler for b in setup.noise], [b.length for b in setup.noise]


def deal_step(ctx: StepContext, *, setup: Setup, clients: list[str], t: int) -> dict[str, Message]:
    """Dealer: this iteration's correlated randomness, independent of the data — per client its
    XOR shares of a Beaver triple for every AND of the comparison tree and its daBits (XOR and
    additive shares mod 2^b), one per coin; from the dealer's own noise source."""
    samplers, lengths = _samplers(setup)
    coins = mpc.coin_count(samplers, lengths)
    kappa, packed = samplers[0].kappa, -(-coins // 8)

    def draw(n: int) -> np.ndarray:
        return np.frombuffer(ctx.noise.secret_bytes("mpc-dealer", n, t), dtype=np.uint8)

    m = len(clients)
    layers = [mpc.deal_triples(draw, (w, packed), m) for w in mpc.tree_widths(kappa)]
    dabits = mpc.deal_dabits(draw, coins, m, pads.ring_dtype(setup.ring_bits))
    return {
        name: Message(
            "mpc_correlated",
            {"triples": [layer[i] for layer in layers], "dabits": dabits[i]},
            to=name,
        )
        for i, name in enumerate(clients)
    }


def mpc_start_step(ctx: StepContext, dealt: dict, *, t: int) -> Message:
    """Client: its random bits of every coin's κ-bit U (its noise source: the OS in a secure
    run), the comparison's leaves against the public thresholds, and its share of the first AND
    layer's openings (broadcast)."""
    st, p = ctx.state, ctx.state["setup"]
    samplers, lengths = _samplers(p)
    if "mpc_planes" not in st:  # public: every coin's threshold A_j, bit-sliced
        st["mpc_planes"] = mpc.coin_planes(samplers, lengths)
    planes, first = st["mpc_planes"], st["me"] == 0
    u = np.frombuffer(ctx.noise.secret_bytes("mpc-coins", planes.size, t), dtype=np.uint8)
    g, p_ = mpc.compare_leaves(u.reshape(planes.shape), planes, first)
    st["mpc"] = {"dealt": dealt, "layer": 0, "g": g, "p": p_}
    return _open_layer(ctx)


def _open_layer(ctx: StepContext) -> Message:
    """This client's share of the openings of the current AND layer (or of the B2A)."""
    run, first = ctx.state["mpc"], ctx.state["me"] == 0
    triples = run["dealt"]["triples"]
    if run["layer"] < len(triples):
        x, y = mpc.tree_operands(run["g"], run["p"], first)
        opening = mpc.and_open(x, y, triples[run["layer"]])
    else:  # the coins c = g: open c ⊕ r with the daBits
        opening = run["g"][0] ^ run["dealt"]["dabits"][0]
    return Message("mpc_opening", opening, to="parties")


def mpc_layer_step(ctx: StepContext, opened: np.ndarray, *, t: int) -> Message | None:
    """Client: finish the current layer with the opened values (XORed by the driver, the
    broadcast channel) and open the next; after the B2A opening, keep its additive share of
    every coordinate's DLap = G₁ − G₂ for the ring."""
    st, run, first = ctx.state, ctx.state["mpc"], ctx.state["me"] == 0
    triples = run["dealt"]["triples"]
    if run["layer"] < len(triples):
        z = mpc.and_finish(opened, triples[run["layer"]], first)
        run["g"], run["p"] = mpc.tree_combine(run["g"], run["p"], z, first)
        run["layer"] += 1
        return _open_layer(ctx)
    samplers, lengths = _samplers(st["setup"])
    count = mpc.coin_count(samplers, lengths)
    coins = mpc.b2a_share(opened, run["dealt"]["dabits"][1], first, count)
    st["mpc_share"] = mpc.dlap_shares(coins, samplers, lengths)
    del st["mpc"]
    return None


# --- the coordinator (the server; on the ring, its setup runs on the first client) -----------------
def setup_step(ctx: StepContext, *, setup: Setup) -> Message:
    """Server (or the ring's first client): broadcast the public setup — t_max and the rest,
    derived from the public N (spec A3) in the plan — to the clients."""
    return Message("parameters", setup, to="parties")


def aggregate_step(ctx: StepContext, uploads: dict[str, np.ndarray], *, setup: Setup, t: int):
    """Server: add the padded uploads in Z_(2^b) and discrete-Laplace noise on the grid; the
    result is still padded, so the server learns nothing and the clients only the noisy sum."""
    dtype = pads.ring_dtype(setup.ring_bits)
    total = np.zeros(setup.length, dtype=dtype)
    for words in uploads.values():
        total = total + np.asarray(words, dtype=dtype)
    if not setup.noise:
        return Message("masked_aggregate", total, to="parties")
    total, event = _add_noise(ctx, total, setup.noise, t)
    return Message("masked_aggregate", total, to="parties", dp_event=event, scope="clients")


def _add_noise(
    ctx: StepContext,
    values: np.ndarray,
    blocks: tuple[Noise, ...],
    t: int,
    *,
    carried: bool = True,
    share: np.ndarray | None = None,
):
    """Every block of ``values`` released through its measurement (the server's noise on padded
    words, a client's own, or its share of one noise: a share whose release another client's
    message carries is drawn ``part_of`` it); the event is the block's, or their composition."""
    out, events, start = values.copy(), [], 0
    for block in blocks:
        part = slice(start, start + block.length)
        m = block.measurement
        options = {} if share is None else {"share": share[part]}  # its MPC noise share
        out[part], event = m(
            ctx.noise, values[part], round=t, part_of=None if carried else m, **options
        )
        events.append(event)
        start += block.length
    return out, noise_event(events)
