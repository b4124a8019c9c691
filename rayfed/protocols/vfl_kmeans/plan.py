"""Planning ``vfl-kmeans``: the data (synthetic, or a file with declared bounds) split into the
parties' column blocks, the budget split and a first check of the grid size — before any actor
starts."""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import pyarrow as pa

from rayfed import rng
from rayfed.clustering import fm, nearest, weighted_kmeans
from rayfed.clustering.dplsf import dplsf_releases
from rayfed.clustering.fm_privacy import Calibration, calibrate, evaluate
from rayfed.data import even_groups, load_table, require_clean, sort_by_key, vertical
from rayfed.data.scaling import declared_bounds, features_of, to_unit
from rayfed.errors import ConfigError, DataError
from rayfed.privacy import (
    Budget,
    Clipped,
    DataDomain,
    Declared,
    EpsilonDeltaDpEvent,
    Field,
    Interval,
    KaryResponse,
    Laplace,
    Measurement,
    Neighbours,
    OneHot,
    PrivacyDeclaration,
    Subroutine,
    enforce,
)
from rayfed.protocols.base import Plan
from rayfed.protocols.vfl_kmeans.config import ENCODING, FM_METHODS, VflKmeansConfig
from rayfed.protocols.vfl_kmeans.params import (
    Evaluation,
    Params,
    Releases,
    Split,
    check_grid,
    choose_k_prime,
    public_delta,
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
    table, x_raw, clipped = _checked_features(cfg, table, features, lo, hi)
    n, m = x_raw.shape
    central = cfg.method.startswith("central")
    delta = public_delta(cfg)  # never 1/n: n_p, a function of δ, reaches the server
    if central:
        groups = {CURATOR: list(features)}
    split, k_plan = _checked_split(cfg, len(groups), n, m, delta)
    relation = _relation(cfg)
    releases = _releases(cfg, split, groups, k_plan, relation)
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
            budget=_budget(cfg, split, releases),
            accountant="pure",
            relation=relation,
            composition="sequential",
            statement=_statement(cfg, releases, delta),
            measurements=releases.declared(),
            requested_epsilon=cfg.epsilon if _lemma1(cfg) else None,
            data=DataDomain(
                tuple(
                    Field((c,), Interval(float(lo[j]), float(hi[j])))
                    for j, c in enumerate(features)
                ),
                key=cfg.data.key,
                partition="vertical",  # every party holds its columns of every user
            ),
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
            k_plan=k_plan,
            releases=releases,
            clipped=clipped,
        ),
    )


def _relation(cfg: VflKmeansConfig) -> Neighbours | None:
    """Add/remove one user (all its columns, at every party); LDP-AGG: one user replaced (every
    user sends a report, so n is public)."""
    if cfg.method in ("vfl-nonprivate", "central-kmeans"):
        return None
    return Neighbours(
        "replace_one" if cfg.method == "ldp-agg-2pest" else "add_or_remove_one", "user"
    )


def _lemma1(cfg: VflKmeansConfig) -> bool:
    return cfg.method in FM_METHODS and cfg.sketch_calibration == "lemma1"


def _releases(
    cfg: VflKmeansConfig, split: Split, groups: dict[str, list[str]], k_plan: int, relation
) -> Releases:
    """Every release the run can make, with the sensitivity its domain and the relation give."""
    if relation is None:
        return Releases()
    if cfg.method == "central-dplsf":
        return Releases(
            local={CURATOR: dplsf_releases(cfg.epsilon, len(groups[CURATOR]), relation)}
        )
    local = {
        p: dplsf_releases(split.eps1, len(cols), relation, label=p) for p, cols in groups.items()
    }
    count = None
    if split.eps0 > 0:  # a user adds 1 to the count
        count = Measurement("noisy user count n̂", Laplace(split.eps0), Interval(1.0, 1.0), relation)
    encoding, sketch = ENCODING[cfg.method], None
    if encoding == "fm":
        sketch = _calibration(cfg, split, len(groups))
        sketches = functools.partial(
            fm.dp_sketches,
            keys=cfg.sketches,
            phantoms=sketch.phantoms,
            floor=sketch.floor,
            gamma=cfg.gamma,
        )
        membership = Measurement(
            "FM membership sketches",
            Subroutine(
                sketches,
                EpsilonDeltaDpEvent(sketch.epsilon, sketch.delta),
                for_relation=relation.kind,
            ),
            OneHot(k_plan),
            relation,
            declared=Declared(
                1,
                f"ε′ = {sketch.eps_prime:.4g}: n_p = {sketch.phantoms:,} phantoms, α_min = "
                f"{sketch.floor}, M = {cfg.sketches} keys shared by the {len(groups)} parties. "
                "One user added or removed changes one user's label at every party, whose hash "
                "enters one entry per key at each: all parties' sketches together are "
                f"({sketch.epsilon:.4g}, {sketch.delta:.3g})-DP, the exact per-key privacy loss "
                "of the worst case (the user alone in its cluster at every party) composed over "
                "the M keys",
            ),
            shared=True,  # every party's matrix carries the one charge
        )
    elif encoding == "histogram":  # a user is in one of the k' clusters
        membership = Measurement(
            "noisy cluster sizes", Laplace(split.eps2), OneHot(k_plan), relation
        )
    else:  # each user reports its label (GRR over k') or its hashed label (OLH over g)
        oracle, g, _, _ = fm.ldp_probabilities(split.eps2, k_plan)
        values = g if oracle == "olh" else k_plan
        membership = Measurement(
            f"{oracle.upper()} label reports",
            KaryResponse(values, split.eps2),
            Interval(0.0, float(values - 1)),
            relation,
        )
    return Releases(count, local, membership, sketch)


def _calibration(cfg: VflKmeansConfig, split: Split, parties: int) -> Calibration:
    """The sketches' ε′ and its joint (ε, δ): calibrated to the share (S·ε2, S·δ2), or Lemma 1's
    ε′ with the joint ε its noise actually gives (``sketch_calibration=lemma1``)."""
    share = (parties * split.eps2, parties * split.delta2)
    if not _lemma1(cfg):
        return calibrate(*share, cfg.sketches, parties, cfg.gamma)
    eps_prime = fm.sketch_epsilon(split.eps2, split.delta2, cfg.sketches)
    return evaluate(eps_prime, share[1], cfg.sketches, parties, cfg.gamma)


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
        table = synthetic_table(cfg.users, cfg.dims, cfg.k, cfg.cluster_sd, seed)
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
) -> tuple[pa.Table, np.ndarray, tuple[Clipped, ...]]:
    """(table, raw feature matrix, what was clipped), once the data is clean, within its bounds
    — or clipped to them, counted (``out_of_bounds=clip``) — and large enough for k."""
    require_clean(table, features, numeric=True)
    x_raw = features_of(table, features)
    policy = "clip" if cfg.out_of_bounds == "clip" else "refuse"
    clipped = []
    for j, col in enumerate(features):
        values, report = enforce(
            x_raw[:, j],
            Interval(float(lo[j]), float(hi[j])),
            policy,
            f"bounds.{col}",
            "out_of_bounds",
        )
        if report.count:
            x_raw[:, j] = values
            i = table.schema.get_field_index(col)
            table = table.set_column(i, col, pa.array(values, type=pa.float64()))
            clipped.append(Clipped(col, report.count, report.total, report.domain))
    n = len(x_raw)
    if n < 2:
        raise DataError("data.path", f"the data has {n} row(s)", "a file with 2 or more users")
    if cfg.k > n:
        raise ConfigError("k", f"{cfg.k} clusters for {n} users", f"k <= {n}")
    if cfg.k_prime != "auto" and cfg.k_prime > n:
        raise ConfigError("k_prime", f"{cfg.k_prime} local clusters for {n} users", f"<= {n}")
    return table, x_raw, tuple(clipped)


def _checked_split(
    cfg: VflKmeansConfig, parties: int, n: int, m: int, delta: float | None
) -> tuple[Split, int]:
    """The budget split and the k' planned from n, once the grid of that k' fits (the driver
    checks the grid again with the k' of the noisy n̂) and, for the paper's calibration of the
    sketches, Lemma 1 applies."""
    central = cfg.method.startswith("central")
    if parties < 2 and not central:
        raise ConfigError(
            "parties", f"{cfg.method} needs 2 or more parties, got {parties}", "parties >= 2"
        )
    split = split_budget(cfg, parties, delta)
    if _lemma1(cfg) and split.eps2 > 2 * math.log(1 / split.delta2):
        raise ConfigError(
            "epsilon",
            f"ε2 = {split.eps2:.3g} exceeds 2·ln(1/δ2) = {2 * math.log(1 / split.delta2):.3g}: "
            "Lemma 1 does not apply",
            "a smaller ε or a smaller δ, or sketch_calibration=joint",
        )
    if central:
        return split, 0
    k_plan, _ = choose_k_prime(cfg, n, parties, split, delta)
    check_grid(k_plan**parties, cfg.max_grid_cells, k_plan, parties, m)
    return split, k_plan


def _evaluation(cfg, table, x_raw, lo, hi, label_col, seed) -> Evaluation:
    """The unit-scaled data (as the parties see it: within its bounds, or clipped to them) and the
    reference labels (from the data, or central k-means) for the loss and V-measure: raw data,
    not private."""
    x = to_unit(x_raw, lo, hi)
    if label_col is not None:
        reference = table.column(label_col).to_numpy(zero_copy_only=False)
    else:
        gen = rng.stream(seed, "clustering", 0, "reference")
        reference = nearest(x, weighted_kmeans(x, np.ones(len(x)), cfg.k, gen))
    return Evaluation(x, reference)


def _budget(cfg: VflKmeansConfig, split: Split, releases: Releases) -> Budget:
    """ε0 + S·ε1 + the sketches' joint ε (their share bε/2, or what Lemma 1's noise costs), and
    their δ."""
    if cfg.method in ("vfl-nonprivate", "central-kmeans"):
        return Budget.none()
    sketch = releases.sketch
    if sketch is None:
        return Budget(cfg.epsilon, 0.0)
    if not _lemma1(cfg):
        return Budget(cfg.epsilon, sketch.delta)
    parties = len(releases.local)
    return Budget(split.eps0 + parties * split.eps1 + sketch.epsilon, sketch.delta)


def _statement(cfg: VflKmeansConfig, releases: Releases, delta: float | None) -> str:
    if cfg.method in ("vfl-nonprivate", "central-kmeans"):
        return "not private: a non-private baseline"
    if cfg.method.startswith("central"):
        return "central DP: one trusted curator holds every column"
    if cfg.method == "ldp-agg-2pest":
        return (
            "ε2-LDP label reports per party plus DPLSF (every user sends a report, so n itself "
            "is public); sequential over the parties"
        )
    statement = (
        "DP towards the server (Theorem 4): sequential over the S parties that each hold part of "
        "every record; assumes no party colludes with the server"
    )
    if ENCODING[cfg.method] == "fm":
        sketch = releases.sketch
        statement += (
            "; the parties' FM sketches are one release (every party hashes a user with the same "
            f"keys): jointly ({sketch.epsilon:.4g}, {sketch.delta:.3g})-DP, from the exact "
            "per-key privacy loss of the worst case (the user alone in its cluster at every "
            "party) composed over the M keys — assuming an ideal keyed hash whose keys the "
            "server never sees"
        )
        if _lemma1(cfg):
            statement += " (the paper's Lemma 1 noise, which the paper charges as less)"
        source = "given" if cfg.delta is not None else "1/users, the synthetic data's declared size"
        statement += (
            f"; δ = {delta:.4g} is public ({source}), as are ε, M, γ and the phantom count "
            f"n_p = {sketch.phantoms:,} and floor α_min = {sketch.floor} set from them: none is "
            "read from the data, and n reaches the server only as n̂"
        )
    return statement
