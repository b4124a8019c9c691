"""The step functions of ``ldp-bitvector``, by role: plain functions of (ctx, inputs) -> reply."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from sklearn.cluster import KMeans

from rayfed.actors.base import Message, StepContext
from rayfed.clustering import seed_of
from rayfed.clustering.precomputed import agglomerative, best_kcluster, dbscan
from rayfed.data.scaling import features_of
from rayfed.ldp import bitvector as bv
from rayfed.privacy import Measurement
from rayfed.protocols.ldp_bitvector.params import Clustering

MAX_ATTRIBUTES = 4096  # the RR coins are keyed by record x MAX_ATTRIBUTES + attribute


@dataclass(frozen=True)
class Clusters:
    """A clustering's answer: every record's key and cluster (-1: DBSCAN's noise)."""

    records: np.ndarray
    labels: np.ndarray


# --- custodians ------------------------------------------------------------------------------------
def _scaled(ctx: StepContext) -> np.ndarray:
    meta = ctx.meta
    raw = features_of(ctx.table, meta["columns"])
    lo, hi = meta["bounds"]
    return meta["low"] + (raw - lo) / (hi - lo) * (meta["high"] - meta["low"])


def encode_step(
    ctx: StepContext, *, releases: dict[str, Measurement], t: float, round: int
) -> Message:
    """Custodian: every attribute of every record as s bits with the shared anchors, then per-bit
    randomized response (its release in ``releases``; none: noise-free BV), each record's coins
    keyed by (record, attribute). Sends the packed bits."""
    release = releases.get(ctx.name)
    x = _scaled(ctx)
    ids = ctx.table.column("record").to_numpy().astype(np.uint64)
    attributes = np.asarray(ctx.meta["attributes"], dtype=np.uint64)
    keys = ids[None, :] * np.uint64(MAX_ATTRIBUTES) + attributes[:, None]
    codes = bv.RecordCodes(x, ctx.meta["anchors"], t, keys)
    if release is None:
        packed, event = codes.pack(bits for _, bits in codes.blocks()), None
    else:
        packed, event = release(ctx.noise, codes, round=round, ids=ids)
    return Message(
        "bit_vectors", {"codes": packed, "records": ids.astype(np.int64)}, dp_event=event
    )


def exact_step(ctx: StepContext) -> Message:
    """Custodian (the non-private ``exact`` comparator; Alice in the decomposition): its scaled
    values in the clear."""
    return Message("values", {"x": _scaled(ctx), "records": ctx.table.column("record").to_numpy()})


def pair_step(ctx: StepContext, *, release: Measurement | None, round: int) -> Message:
    """Bob (decomposition, Eq. 21–23): DPBV codes of u and v for every record pair (his
    ``release``; None: noise-free BV), on a common range whose half-width t covers it (so
    |u - v| is in local view)."""
    u, v = bv.pair_sums(_scaled(ctx))
    codes = bv.PairCodes(u, v, ctx.meta["pair_anchors"], ctx.meta["pair_t"])
    if release is None:
        return Message("pair_codes", codes.pack(bits for _, bits in codes.blocks()))
    packed, event = release(ctx.noise, codes, round=round)
    return Message("pair_codes", packed, dp_event=event)


# --- the collector (the coordinator) ---------------------------------------------------------------
def collector_step(
    ctx: StepContext,
    messages: dict[str, dict],
    *,
    order: list[str],
    horizontal: bool,
    encoding: str,
    bits: int,
    mu: float,
    eps: float | None,
    consistence: float | None,
    clustering: Clustering,
) -> Clusters:
    """Collector: join the custodians' codes (or exact values) by record, estimate the distance
    matrix, cluster. Horizontal custodians hold row blocks, vertical ones attribute blocks."""
    parts = [messages[p] for p in order]
    key = "codes" if encoding != "exact" else "x"
    if horizontal:
        records = np.concatenate([m["records"] for m in parts])
        blocks = np.concatenate([m[key] for m in parts], axis=1 if key == "codes" else 0)
    else:
        records = parts[0]["records"]
        blocks = np.concatenate([m[key] for m in parts], axis=0 if key == "codes" else 1)
    if encoding == "exact":
        d = bv.exact_distances(blocks)
    else:
        unpacked = [np.unpackbits(b, axis=1, count=bits).astype(bool) for b in blocks]
        d = bv.distance_matrix(unpacked, bits, mu, eps, consistence)
    return Clusters(records, _cluster(d, clustering, ctx.rng("clustering", 0)))


def decomposition_collector_step(
    ctx: StepContext,
    values: dict,
    codes: np.ndarray,
    *,
    bits: int,
    pair_mu: float,
    eps: float | None,
    clustering: Clustering,
) -> Clusters:
    """Collector for Alice (decomposition): her exact part plus Bob's pair codes, then cluster."""
    d = bv.decomposition_distances(values["x"], codes, bits, pair_mu, eps)
    return Clusters(values["records"], _cluster(d, clustering, ctx.rng("clustering", 0)))


def _cluster(d: np.ndarray, c: Clustering, gen: np.random.Generator) -> np.ndarray:
    if c.method == "dbscan":
        return dbscan(d, c.dbscan_eps, c.min_samples)
    if c.method == "agglomerative":
        return agglomerative(d, c.k, c.linkage)
    return best_kcluster(d, c.k, gen, c.restarts)


# --- the trusted party (baselines) -----------------------------------------------------------------
def baseline_step(ctx: StepContext, *, method: str, k: int, sigma: float, q: int) -> Clusters:
    """The trusted party's baselines on the raw data: k-means, ADP (+ N(0, σ²)), RSP (x·R/(√q·σ_R))."""
    x = features_of(ctx.table, ctx.meta["columns"])
    gen = ctx.rng("clustering", 0)
    if method == "adp":  # no DP claim, but its noise follows the run's randomness all the same
        x = x + ctx.noise.generator("gaussian").normal(0.0, sigma, x.shape)
    elif method == "rsp":
        x = x @ ctx.noise.generator("sample").normal(0.0, 1.0, (x.shape[1], q)) / math.sqrt(q)
    labels = KMeans(n_clusters=k, n_init=10, random_state=seed_of(gen)).fit_predict(x)
    return Clusters(ctx.table.column("record").to_numpy(), labels)
