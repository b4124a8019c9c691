"""Planning ``hfl-kmeans``: the points (synthetic, or a file with declared bounds) dealt to the
clients in row blocks, the public setup of the planned N checked for overflow and feasibility, and
the budget — before any actor starts."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from rayfed import rng
from rayfed.data import horizontal, load_table, require_clean
from rayfed.data.scaling import declared_bounds, features_of, to_unit
from rayfed.errors import ConfigError, DataError
from rayfed.privacy import Budget, Clipped, DataDomain, Field, Interval, PrivacyDeclaration, enforce
from rayfed.protocols.base import Plan
from rayfed.protocols.hfl_kmeans.config import HflKmeansConfig
from rayfed.protocols.hfl_kmeans.params import (
    DEALER,
    RELATION,
    Evaluation,
    Params,
    Setup,
    derive_setup,
    overflow_check,
)


def data_bytes(cfg: HflKmeansConfig) -> int:
    """The synthetic points, each client's unit-scaled and grid copies, and the assignment's
    point-to-cluster costs (k per point)."""
    if cfg.data.path is not None:
        return 0
    return cfg.users * (cfg.dims * 8 * 4 + cfg.k * 16)


def plan(cfg: HflKmeansConfig, seed: int) -> Plan:
    if cfg.data.columns is not None:
        raise ConfigError(
            "data.columns", "horizontal clients hold whole rows", "drop it; use bounds"
        )
    table, features, lo, hi = _load(cfg, seed)
    require_clean(table, features, numeric=True)
    x, clipped = _enforce(features_of(table, features), features, lo, hi, cfg.out_of_bounds)
    n, d = x.shape
    if n < cfg.clients * cfg.k:
        raise DataError(
            "data.path" if cfg.data.path else "users",
            f"{n} rows for {cfg.clients} clients and k = {cfg.k}",
            f"at least {cfg.clients * cfg.k} rows, or fewer clients / clusters",
        )
    setup = derive_setup(cfg, n, d)  # N is public (spec A3): the plan's, not learned at runtime
    overflow_check(setup, cfg.assignment, cfg.aggregation, cfg.topology)
    rows = table.select(features)
    if any(c.count for c in clipped):  # the clients hold the clipped values, not the raw ones
        rows = pa.table({c: x[:, j] for j, c in enumerate(features)})
    if cfg.shuffle:
        rows = rows.take(rng.stream(seed, "partition", 0, "hfl-kmeans").permutation(n))
    blocks = horizontal(rows, cfg.clients)
    _check_feasible(setup, [t.num_rows for t in blocks.values()], cfg.assignment)
    meta = {"columns": features, "lo": lo.tolist(), "hi": hi.tolist()}
    evaluation = Evaluation(x=to_unit(x, lo, hi)) if cfg.evaluate else None
    private = cfg.noise != "none"
    budget = Budget(
        setup.t_max * setup.epsilon_per_iteration, setup.t_max * setup.delta_per_iteration
    )
    fields = tuple(
        Field((c,), Interval(float(a), float(b))) for c, a, b in zip(features, lo, hi, strict=True)
    )
    return Plan(
        privacy=PrivacyDeclaration(
            budget=budget if private else Budget.none(),
            accountant="pure",
            relation=RELATION,
            composition="parallel" if _local_ring(cfg) else "sequential",
            statement=_statement(cfg, setup),
            measurements=setup.measurements,
            requested_epsilon=cfg.epsilon if private else None,
            # each row a data point, held by one client (horizontal)
            data=DataDomain(fields, members="parties", partition="horizontal"),
        ),
        parties={p: (block, meta) for p, block in blocks.items()},
        cohorts=_dealer(setup),
        rounds=setup.t_max + 2,
        evaluation=evaluation,
        params=Params(features=features, lo=lo, hi=hi, setup=setup, clipped=clipped),
    )


def _enforce(
    x: np.ndarray, features: list[str], lo: np.ndarray, hi: np.ndarray, policy: str
) -> tuple[np.ndarray, tuple[Clipped, ...]]:
    """Every column inside its declared bounds: clipped and counted (``out_of_bounds=clip``) or
    refused naming ``bounds.<column>`` (``error``) — where the data enters, never later."""
    out, clipped = np.empty_like(x), []
    for j, col in enumerate(features):
        out[:, j : j + 1], c = enforce(
            x[:, j : j + 1],
            Interval(float(lo[j]), float(hi[j])),
            "clip" if policy == "clip" else "refuse",
            "bounds",
            "out_of_bounds",
            columns=[col],
            widen=f"widen bounds.{col}",
        )
        clipped.append(c)
    return out, tuple(clipped)


def _dealer(setup: Setup) -> dict[str, tuple[pa.Table, dict]]:
    """ring_noise=mpc: the dealer of the clients' correlated randomness, a data-less actor of its
    own (in the cohorts group, whose actors are generic step runners like every role's)."""
    if not setup.joint:
        return {}
    return {DEALER: (pa.table({"user_id": pa.array([], pa.int64())}), {})}


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


def _load(cfg: HflKmeansConfig, seed: int) -> tuple[pa.Table, list[str], np.ndarray, np.ndarray]:
    if cfg.data.path is None:
        table = synthetic_table(cfg.users, cfg.dims, cfg.k, cfg.cluster_sd, seed)
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


def _check_feasible(setup: Setup, sizes: list[int], assignment: str) -> None:
    """Every client's constrained assignment must have a solution (§3.1: k·c_min <= E·N_l and
    N_l <= k·c_max) on D and on its neighbours — a point removed or added at any client — since
    an abort that one point decides would break DP: one row of slack, k·c_min <= E·(N_l - 1)
    and N_l + 1 <= k·c_max. A non-exclusive cluster must find its ⌈c_min/M⌉ points (the
    sensitivity assumes that size). Checked before any actor starts."""
    b, k, e = setup.bounds, setup.k, setup.contribution
    if b.c_min > b.c_max:
        raise ConfigError(
            "min_size", f"c_min = {b.c_min} > c_max = {b.c_max}", "a smaller min_size"
        )
    if assignment == "non-exclusive" and b.client_min > min(sizes):
        raise ConfigError(
            "min_size",
            f"a non-exclusive cluster takes ⌈c_min/M⌉ = {b.client_min} points but a client has "
            f"only {min(sizes)} rows",
            f"min_size <= {min(sizes) * setup.clients}",
        )
    if assignment != "constrained":
        return
    for n_l in sizes:
        bounds = f"(per-client bounds of c_min={b.c_min}, c_max={b.c_max})"
        if k * b.client_min > e * (n_l - 1):
            raise ConfigError(
                "min_size",
                f"a client with {n_l} rows cannot fill {k} clusters of at least {b.client_min} "
                f"rows each once one row is removed {bounds}: every client needs one row of "
                "slack, since an abort that one point decides is not DP",
                f"min_size <= {setup.clients * ((e * (n_l - 1)) // k)}, or fewer clients",
            )
        if n_l + 1 > k * b.client_max:
            raise ConfigError(
                "max_size",
                f"a client with {n_l} rows cannot fit into {k} clusters of at most "
                f"{b.client_max} rows each once one row is added {bounds}: every client needs "
                "one row of slack, since an abort that one point decides is not DP",
                f"max_size >= {setup.clients * -(-(n_l + 1) // k)}, or more clients",
            )


def _statement(cfg: HflKmeansConfig, setup: Setup) -> str:
    if cfg.noise == "none":
        return "not private: a non-private baseline (masked, but the clients see exact sums)"
    if _local_ring(cfg):
        base = "ε-DP per client by its own local noise; parallel over the clients' disjoint rows"
    elif cfg.topology == "ring" and cfg.ring_noise == "mpc":
        base = (
            "(ε, δ)-DP towards every client and any coalition of up to M - 1 clients, "
            "sequential over the iterations; assumes the dealer of the MPC's correlated "
            "randomness is honest and colludes with no client and not with the driver, which "
            "relays the clients' opening shares (δ: the truncation of the jointly sampled noise)"
        )
    elif cfg.topology == "ring":
        base = (
            "ε-DP against any coalition of up to M - honest_clients clients, sequential over "
            "the iterations; assumes the others keep their noise shares and pairwise secrets"
        )
    else:
        base = (
            "ε-DP towards every client, sequential over the iterations; assumes the server "
            "draws its noise honestly and colludes with no client"
        )
    parts = [
        base,
        "N (hence t_max, c_min, c_max and ε^(m)) is a public input, not protected (spec A3): "
        "under add/remove neighbours N itself discloses whether a point is present, so what "
        "the noise protects is a point's value, and the guarantee holds for the parameters "
        "planned from this N",
    ]
    if cfg.assignment == "constrained":
        parts.append(
            "the size-constrained assignment's sensitivity counts the up to k - 1 points one "
            "point displaces; it assumes the min-cost flow's optimum unique up to exchanging "
            "equal points: public offsets (i + 1)·2^-16·u separate coinciding centroids in the "
            "flow's integer costs, but an exact tie of those costs (distinct points re-routed "
            "at zero total cost: an exact linear relation, to within the costs' rounding, "
            "between the points and the noisy centroids) is neither excluded nor charged"
        )
        if cfg.noise != "none" and (
            cfg.centroid_post == "trunc"
            or (cfg.aggregation == "nma" and cfg.sum_post == cfg.count_post == "trunc")
        ):
            parts.append(
                "truncation puts two centroids on one point with positive probability, where "
                "points placed on the tie break that assumption: the ε is not a guarantee "
                "(refused with sensitivity=corrected)"
            )
    if setup.claimed_epsilon is not None:
        parts.append(
            "sensitivity=thesis: the thesis's noise (one point moves only its own clusters), "
            "so the ε is the larger one that noise buys, not the requested one"
        )
    return "; ".join(parts)


def _local_ring(cfg: HflKmeansConfig) -> bool:
    """The ring with every client's own full noise: its ledger scopes are the clients."""
    return cfg.topology == "ring" and cfg.ring_noise == "local"
