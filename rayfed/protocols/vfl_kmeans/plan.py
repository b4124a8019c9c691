"""Planning ``vfl-kmeans``: the data (synthetic, or a file with declared bounds) split into the
parties' column blocks, the budget split and a first check of the grid size — before any actor
starts."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa

from rayfed import rng
from rayfed.clustering import nearest, weighted_kmeans
from rayfed.data import even_groups, load_table, require_clean, sort_by_key, vertical
from rayfed.data.scaling import check_bounds, declared_bounds, features_of, to_unit
from rayfed.errors import ConfigError, DataError
from rayfed.privacy import Budget, Neighbours, PrivacyDeclaration
from rayfed.protocols.base import Plan
from rayfed.protocols.vfl_kmeans.config import ENCODING, VflKmeansConfig
from rayfed.protocols.vfl_kmeans.params import (
    Params,
    Split,
    check_grid,
    choose_k_prime,
    split_budget,
)

CURATOR = "curator"


def data_bytes(cfg: VflKmeansConfig) -> int:
    """The synthetic table and each party's unit-scaled copy, labels, and M sketch rows of up
    to 64 local clusters per party (the grid is bounded by max_grid_cells)."""
    if cfg.data.path is not None:
        return 0
    return cfg.users * (cfg.dims * 32 + cfg.parties * 16) + cfg.sketches * cfg.parties * 512


def plan(cfg: VflKmeansConfig, seed: int) -> Plan:
    table, features, groups, lo, hi, label_col = _load(cfg, seed)
    x_raw = _checked_features(cfg, table, features, lo, hi)
    n, m = x_raw.shape
    central = cfg.method.startswith("central")
    delta = 1.0 / n if cfg.delta is None else cfg.delta
    if central:
        groups = {CURATOR: list(features)}
    split = _checked_split(cfg, len(groups), n, m, delta)
    partitions = vertical(table, groups, cfg.data.key)
    index = {c: j for j, c in enumerate(features)}
    parties = {
        p: (
            partitions[p],
            {
                "columns": cols,
                "lo": [float(lo[index[c]]) for c in cols],
                "hi": [float(hi[index[c]]) for c in cols],
            },
        )
        for p, cols in groups.items()
    }
    return Plan(
        privacy=PrivacyDeclaration(
            budget=_budget(cfg, split, len(groups)),
            accountant="pure",
            relation=Neighbours(
                "replace_one" if cfg.method == "ldp-agg-2pest" else "add_or_remove_one", "user"
            ),
            composition="sequential",
            statement=_statement(cfg),
        ),
        parties=parties,
        rounds=1 if central else 3,
        evaluation=_evaluation(cfg, table, x_raw, lo, hi, label_col, seed)
        if cfg.evaluate
        else None,
        params=Params(
            order=list(groups),
            positions=[[index[c] for c in groups[p]] for p in groups],
            features=features,
            lo=lo,
            hi=hi,
            users=n,
            delta=delta,
            split=split,
        ),
    )


def synthetic_table(users: int, dims: int, k: int, spread: float, seed: int) -> pa.Table:
    """Spec §5.1: k centers uniform in [-1, 1]^m, uniform labels, N(0, spread²) per coordinate,
    clipped to [-1, 1]; ``label`` is the generating component."""
    gen = rng.stream(seed, "synthetic", 0, "vfl-kmeans")
    centers = gen.uniform(-1.0, 1.0, (k, dims))
    labels = gen.integers(0, k, users)
    x = np.clip(centers[labels] + gen.normal(0.0, spread, (users, dims)), -1.0, 1.0)
    cols: dict[str, Any] = {"user_id": np.arange(users, dtype=np.int64)}
    cols.update({f"x{j}": x[:, j] for j in range(dims)})
    cols["label"] = labels
    return pa.table(cols)


def random_split(features: list[str], parties: int, seed: int) -> dict[str, list[str]]:
    """The synthetic experiment's random split of the attributes into S even groups."""
    perm = rng.stream(seed, "partition", 0, "vfl-kmeans").permutation(len(features))
    groups = even_groups([features[i] for i in perm], parties)
    return {p: sorted(cols, key=features.index) for p, cols in groups.items()}


def _load(cfg: VflKmeansConfig, seed: int):
    """(table, features in global order, groups, lo, hi, reference label column or None)."""
    if cfg.data.path is None:
        table = synthetic_table(cfg.users, cfg.dims, cfg.k, cfg.spread, seed)
        features = [f"x{j}" for j in range(cfg.dims)]
        lo, hi = np.full(cfg.dims, -1.0), np.full(cfg.dims, 1.0)
        return table, features, random_split(features, cfg.parties, seed), lo, hi, "label"
    table = sort_by_key(load_table(cfg.data.path, cfg.data.format), cfg.data.key)
    for col in cfg.bounds or {}:
        if col not in table.column_names:
            raise DataError(
                f"bounds.{col}", f"column {col!r} is not in the data", table.column_names
            )
    groups = _file_groups(cfg)
    grouped = {c for cols in groups.values() for c in cols}
    features = [c for c in table.column_names if c in grouped]
    lo, hi = declared_bounds(cfg.bounds, features)
    if cfg.label is not None and cfg.label not in table.column_names:
        raise DataError("label", f"column {cfg.label!r} is not in the data", table.column_names)
    return table, features, groups, lo, hi, cfg.label


def _file_groups(cfg: VflKmeansConfig) -> dict[str, list[str]]:
    """Party -> feature columns of a data file: data.columns, or the bounded columns dealt evenly."""
    if cfg.data.columns is not None:
        groups = {p: list(c) for p, c in cfg.data.columns.items()}
    elif cfg.bounds:
        groups = even_groups(list(cfg.bounds), cfg.parties)
    else:
        raise ConfigError(
            "bounds",
            "a data file needs the declared bounds of every feature column",
            "e.g. --set bounds.age=[0,100] --set bounds.income=[0,2e5]",
        )
    for party, cols in groups.items():
        if cfg.data.key in cols:
            raise ConfigError(
                f"data.columns.{party}",
                f"lists the key column {cfg.data.key!r} as a feature",
                "feature columns only; the key aligns the rows",
            )
    return groups


def _checked_features(
    cfg: VflKmeansConfig, table: pa.Table, features: list[str], lo: np.ndarray, hi: np.ndarray
) -> np.ndarray:
    """The raw feature matrix, once it is clean, within its bounds and large enough for k."""
    require_clean(table, features, numeric=True)
    x_raw = features_of(table, features)
    check_bounds(x_raw, features, lo, hi, cfg.out_of_bounds)
    n = len(x_raw)
    if n < 2:
        raise DataError("data.path", f"the data has {n} row(s)", "a file with 2 or more users")
    if cfg.k > n:
        raise ConfigError("k", f"{cfg.k} clusters for {n} users", f"k <= {n}")
    if cfg.k_prime != "auto" and cfg.k_prime > n:
        raise ConfigError("k_prime", f"{cfg.k_prime} local clusters for {n} users", f"<= {n}")
    return x_raw


def _checked_split(cfg: VflKmeansConfig, parties: int, n: int, m: int, delta: float) -> Split:
    """The budget split, once Lemma 1 applies and the grid of the planned k' fits (the driver
    checks the grid again with the k' of the noisy n̂)."""
    central = cfg.method.startswith("central")
    if parties < 2 and not central:
        raise ConfigError(
            "parties", f"{cfg.method} needs 2 or more parties, got {parties}", "parties >= 2"
        )
    split = split_budget(cfg, parties, delta)
    if ENCODING.get(cfg.method) == "fm" and split.eps2 > 2 * math.log(1 / split.delta2):
        raise ConfigError(
            "epsilon",
            f"ε2 = {split.eps2:.3g} exceeds 2·ln(1/δ2) = {2 * math.log(1 / split.delta2):.3g}: "
            "Lemma 1 does not apply",
            "a smaller ε or a smaller δ",
        )
    if not central:
        k_plan, _ = choose_k_prime(cfg, n, parties, split, delta)
        check_grid(k_plan**parties, cfg.max_grid_cells, k_plan, parties, m)
    return split


def _evaluation(cfg, table, x_raw, lo, hi, label_col, seed) -> dict:
    """The unit-scaled data and the reference labels (from the data, or central k-means) for the
    loss and V-measure: raw data, not private."""
    x = np.clip(to_unit(x_raw, lo, hi), -1.0, 1.0)
    if label_col is not None:
        reference = table.column(label_col).to_numpy(zero_copy_only=False)
    else:
        gen = rng.stream(seed, "clustering", 0, "reference")
        reference = nearest(x, weighted_kmeans(x, np.ones(len(x)), cfg.k, gen))
    return {"x": x, "reference": reference}


def _budget(cfg: VflKmeansConfig, split: Split, parties: int) -> Budget:
    if cfg.method in ("vfl-nonprivate", "central-kmeans"):
        return Budget.none()
    return Budget(cfg.epsilon, split.delta2 * parties)


def _statement(cfg: VflKmeansConfig) -> str:
    if cfg.method in ("vfl-nonprivate", "central-kmeans"):
        return "not private: a non-private baseline"
    if cfg.method.startswith("central"):
        return "central DP: one trusted curator holds every column"
    if cfg.method == "ldp-agg-2pest":
        return (
            "ε2-LDP label reports per party plus DPLSF; replace-one neighbours (every user "
            "sends a report, so n itself is public); sequential over the parties"
        )
    statement = (
        "DP towards the server (Theorem 4): add/remove one user, sequential over the S parties "
        "that each hold part of every record; assumes no party colludes with the server"
    )
    if ENCODING[cfg.method] == "fm":
        statement += (
            ", an ideal hash whose keys the server never sees, and — as the paper's proof "
            "does — that the parties' sketches compose like independent mechanisms, although "
            "they share the hash keys"
        )
    return statement
