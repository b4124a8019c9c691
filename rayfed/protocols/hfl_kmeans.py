"""DP horizontally federated k-means with masked aggregation and size-constrained assignment — the
NMA and AMN protocols of A. Ahmed, "Differentially-Private Multiparty Clustering" (MMath thesis,
Waterloo 2023); spec: shared/specs/hfl-kmeans.md.

M clients (PartyActors) each hold some rows in [-1, 1]^d (mapped from declared bounds); the
semi-honest server is the coordinator. Setup: the clients agree on a group key the server lacks
(X25519 + AES-GCM); they send their row counts, the server derives t_max and the other public
parameters (§3.5.5, §3.6.4); every client derives the same initial centroids from the group key
(sphere packing). Then t_max round trips:

1. each client assigns its rows to the current centroids — by default a size-constrained
   min-cost flow with per-client bounds ⌈c_min/M⌉ and ⌊c_max/M⌋ (OR-Tools) — and uploads, padded
   in Z_(2^b) at precision 2^-16, either its per-cluster sums and counts (``nma``: Noise, Mask then
   Average = DPLloyd) or its local centroids / M (``amn``: Average, Mask then Noise = CDPLloyd);
2. the server adds the uploads and discrete-Laplace noise on the grid, still padded, and
   broadcasts; each client unpads, post-processes (fold by default) and divides (NMA).

``masking``: ``shared-seed`` (the thesis: all clients derive all pads), ``pairwise`` (pairwise
X25519 masks on top, so a server colluding with one client learns no other client's upload) or
``none`` (a labelled baseline). ``topology=ring`` is the serverless sketch of §7.3.1: a ring
secure sum in which every client adds its own full Laplace noise.

Privacy: add/remove one point, pure ε, composed over the t_max iterations (the server's noise) or
in parallel over the clients (the ring's local noise). ``sensitivity`` chooses the AMN centroid
sensitivity: ``corrected`` (2B/(M(⌈c_min/M⌉+1)), tight for a local mean) or ``thesis`` (B·E/c_min,
about half of it: the ledger then records the larger ε that noise actually buys).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from rayfed import rng
from rayfed.clustering import dplloyd
from rayfed.clustering.constrained import ASSIGNMENTS, POSTS, empty_clusters, silhouette, wcss
from rayfed.config import DataConfig, option
from rayfed.data import horizontal, load_table, require_clean
from rayfed.data.scaling import check_bounds, declared_bounds, features_of, from_unit, to_unit
from rayfed.errors import ConfigError, DataError
from rayfed.privacy import Budget, check_budget
from rayfed.protocols.base import Outcome, Plan, Protocol, reconcile_randomness, reject_inapplicable
from rayfed.protocols.hfl_kmeans_steps import (
    DATA_INITS,
    Params,
    aggregate_step,
    data_init_step,
    derive_params,
    iterate_step,
    noise_event,
    overflow_check,
    prepare_step,
    ring_close_step,
    ring_step,
    setup_step,
    size_step,
    synthetic_table,
)
from rayfed.protocols.key_agreement import agree_group_key
from rayfed.secagg import pads

INITS = ("sphere-packing", "random", *DATA_INITS)
CLIENT_SETTINGS = (
    "aggregation",
    "assignment",
    "init",
    "sum_post",
    "count_post",
    "centroid_post",
    "masking",
    "topology",
)


@dataclass(frozen=True)
class HflKmeansConfig:
    """Options of ``rayfed run hfl-kmeans``."""

    aggregation: Literal["nma", "amn"] = option(
        "nma",
        "nma: masked per-cluster sums and counts + DPLloyd noise; amn: masked local centroids + "
        "CDPLloyd noise",
    )
    epsilon: float = option(4.0, "total privacy budget ε over all iterations", above=0)
    noise: Literal["laplace", "none"] = option(
        "laplace", "laplace: DP; none: a non-private baseline (t_max = 7)"
    )
    k: int = option(8, "number of clusters", at_least=1)
    clients: int = option(2, "number of clients M (row blocks after a seeded shuffle)", at_least=2)
    assignment: Literal[ASSIGNMENTS] = option(
        "constrained",
        "constrained: min-cost flow with per-client sizes ⌈c_min/M⌉..⌊c_max/M⌋, each point in 1..E "
        "clusters; unconstrained: nearest centroid (plain Lloyd); non-exclusive: each cluster "
        "takes its ⌈c_min/M⌉ nearest points",
    )
    contribution: int = option(
        1, "E: constrained assignment puts a point in at most E clusters", at_least=1
    )
    min_size: int | Literal["auto"] = option("auto", "global c_min; auto: ⌈N/(1.5k)⌉", at_least=0)
    max_size: int | Literal["auto"] = option("auto", "global c_max; auto: ⌊3N/k⌋", at_least=1)
    init: Literal[INITS] = option(
        "sphere-packing",
        "sphere-packing or random (uniform in [-1,1]^d), both from the clients' group key; "
        "data-random or kmeans++ (the first client's rows: not private, noise=none only)",
    )
    sum_post: Literal[POSTS] = option("none", "post-processing of the noisy sums (NMA)")
    count_post: Literal[POSTS] = option("none", "post-processing of the noisy counts (NMA)")
    centroid_post: Literal[POSTS] = option("fold", "post-processing of the centroids")
    iterations: int | Literal["auto"] = option(
        "auto", "t_max; auto: the thesis's rule from N (private) or 7 (non-private)", at_least=1
    )
    rho: float = option(dplloyd.RHO, "ρ of the NMA budget split and iteration rule", above=0)
    sensitivity: Literal["corrected", "thesis"] = option(
        "corrected",
        "AMN centroid sensitivity: corrected (2B/(M(⌈c_min/M⌉+1)), one point's true effect) or "
        "thesis (B·E/c_min: about half of it; the ledger records the ε that noise really buys)",
    )
    masking: Literal["shared-seed", "pairwise", "none"] = option(
        "shared-seed",
        "shared-seed: the thesis's pads from a seed all clients share; pairwise: plus pairwise "
        "X25519 masks (a server colluding with one client sees no other client's upload, M >= 3); "
        "none: plaintext uploads (an insecure baseline)",
    )
    topology: Literal["server", "ring"] = option(
        "server",
        "server: the server adds central noise to the padded sum; ring: serverless ring secure "
        "sum, every client adds its own full noise (the thesis's §7.3.1 sketch)",
    )
    ring_bits: Literal[32, 64] = option(32, "the ring Z_2^b of the uploads: 32 (the thesis) or 64")
    frac_bits: int = option(16, "fixed-point precision 2^-f", at_least=0, at_most=30)
    key_agreement: Literal["seeded", "secure"] = option(
        "seeded",
        "key agreement randomness: seeded (from the run seed, a simulation) or secure (OS "
        "randomness: makes the run randomness=secure, and a secure run sets it)",
    )
    shuffle: bool = option(
        True, "split the rows over the clients after a seeded shuffle (the thesis); false: in order"
    )
    users: int = option(10_000, "synthetic data: number of points N", at_least=1, size=True)
    dims: int = option(2, "synthetic data: dimension d", at_least=1, size=True)
    spread: float = option(0.06, "synthetic data: std of each blob per coordinate", above=0)
    bounds: dict[str, list[float]] | None = option(
        None, "data file: feature column -> declared [low, high] (mapped to [-1, 1])"
    )
    out_of_bounds: Literal["error", "clip"] = option(
        "error", "a data value outside its declared bounds: error, or clip it"
    )
    evaluate: bool = option(
        True, "add WCSS, silhouette and empty clusters on the union (raw data: not private)"
    )
    silhouette_points: int = option(
        10_000,
        "silhouette exactly up to this many points, else on a uniform sample of them",
        at_least=1,
    )
    data: DataConfig = field(default_factory=DataConfig, metadata={"help": "data source"})

    def validate(self) -> None:
        check_budget(self.epsilon, 0.0)
        if self.contribution > self.k:
            raise ConfigError("contribution", f"E = {self.contribution} > k = {self.k}", "1..k")
        if self.contribution > 1 and self.assignment != "constrained":
            raise ConfigError(
                "contribution", "applies to assignment=constrained only", "drop contribution"
            )
        if "auto" not in (self.min_size, self.max_size) and self.min_size > self.max_size:
            raise ConfigError("min_size", f"{self.min_size} > max_size = {self.max_size}")
        if self.assignment == "non-exclusive" and self.min_size == 0:
            raise ConfigError("min_size", "non-exclusive clusters of 0 points are empty", ">= 1")
        self._reject_unread()
        if self.init in DATA_INITS and self.noise != "none":
            raise ConfigError(
                "init",
                f"{self.init} picks centroids from a client's rows: not differentially private",
                "sphere-packing or random, or noise=none",
            )
        if self.topology == "ring" and self.masking == "pairwise":
            raise ConfigError(
                "masking", "the ring masks with the first client's random pad", "shared-seed"
            )

    def _reject_unread(self) -> None:
        """An option the chosen mode never reads is an error, not silently ignored."""
        default = type(self)()
        unread = {
            "sensitivity": self.aggregation == "nma" or self.noise == "none",
            "sum_post": self.aggregation == "amn",
            "count_post": self.aggregation == "amn",
            "rho": self.aggregation == "amn" or self.noise == "none",
            "epsilon": self.noise == "none",
            "min_size": self.assignment == "unconstrained",
            "max_size": self.assignment == "unconstrained",
        }
        for name, ignored in unread.items():
            if ignored and getattr(self, name) != getattr(default, name):
                raise ConfigError(
                    name,
                    f"is not used with aggregation={self.aggregation}, noise={self.noise}, "
                    f"assignment={self.assignment}",
                    "drop it",
                )


def _load(cfg: HflKmeansConfig, seed: int) -> tuple[pa.Table, list[str], np.ndarray, np.ndarray]:
    if cfg.data.path is None:
        table = synthetic_table(cfg.users, cfg.dims, cfg.k, cfg.spread, seed)
        features = [f"x{j}" for j in range(cfg.dims)]
        return table, features, np.full(cfg.dims, -1.0), np.full(cfg.dims, 1.0)
    if not cfg.bounds:
        raise ConfigError(
            "bounds",
            "a data file needs the declared bounds of every feature column",
            "e.g. --set bounds.x=[0,1e6] --set bounds.y=[0,1e6]",
        )
    table = load_table(cfg.data.path, cfg.data.format)
    for col in cfg.bounds:
        if col not in table.column_names:
            raise DataError(
                f"bounds.{col}", f"column {col!r} is not in the data", table.column_names
            )
    features = list(cfg.bounds)
    lo, hi = declared_bounds(cfg.bounds, features)
    return table, features, lo, hi


def _check_feasible(params: Params, sizes: list[int], assignment: str) -> None:
    """Every client's constrained assignment must have a solution (§3.1: k·c_min <= E·N_l and
    N_l <= k·c_max), and a non-exclusive cluster must find its ⌈c_min/M⌉ points (the sensitivity
    assumes that size); checked before any actor starts."""
    b, k, e = params.bounds, params.k, params.contribution
    if b.c_min > b.c_max:
        raise ConfigError(
            "min_size", f"c_min = {b.c_min} > c_max = {b.c_max}", "a smaller min_size"
        )
    if assignment == "non-exclusive" and b.client_min > min(sizes):
        raise ConfigError(
            "min_size",
            f"a non-exclusive cluster takes ⌈c_min/M⌉ = {b.client_min} points but a client has "
            f"only {min(sizes)} rows",
            f"min_size <= {min(sizes) * params.clients}",
        )
    if assignment != "constrained":
        return
    for n_l in sizes:
        if k * b.client_min > e * n_l or n_l > k * b.client_max:
            raise ConfigError(
                "min_size",
                f"a client with {n_l} rows cannot fill {k} clusters of {b.client_min}.."
                f"{b.client_max} rows each (per-client bounds of c_min={b.c_min}, c_max={b.c_max})",
                "lower min_size, raise max_size, or fewer clients",
            )


class HflKmeans(Protocol):
    name = "hfl-kmeans"
    summary = "DP horizontal multiparty k-means (NMA / AMN) with masked aggregation"
    Config = HflKmeansConfig
    examples = (
        {"users": 2000},
        {"users": 2000, "aggregation": "amn", "sensitivity": "thesis"},
        {"users": 2000, "topology": "ring"},
    )

    def data_bytes(self, cfg: HflKmeansConfig) -> int:
        """The synthetic points, each client's unit-scaled and grid copies, and the assignment's
        point-to-cluster costs (k per point)."""
        if cfg.data.path is not None:
            return 0
        return cfg.users * (cfg.dims * 8 * 4 + cfg.k * 16)

    def resolve_randomness(self, cfg: HflKmeansConfig, randomness: str):
        """``key_agreement=secure`` makes the run secure; a secure run makes it secure."""
        return reconcile_randomness(cfg, randomness, "key_agreement", upgrade=("seeded",))

    def plan(self, cfg: HflKmeansConfig, seed: int) -> Plan:
        if cfg.data.columns is not None:
            raise ConfigError(
                "data.columns", "horizontal clients hold whole rows", "drop it; use bounds"
            )
        reject_inapplicable(cfg, ["bounds"], ["users", "dims", "spread"])
        table, features, lo, hi = _load(cfg, seed)
        require_clean(table, features, numeric=True)
        x_raw = features_of(table, features)
        check_bounds(x_raw, features, lo, hi, cfg.out_of_bounds)
        n, d = x_raw.shape
        if n < cfg.clients * cfg.k:
            raise DataError(
                "data.path" if cfg.data.path else "users",
                f"{n} rows for {cfg.clients} clients and k = {cfg.k}",
                f"at least {cfg.clients * cfg.k} rows, or fewer clients / clusters",
            )
        params = derive_params(cfg, n, d)
        overflow_check(params, cfg.assignment, cfg.aggregation, cfg.topology)
        rows = table.select(features)
        if cfg.shuffle:
            rows = rows.take(rng.stream(seed, "partition", 0, "hfl-kmeans").permutation(n))
        blocks = horizontal(rows, cfg.clients)
        _check_feasible(params, [t.num_rows for t in blocks.values()], cfg.assignment)
        meta = {"columns": features, "lo": lo.tolist(), "hi": hi.tolist()}
        evaluation = None
        if cfg.evaluate:
            evaluation = {"x": np.clip(to_unit(x_raw, lo, hi), -1.0, 1.0)}
        private = cfg.noise != "none"
        return Plan(
            budget=Budget(params.t_max * params.epsilon_per_iteration)
            if private
            else Budget.none(),
            requested_epsilon=cfg.epsilon if private else None,
            ledger=dict(
                accountant="pure",
                relation="add_or_remove_one",
                composition="parallel" if cfg.topology == "ring" else "sequential",
                statement=self._statement(cfg),
            ),
            parties={p: (block, meta) for p, block in blocks.items()},
            rounds=params.t_max + 2,
            evaluation=evaluation,
            info={"features": features, "lo": lo, "hi": hi, "params": params},
        )

    @staticmethod
    def _statement(cfg: HflKmeansConfig) -> str:
        if cfg.noise == "none":
            return "not private: a non-private baseline (masked, but the clients see exact sums)"
        if cfg.topology == "ring":
            return (
                "ε-DP per client by its own local noise (add/remove one point); parallel over the "
                "clients' disjoint rows"
            )
        return (
            "ε-DP towards every client (add/remove one point), sequential over the iterations; "
            "assumes the server draws its noise honestly and colludes with no client"
        )

    def drive(self, fed, cfg: HflKmeansConfig, plan: Plan) -> Outcome:
        order = sorted(plan.parties)
        params: Params = plan.info["params"]
        ring = cfg.topology == "ring"
        with fed.round(0):
            agree_group_key(
                fed,
                order,
                purpose="group-key",
                slot="group_key",
                pair_info=pads.INFO_PAIRS if cfg.masking == "pairwise" else None,
            )
            # the server (on the ring: the first client) learns N and derives the parameters
            host = fed.parties if ring else fed.coordinator
            sizes = fed.parties.run(
                size_step, to=order[0] if ring else "coordinator", phase="sizes"
            )
            broadcast = host.run(
                setup_step,
                sizes,
                cfg=cfg,
                d=params.d,
                phase="setup",
                **({"members": [order[0]]} if ring else {}),
            )
            params = fed.one(broadcast)
            given = None
            if cfg.init in DATA_INITS:
                given = fed.parties.run(
                    data_init_step, init=cfg.init, k=cfg.k, members=[order[0]], phase="init"
                )
            settings = {name: getattr(cfg, name) for name in CLIENT_SETTINGS}
            fed.parties.run(
                prepare_step,
                broadcast.single(),
                given,
                settings=settings,
                order=order,
                phase="prepare",
            )
        started = time.perf_counter()
        aggregate = None
        for t in range(1, params.t_max + 1):
            with fed.round(t):
                uploads = fed.parties.run(iterate_step, aggregate, t=t, phase="assign-upload")
                if ring:
                    aggregate = self._ring(fed, cfg, params, order, t).single()
                else:
                    aggregate = self._aggregate(fed, params, uploads, t).single()
        with fed.round(params.t_max + 1):
            final = fed.parties.run(iterate_step, aggregate, t=params.t_max + 1, phase="update")
        seconds = time.perf_counter() - started
        outputs = {p: np.asarray(c) for p, c in fed.get(final, phase="outputs").items()}
        centers = outputs[order[0]]
        identical = all(np.array_equal(c, centers) for c in outputs.values())
        if not identical:  # every client unpads the same words: a difference is a protocol bug
            raise RuntimeError("the clients' final centroids differ")
        self._notes(fed, cfg, params)
        return self._outcome(cfg, plan, params, centers, seconds)

    @staticmethod
    def _aggregate(fed, params: Params, uploads, t: int):
        if params.noise:
            fed.charge(
                [("clients", "discrete-Laplace noise on the padded aggregate", _event(params))]
            )
        return fed.coordinator.run(aggregate_step, uploads, params=params, t=t, phase="aggregate")

    @staticmethod
    def _ring(fed, cfg: HflKmeansConfig, params: Params, order: list[str], t: int):
        running = None
        for p in order:
            if params.noise:
                fed.charge([(p, "local discrete-Laplace noise (ring)", _event(params))])
            running = fed.parties.run(ring_step, running, t=t, members=[p], phase="ring")
        return fed.parties.run(ring_close_step, running, members=[order[0]], phase="ring-close")

    @staticmethod
    def _notes(fed, cfg: HflKmeansConfig, params: Params) -> None:
        masking = {
            "shared-seed": "uploads and aggregates are one-time-padded in Z_2^{b} with pads every "
            "client derives from the group key: the server sees only uniform words; the server "
            "colluding with any one client unmasks every upload (all clients know all pads)",
            "pairwise": "uploads carry the shared-seed pads plus pairwise X25519 masks: the server "
            "sees only uniform words; colluding with one client it learns the aggregate before "
            "its own noise (not DP) but, with 3 or more clients, no other client's upload",
            "none": "masking=none: NOT secure, the server sees every client's upload and the "
            "aggregate (an insecure baseline)",
        }[cfg.masking]
        if cfg.topology == "ring":
            masking = (
                "ring: the first client pads the running sum with a random mask; each client sees "
                "only a padded partial sum, and the release is the noisy total"
            )
        fed.note(masking.replace("{b}", str(params.ring_bits)))
        fed.note(
            f"N = {params.n} and the clients' row counts are sent in the clear and treated as "
            "public (t_max and c_min depend on them; spec A3)"
        )
        if cfg.noise == "none":
            fed.note("noise=none: not private; the clients see exact aggregates")
            return
        fed.note(
            "noise: discrete Laplace on the 2^-{f} grid (integer noise, so Theorem 7.2.1's "
            "quantisation argument is not needed; drawn with numpy's geometric sampler, which "
            "computes in floating point — not an exact sampler)".replace(
                "{f}", str(params.frac_bits)
            )
        )
        if cfg.assignment != "unconstrained":
            fed.note(
                "the sensitivities assume one point changes only the clusters it joins; under a "
                "size-constrained assignment it can re-route other points, which neither the "
                "thesis's analysis nor this one covers (an assumption, not a proof)"
            )
        if params.claimed_epsilon is not None:
            true_eps = params.t_max * params.epsilon_per_iteration
            fed.note(
                f"sensitivity=thesis: noise calibrated to Δ^μ = B·E/c_min = "
                f"{params.sensitivity['thesis']:.4g}, but one point moves an uploaded local "
                f"centroid by up to {params.sensitivity['true']:.4g}: the thesis claims "
                f"ε = {params.claimed_epsilon:g}, the noise buys ε = {true_eps:.4g} (ledger)"
            )
        if cfg.topology == "ring":
            fed.note(
                f"ring: each of the {params.clients} clients adds full noise for its own rows, so "
                "the released sum carries M times the central noise variance"
            )

    @staticmethod
    def _outcome(cfg, plan: Plan, params: Params, centers: np.ndarray, seconds: float) -> Outcome:
        info = plan.info
        data_centers = from_unit(centers, info["lo"], info["hi"])
        table = pa.table(
            {"cluster": np.arange(len(centers))}
            | {c: data_centers[:, j] for j, c in enumerate(info["features"])}
        )
        b = params.bounds
        metrics: dict[str, Any] = {
            "aggregation": cfg.aggregation,
            "assignment": cfg.assignment,
            "masking": cfg.masking,
            "topology": cfg.topology,
            "points": params.n,
            "dims": params.d,
            "k": params.k,
            "clients": params.clients,
            "t_max": params.t_max,
            "epsilon_m": params.epsilon_m,
            "c_min": b.c_min,
            "c_max": b.c_max,
            "client_min": b.client_min,
            "client_max": b.client_max,
            **params.split,
            "noise_scales": {
                blk.label: blk.scale / params.scale for blk in params.noise
            },  # real units
            "upload_bytes": params.length * params.ring_bits // 8,
            "ms_per_iteration": 1000.0 * seconds / params.t_max,
        }
        headline = (
            f"{cfg.aggregation.upper()} {cfg.assignment}, {params.n:,} points over "
            f"{params.clients} clients, k = {params.k}, t_max = {params.t_max}"
        )
        if plan.evaluation is not None:
            x = plan.evaluation["x"]
            score, labels = wcss(x, centers)
            gen = rng.stream(0, "evaluation", 0, "silhouette")
            sil, used = silhouette(x, labels, gen, cfg.silhouette_points)
            metrics.update(
                wcss=score,
                nicv=score / len(x),
                empty_clusters=empty_clusters(labels, params.k),
                silhouette=sil,
                silhouette_points=used,
            )
            headline += (
                f"; WCSS {score:.4g}, {metrics['empty_clusters']} empty, silhouette {sil:.3f}"
            )
        return Outcome(tables={"centroids": table}, metrics=metrics, headline=headline)


def _event(params: Params):
    return noise_event([block.event for block in params.noise])
