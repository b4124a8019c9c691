"""DP vertical federated k-means with Flajolet–Martin membership sketches — DPFMPS of Li, Wang &
Li, "Differentially Private Vertical Federated Clustering" (VLDB'23), and its baselines
(spec: shared/specs/vfl-kmeans.md).

S parties hold column blocks of the same n users (rows aligned by key); the untrusted server is the
coordinator. One round: the parties agree on secret hash keys among themselves (X25519 + AES-GCM,
the server relays only ciphertexts); one random party sends n̂ = n + Lap(1/ε0); every party runs
DPLSF on its columns (ε1), assigns its users to the nearest local center, and sends its local
centers and an M x k' matrix of DP FM sketches of the clusters ((ε2, δ2)); the server weighs the
k'^S grid of concatenated local centers (BasicEst or 2PEst) and runs weighted k-means on it.

``method`` picks the membership encoding and weight estimator; the baselines share everything else:

=================  =============================================  ===============================
method             what the parties send                          weights / privacy
=================  =============================================  ===============================
dpfmps-2pest       DPLSF centers + FM sketches                    2PEst; (ε, δ)
dpfmps-basic       DPLSF centers + FM sketches                    BasicEst; (ε, δ)
ind-lap            DPLSF centers + Laplace cluster sizes          independence; ε
ldp-agg-2pest      DPLSF centers + per-user GRR/OLH labels        P⁻¹ pair tables + 2PEst; ε
vfl-nonprivate     k-means centers (k' = k) + exact labels        exact; not private
central-dplsf      one curator with every column: DPLSF           ε
central-kmeans     one curator with every column: k-means         not private
=================  =============================================  ===============================

The step functions each role runs are in :mod:`rayfed.protocols.vfl_kmeans_steps`.

Privacy (Theorem 4): sequential over the parties, ε0 + S(ε1 + ε2) = ε and S·δ2 = δ, under
add/remove-one-user neighbours, assuming an ideal hash with keys the server does not know and no
party colluding with the server. The ledger records Lemma 1's (ε2, δ2) per sketch message; the
result also states the tighter zCDP bound for the same noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from rayfed import rng
from rayfed.clustering import fm, nearest, normalised_loss, v_measure, weighted_kmeans
from rayfed.clustering.dplsf import dplsf_event
from rayfed.config import DataConfig, option
from rayfed.data import even_groups, load_table, require_clean, sort_by_key, vertical
from rayfed.data.scaling import check_bounds, declared_bounds, features_of, from_unit, to_unit
from rayfed.errors import ConfigError, DataError
from rayfed.federation import PerMember
from rayfed.privacy import (
    Budget,
    EpsilonDeltaDpEvent,
    check_budget,
    kary_rr_event,
    laplace_event,
)
from rayfed.protocols.base import Outcome, Plan, Protocol, reconcile_randomness, reject_inapplicable
from rayfed.protocols.key_agreement import agree_group_key
from rayfed.protocols.vfl_kmeans_steps import (
    count_step,
    curator_step,
    fm_step,
    histogram_step,
    labels_step,
    ldp_step,
    local_cluster_step,
    random_split,
    server_step,
    synthetic_table,
)

METHODS = (
    "dpfmps-2pest",
    "dpfmps-basic",
    "ind-lap",
    "ldp-agg-2pest",
    "vfl-nonprivate",
    "central-dplsf",
    "central-kmeans",
)
#: membership encoding of each VFL method (the central methods have none)
ENCODING = {
    "dpfmps-2pest": "fm",
    "dpfmps-basic": "fm",
    "ind-lap": "histogram",
    "ldp-agg-2pest": "ldp",
    "vfl-nonprivate": "labels",
}
CURATOR = "curator"

#: Table 5.1 of the thesis: automatically chosen k' by (n, S), for ε = 0.5, 1, 2, 3, 4.
K_PRIME_TABLE = {
    (20000, 2): (4, 5, 5, 6, 6),
    (60000, 2): (5, 6, 6, 7, 7),
    (100000, 2): (6, 6, 7, 7, 7),
    (20000, 4): (4, 4, 5, 5, 5),
    (60000, 4): (4, 5, 6, 6, 6),
    (100000, 4): (5, 6, 6, 7, 7),
}
K_PRIME_TABLE_EPS = (0.5, 1.0, 2.0, 3.0, 4.0)
RHO_LANG = 0.649  # the FM estimator's relative sd constant the paper takes from Lang (2017)


@dataclass(frozen=True)
class VflKmeansConfig:
    """Options of ``rayfed run vfl-kmeans``."""

    method: Literal[METHODS] = option("dpfmps-2pest", "protocol or baseline: " + ", ".join(METHODS))
    epsilon: float = option(1.0, "total privacy budget ε over all parties and phases", above=0)
    delta: float | None = option(
        None, "total δ (FM sketches only); default 1/n as the paper", at_least=0, below=1
    )
    k: int = option(5, "number of final clusters", at_least=1)
    k_prime: int | Literal["auto"] = option(
        "auto",
        "local clusters per party; auto: Table 5.1 / the noise-vs-signal rule (§2.10)",
        at_least=2,
    )
    k_prime_rule: Literal["table", "formula"] = option(
        "table",
        "auto k': the thesis's Table 5.1 where it has the (n, S, ε) cell, else the formula; "
        "formula: always the paper's rule",
    )
    sketches: int = option(
        4096, "M, the number of FM hash keys (sketch rows)", at_least=1, size=True
    )
    gamma: float = option(1.0, "γ of the geometric hash Geometric(γ/(1+γ))", above=0)
    estimator: Literal[fm.ESTIMATORS] = option(
        "corrected",
        "FM cardinality estimator: corrected (bias-corrected harmonic mean); literal (the paper's "
        "formula, biased x1.5-2.2: shown for comparison only)",
    )
    count_fraction: float = option(
        0.02, "1 - b: share of ε spent on the noisy user count n̂", above=0, below=1
    )
    projection: Literal[fm.PROJECTIONS] = option(
        "simplex",
        "make the grid weights >= 0 and sum to n̂ (Alg. 4 line 13): simplex (Euclidean projection: "
        "removes the noise of empty cells) or clip (clip at 0 and rescale: the spec's suggestion)",
    )
    iterations: int = option(3000, "2PEst: at most this many pair updates", at_least=1)
    tolerance: float = option(
        1.0, "2PEst: stop when every pair table is matched within this", at_least=0
    )
    key_agreement: Literal["seeded", "secure"] = option(
        "seeded",
        "key agreement randomness: seeded (from the run seed, a simulation) or secure (OS "
        "randomness: makes the run randomness=secure, and a secure run sets it)",
    )
    max_grid_cells: int = option(
        1_000_000,
        "refuse a grid of more than this many cells k'^S (each cell costs 8·m bytes)",
        at_least=1,
    )
    parties: int = option(
        2, "number of parties S (synthetic data, or to deal a file's columns)", at_least=1
    )
    users: int = option(20_000, "synthetic data: number of users n", at_least=2, size=True)
    dims: int = option(8, "synthetic data: number of attributes m", at_least=1, size=True)
    spread: float = option(
        0.1, "synthetic data: std of each Gaussian component per coordinate", above=0
    )
    bounds: dict[str, list[float]] | None = option(
        None, "data file: declared [low, high] of every feature column (mapped to [-1, 1])"
    )
    out_of_bounds: Literal["error", "clip"] = option(
        "error", "a data value outside its declared bounds: error, or clip it to the bounds"
    )
    label: str | None = option(
        None,
        "data file: reference label column for the V-measure (default: central k-means labels)",
    )
    evaluate: bool = option(
        True, "add loss, V-measure and intersection error (computed from the raw data: not private)"
    )
    data: DataConfig = field(default_factory=DataConfig, metadata={"help": "data source"})

    def validate(self) -> None:
        check_budget(self.epsilon, 0.0 if self.delta is None else self.delta)
        if self.delta == 0 and ENCODING.get(self.method) == "fm":
            raise ConfigError("delta", "FM sketches need δ > 0", "e.g. 1/n (the default)")
        if self.delta is not None and ENCODING.get(self.method) != "fm":
            raise ConfigError(
                "delta",
                f"method {self.method} is pure ε-DP and uses no δ",
                "drop delta, or a dpfmps method",
            )
        if self.k_prime != "auto" and self.method == "vfl-nonprivate":
            raise ConfigError("k_prime", "vfl-nonprivate uses k' = k (Ding et al.)", "drop k_prime")


# --- budget and k' (public arithmetic) -----------------------------------------------------------
@dataclass(frozen=True)
class Split:
    """The budget split of Alg. 1: n̂ query, each party's LocCluster and MemEnc."""

    eps0: float
    eps1: float
    eps2: float
    delta2: float


def split_budget(cfg: VflKmeansConfig, parties: int, delta: float) -> Split:
    """ε0 = (1-b)ε, ε1 = ε2 = bε/2S, δ2 = δ/S (LDP-AGG: ε0 = 0; central: ε1 = ε)."""
    eps = cfg.epsilon
    if cfg.method == "vfl-nonprivate":
        return Split(0.0, 0.0, 0.0, 0.0)
    if cfg.method.startswith("central"):
        return Split(0.0, eps, 0.0, 0.0)
    if cfg.method == "ldp-agg-2pest":
        return Split(0.0, eps / (2 * parties), eps / (2 * parties), 0.0)
    rest = (1.0 - cfg.count_fraction) * eps
    fm_delta = delta / parties if ENCODING[cfg.method] == "fm" else 0.0
    return Split(cfg.count_fraction * eps, rest / (2 * parties), rest / (2 * parties), fm_delta)


def k_prime_formula(
    n_hat: float, k: int, parties: int, eps2: float, delta: float, m: int, rho: float = RHO_LANG
) -> int:
    """§2.10: k' = max(k0, ⌈k^{1/S}⌉), k0 the smallest integer with 2σ >= n̂/k0²,
    σ = ρ(n̂ - n̂/k0²)/√M + 4ρ·s·(k0-1)·sqrt(ln 1/δ)/ε2, s = 2."""
    floor = math.ceil(k ** (1.0 / parties) - 1e-9)
    for k0 in range(1, 10_000):
        sigma = (
            rho * (n_hat - n_hat / k0**2) / math.sqrt(m)
            + 4 * rho * 2 * (k0 - 1) * math.sqrt(math.log(1.0 / delta)) / eps2
        )
        if 2 * sigma >= n_hat / k0**2:
            return max(k0, floor)
    return max(10_000, floor)


def k_prime_from_table(n_hat: float, parties: int, epsilon: float) -> int | None:
    """Table 5.1's k' for the row within 2 % of n̂, or None if the table has no such cell."""
    for (n, s), row in K_PRIME_TABLE.items():
        if s == parties and abs(n_hat - n) <= 0.02 * n:
            for eps, kp in zip(K_PRIME_TABLE_EPS, row, strict=True):
                if math.isclose(epsilon, eps):
                    return kp
    return None


def choose_k_prime(
    cfg: VflKmeansConfig, n_hat: float, parties: int, split: Split, delta: float
) -> tuple[int, str]:
    """(k', how it was chosen)."""
    if cfg.method == "vfl-nonprivate":
        return cfg.k, "k' = k (non-private VFL)"
    if cfg.k_prime != "auto":
        return int(cfg.k_prime), "given"
    if cfg.k_prime_rule == "table":
        kp = k_prime_from_table(n_hat, parties, cfg.epsilon)
        if kp is not None:
            return kp, "Table 5.1"
    kp = max(2, k_prime_formula(n_hat, cfg.k, parties, split.eps2, delta, cfg.sketches))
    return kp, "formula (§2.10)"


# --- the protocol ----------------------------------------------------------------------------------
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
    grouped = {c for cols in groups.values() for c in cols}
    features = [c for c in table.column_names if c in grouped]
    lo, hi = declared_bounds(cfg.bounds, features)
    if cfg.label is not None and cfg.label not in table.column_names:
        raise DataError("label", f"column {cfg.label!r} is not in the data", table.column_names)
    return table, features, groups, lo, hi, cfg.label


def _check_grid(cells: int, limit: int, k_prime: int, parties: int, m: int) -> None:
    if cells > limit:
        raise ConfigError(
            "k_prime",
            f"the grid has k'^S = {k_prime}^{parties} = {cells:,} cells, above max_grid_cells="
            f"{limit:,} (the server holds {cells * m * 8 / 2**20:,.0f} MiB of grid points and "
            "runs k-means on them)",
            "a smaller k', fewer parties, or raise max_grid_cells",
        )


class VflKmeans(Protocol):
    name = "vfl-kmeans"
    summary = "DP vertical federated k-means with Flajolet–Martin sketches (DPFMPS) and baselines"
    Config = VflKmeansConfig
    examples = (
        {"users": 2000, "sketches": 256},
        {"users": 2000, "method": "ind-lap"},
        {"users": 2000, "method": "ldp-agg-2pest"},
        {"users": 2000, "method": "central-dplsf"},
    )

    def data_bytes(self, cfg: VflKmeansConfig) -> int:
        """The synthetic table and each party's unit-scaled copy, labels, and M sketch rows of up
        to 64 local clusters per party (the grid is bounded by max_grid_cells)."""
        if cfg.data.path is not None:
            return 0
        return cfg.users * (cfg.dims * 32 + cfg.parties * 16) + cfg.sketches * cfg.parties * 512

    def resolve_randomness(self, cfg: VflKmeansConfig, randomness: str):
        """``key_agreement=secure`` makes the run secure; a secure run makes it secure."""
        return reconcile_randomness(cfg, randomness, "key_agreement", upgrade=("seeded",))

    def plan(self, cfg: VflKmeansConfig, seed: int) -> Plan:
        reject_inapplicable(cfg, ["bounds", "label"], ["users", "dims", "spread"])
        table, features, groups, lo, hi, label_col = _load(cfg, seed)
        require_clean(table, features, numeric=True)
        x_raw = features_of(table, features)
        check_bounds(x_raw, features, lo, hi, cfg.out_of_bounds)
        n, m = x_raw.shape
        if n < 2:
            raise DataError("data.path", f"the data has {n} row(s)", "a file with 2 or more users")
        if cfg.k > n:
            raise ConfigError("k", f"{cfg.k} clusters for {n} users", f"k <= {n}")
        if cfg.k_prime != "auto" and cfg.k_prime > n:
            raise ConfigError("k_prime", f"{cfg.k_prime} local clusters for {n} users", f"<= {n}")
        central = cfg.method.startswith("central")
        delta = 1.0 / n if cfg.delta is None else cfg.delta
        if central:
            groups = {CURATOR: list(features)}
        parties_n = len(groups)
        if parties_n < 2 and not central:
            raise ConfigError(
                "parties", f"{cfg.method} needs 2 or more parties, got {parties_n}", "parties >= 2"
            )
        split = split_budget(cfg, parties_n, delta)
        if ENCODING.get(cfg.method) == "fm" and split.eps2 > 2 * math.log(1 / split.delta2):
            raise ConfigError(
                "epsilon",
                f"ε2 = {split.eps2:.3g} exceeds 2·ln(1/δ2) = {2 * math.log(1 / split.delta2):.3g}: "
                "Lemma 1 does not apply",
                "a smaller ε or a smaller δ",
            )
        if not central:
            k_plan, _ = choose_k_prime(cfg, n, parties_n, split, delta)
            _check_grid(k_plan**parties_n, cfg.max_grid_cells, k_plan, parties_n, m)
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
        evaluation = None
        if cfg.evaluate:
            x = np.clip(to_unit(x_raw, lo, hi), -1.0, 1.0)
            if label_col is not None:
                reference = table.column(label_col).to_numpy(zero_copy_only=False)
            else:
                gen = rng.stream(seed, "clustering", 0, "reference")
                reference = nearest(x, weighted_kmeans(x, np.ones(n), cfg.k, gen))
            evaluation = {"x": x, "reference": reference}
        return Plan(
            budget=self._budget(cfg, split, parties_n),
            ledger=dict(
                accountant="pure",
                relation="replace_one" if cfg.method == "ldp-agg-2pest" else "add_or_remove_one",
                composition="sequential",
                statement=self._statement(cfg),
            ),
            parties=parties,
            rounds=1 if central else 3,
            evaluation=evaluation,
            info={
                "order": list(groups),
                "positions": [[index[c] for c in groups[p]] for p in groups],
                "features": features,
                "lo": lo,
                "hi": hi,
                "users": n,
                "delta": delta,
                "split": split,
            },
        )

    @staticmethod
    def _budget(cfg: VflKmeansConfig, split: Split, parties: int) -> Budget:
        if cfg.method in ("vfl-nonprivate", "central-kmeans"):
            return Budget.none()
        return Budget(cfg.epsilon, split.delta2 * parties)

    @staticmethod
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

    def drive(self, fed, cfg: VflKmeansConfig, plan: Plan) -> Outcome:
        if cfg.method.startswith("central"):
            return self._drive_central(fed, cfg, plan)
        info, split = plan.info, plan.info["split"]
        order, encoding = info["order"], ENCODING[cfg.method]
        if encoding == "fm":
            with fed.round(0):
                self._agree_keys(fed, cfg, order)
        with fed.round(1):
            n_hat = self._count(fed, cfg, split, order)
            k_prime, rule = choose_k_prime(cfg, n_hat, len(order), split, info["delta"])
            m = len(info["features"])
            _check_grid(k_prime ** len(order), cfg.max_grid_cells, k_prime, len(order), m)
        with fed.round(2):
            private = cfg.method != "vfl-nonprivate"
            replace_one = cfg.method == "ldp-agg-2pest"
            if private:
                fed.charge(
                    [
                        (
                            p,
                            "DPLSF local clustering",
                            dplsf_event(split.eps1, len(pos), replace_one=replace_one),
                        )
                        for p, pos in zip(order, info["positions"], strict=True)
                    ]
                )
            centers = fed.parties.run(
                local_cluster_step,
                k=k_prime,
                epsilon=split.eps1 if private else None,
                replace_one=replace_one,
                round=2,
                phase="local-clustering",
            )
            memberships = self._encode(fed, cfg, encoding, split, order, k_prime)
            out = fed.one(
                fed.coordinator.run(
                    server_step,
                    centers,
                    memberships,
                    order=order,
                    positions=info["positions"],
                    n_hat=n_hat,
                    k=cfg.k,
                    k_prime=k_prime,
                    encoding=encoding,
                    cfg=self._server_cfg(cfg, split),
                    round=2,
                    phase="server",
                )
            )
        self._notes(fed, cfg, plan, k_prime, rule)
        return self._outcome(cfg, plan, out, n_hat, k_prime, rule)

    # --- driver pieces ----------------------------------------------------------------------------
    @staticmethod
    def _agree_keys(fed, cfg: VflKmeansConfig, order: list[str]) -> None:
        agree_group_key(fed, order, purpose="hash-key", slot="hash_key")

    @staticmethod
    def _count(fed, cfg: VflKmeansConfig, split: Split, order: list[str]) -> float:
        """n̂ from one party chosen at random by the server (exact n where n is public anyway)."""
        chosen = order[int(rng.stream(fed.seed, "sample", 1, "n-hat-party").integers(len(order)))]
        if split.eps0 > 0:
            fed.charge([(chosen, "noisy user count n̂", laplace_event(1, split.eps0))])
        reply = fed.parties.run(
            count_step,
            epsilon0=split.eps0 if split.eps0 > 0 else None,
            members=[chosen],
            phase="user-count",
        )
        return max(1.0, float(round(fed.one(reply))))

    @staticmethod
    def _encode(fed, cfg, encoding: str, split: Split, order: list[str], k_prime: int):
        if encoding == "fm":
            event = EpsilonDeltaDpEvent(split.eps2, split.delta2)
            fed.charge([(p, "FM membership sketches", event) for p in order])
            return fed.parties.run(
                fm_step,
                k=k_prime,
                m=cfg.sketches,
                gamma=cfg.gamma,
                eps2=split.eps2,
                delta2=split.delta2,
                round=2,
                phase="membership",
            )
        if encoding == "histogram":
            event = laplace_event(1, split.eps2)
            fed.charge([(p, "noisy cluster sizes", event) for p in order])
            return fed.parties.run(
                histogram_step, k=k_prime, eps2=split.eps2, round=2, phase="membership"
            )
        if encoding == "ldp":
            oracle, g, _, _ = fm.ldp_probabilities(split.eps2, k_prime)
            event = kary_rr_event(g if oracle == "olh" else k_prime, split.eps2)
            fed.charge([(p, f"{oracle.upper()} label reports", event) for p in order])
            return fed.parties.run(
                ldp_step,
                k=k_prime,
                eps2=split.eps2,
                party=PerMember({p: j for j, p in enumerate(order)}),
                round=2,
                phase="membership",
            )
        return fed.parties.run(labels_step, phase="membership")

    @staticmethod
    def _server_cfg(cfg: VflKmeansConfig, split: Split) -> dict:
        """The public parameters the server needs (not δ: the default δ = 1/n would tell it n)."""
        phantoms = None
        if ENCODING[cfg.method] == "fm":
            phantoms = fm.phantom_count(fm.sketch_epsilon(split.eps2, split.delta2, cfg.sketches))
        return {
            "method": cfg.method,
            "eps2": split.eps2,
            "phantoms": phantoms,
            "gamma": cfg.gamma,
            "estimator": cfg.estimator,
            "iterations": cfg.iterations,
            "tolerance": cfg.tolerance,
            "projection": cfg.projection,
        }

    def _drive_central(self, fed, cfg: VflKmeansConfig, plan: Plan) -> Outcome:
        private = cfg.method == "central-dplsf"
        with fed.round(0):
            if private:
                fed.charge(
                    [(CURATOR, "DPLSF", dplsf_event(cfg.epsilon, len(plan.info["features"])))]
                )
            reply = fed.parties.run(
                curator_step, k=cfg.k, epsilon=cfg.epsilon if private else None, phase="central"
            )
            centers = np.asarray(fed.one(reply))
        if private:
            fed.note("central DP: one trusted curator holds every column (a comparator, not VFL)")
        out = {"centers": centers, "weights": None, "local": [], "iterations": 0}
        return self._outcome(cfg, plan, out, float(plan.info["users"]), cfg.k, "central")

    @staticmethod
    def _notes(fed, cfg: VflKmeansConfig, plan: Plan, k_prime: int, rule: str) -> None:
        split, n = plan.info["split"], plan.info["users"]
        s = len(plan.info["order"])
        if ENCODING[cfg.method] == "fm":
            eps_prime = fm.sketch_epsilon(split.eps2, split.delta2, cfg.sketches)
            tight = fm.tight_epsilon(eps_prime, cfg.sketches, split.delta2)
            fed.note(
                f"FM sketches: ε'={eps_prime:.3g} per key, n_p={fm.phantom_count(eps_prime)} "
                f"phantoms; Lemma 1 charges (ε2={split.eps2:.4g}, δ2={split.delta2:.3g}) per party. "
                f"One party's M keys are also ({tight:.4g}, δ2)-DP by zCDP composition (Lemma 1 is "
                "loose); the ledger keeps Lemma 1's account, and composing the parties assumes "
                "their sketches are independent although they share the keys (as the paper does)"
            )
            fed.note(
                "the sketches' guarantee assumes an ideal hash whose keys the server never sees: "
                "AES-256 under the parties' group key (X25519 + AES-GCM key transport) stands in"
            )
            if cfg.estimator == "literal":
                fed.note(
                    "estimator=literal: the paper's FM estimator overestimates by x1.5-2.2 "
                    "(spec §2.8); the grid weights collapse towards independence"
                )
        if cfg.method == "vfl-nonprivate":
            fed.note("not private: every user's local label reaches the server")
        if cfg.delta is None and ENCODING[cfg.method] == "fm":
            fed.note(
                f"δ = 1/n = {1 / n:.3g}, the paper's setting: it treats the data size n as public; "
                "give delta explicitly to keep n private (the server is sent n_p, not δ)"
            )
        fed.note(f"k' = {k_prime} ({rule}); {s} parties, grid of {k_prime**s:,} cells")
        if plan.evaluation is not None:
            fed.note("loss, V-measure and intersection error use the raw data: not private")

    @staticmethod
    def _outcome(cfg, plan: Plan, out: dict, n_hat: float, k_prime: int, rule: str) -> Outcome:
        info = plan.info
        centers = np.asarray(out["centers"])
        lo, hi = info["lo"], info["hi"]
        data_centers = from_unit(centers, lo, hi)
        tables = {
            "centers": pa.table(
                {"cluster": np.arange(len(centers))}
                | {c: data_centers[:, j] for j, c in enumerate(info["features"])}
            )
        }
        s = len(info["order"])
        metrics: dict[str, Any] = {
            "method": cfg.method,
            "users": info["users"],
            "parties": s,
            "k": cfg.k,
            "k_prime": k_prime,
            "k_prime_rule": rule,
            "n_hat": n_hat,
            "epsilon0": info["split"].eps0,
            "epsilon1": info["split"].eps1,
            "epsilon2": info["split"].eps2,
            "delta2": info["split"].delta2,
            "iterations_2pest": out["iterations"],
        }
        grid_cols: dict[str, Any] = {}
        if out["weights"] is not None:
            w = np.asarray(out["weights"])
            index = np.indices(w.shape).reshape(w.ndim, -1)
            grid_cols = {p: index[j] for j, p in enumerate(info["order"])}
            grid_cols["weight"] = w.reshape(-1)
        headline = f"{cfg.method}: {cfg.k} centers from {s} part{'ies' if s > 1 else 'y'} x {info['users']:,} users"
        if plan.evaluation is not None:
            x, reference = plan.evaluation["x"], plan.evaluation["reference"]
            metrics["loss"] = normalised_loss(x, centers)
            metrics["v_measure"] = v_measure(reference, x, centers)
            if out["weights"] is not None:
                labels = [
                    nearest(x[:, pos], c)
                    for pos, c in zip(info["positions"], out["local"], strict=True)
                ]
                true = fm.exact_grid(labels, k_prime)
                grid_cols["true_weight"] = true.reshape(-1)
                metrics["intersection_error"] = float(np.abs(w - true).sum() / info["users"])
            headline += f"; loss {metrics['loss']:.4f}, V-measure {metrics['v_measure']:.3f}"
        if grid_cols:
            tables["grid"] = pa.table(grid_cols)
        if k_prime and out["weights"] is not None:
            headline += f" (k'={k_prime})"
        return Outcome(tables=tables, metrics=metrics, headline=headline)
