"""Options of ``rayfed run vfl-kmeans``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rayfed.clustering import fm
from rayfed.clustering.dplsf import LEAF_THRESHOLDS
from rayfed.config import DataConfig, option
from rayfed.errors import ConfigError
from rayfed.privacy import check_budget
from rayfed.protocols.base import check_party_split, reconcile_randomness

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
FM_METHODS = tuple(m for m, e in ENCODING.items() if e == "fm")
#: the methods that run DPLSF (the parties' local clustering, or the curator's)
DPLSF_METHODS = (*(m for m in ENCODING if m != "vfl-nonprivate"), "central-dplsf")


@dataclass(frozen=True)
class VflKmeansConfig:
    """Options of ``rayfed run vfl-kmeans``."""

    method: Literal[METHODS] = option("dpfmps-2pest", "protocol or baseline: " + ", ".join(METHODS))
    epsilon: float = option(
        1.0,
        "total privacy budget ε over all parties and phases, at most 500",
        above=0,
        at_most=500.0,
        why=(
            "the FM sketches' phantom count 1/(e^ε′ − 1) and the LDP oracles' probabilities are "
            "computed from e^ε, which overflows float64 past ε ≈ 709"
        ),
    )
    delta: float | None = option(
        None,
        "total δ (FM sketches only), public: the server is sent the phantom count it sets. "
        "Default 1/users (synthetic data: its declared size, as the paper's δ = 1/n); a data "
        "file needs it given (1/n counted from the file would tell the server n)",
        at_least=0,
        below=1,
        when={"method": FM_METHODS},
    )
    k: int = option(5, "number of final clusters", at_least=1)
    k_prime: int | Literal["auto"] = option(
        "auto",
        "local clusters per party; auto: Table 5.1 / the noise-vs-signal rule (§2.10)",
        at_least=2,
        # vfl-nonprivate uses k' = k (Ding et al.)
        when={"method": tuple(m for m in METHODS if m != "vfl-nonprivate")},
    )
    k_prime_rule: Literal["table", "formula"] = option(
        "table",
        "auto k': the thesis's Table 5.1 where it has the (n, S, ε) cell, else the formula; "
        "formula: always the paper's rule",
    )
    sketches: int = option(
        4096, "M, the number of FM hash keys (sketch rows)", at_least=1, size=True
    )
    gamma: float = option(
        1.0,
        "γ of the geometric hash Geometric(γ/(1+γ)), in [0.1, 100] (the paper's is 1)",
        at_least=0.1,
        at_most=100.0,
        why=(
            "the sketches' values and the joint calibration's privacy-loss grid grow as 1/γ "
            "(γ = 1e-9 asked for 309 GiB; for a sketch share ε = 0.49, δ = 1e-6, M = 4096, S = 2 "
            "it takes about 5 s at γ = 0.1, the spec's smallest, and 16-26 s at γ = 0.05), and "
            "above 100 nearly every hashed value is 1, so the sketches cannot count"
        ),
    )
    estimator: Literal[fm.ESTIMATORS] = option(
        "corrected",
        "FM cardinality estimator: corrected (bias-corrected harmonic mean); literal (the paper's "
        "formula, biased x1.5-2.2: shown for comparison only)",
    )
    sketch_calibration: Literal["joint", "lemma1"] = option(
        "joint",
        "FM sketches' ε′: joint (the fewest phantoms that keep all parties' sketches together "
        "within their share (bε/2, δ) — they share the hash keys); lemma1 (the paper's "
        "ε′ = ε2/(4·sqrt(M·ln 1/δ2)), which composes the parties as independent: the run charges "
        "and reports the true joint ε of that noise, above the ε requested)",
        when={"method": FM_METHODS},
    )
    count_fraction: float = option(
        0.02, "1 - b: share of ε spent on the noisy user count n̂", above=0, below=1
    )
    projection: Literal[fm.PROJECTIONS] = option(
        "simplex",
        "make the grid weights >= 0 and sum to n̂ (Alg. 4 line 13): simplex (Euclidean projection: "
        "removes the noise of empty cells) or clip (clip at 0 and rescale: the spec's suggestion)",
    )
    leaf_threshold: Literal[LEAF_THRESHOLDS] = option(
        "coordinate",
        "DPLSF's leaf size θ = 10·√m·σ: σ, the sum noise's std, per coordinate (the spec's "
        "reading; fewer, less noisy leaves: lower loss) or per radius √m as Google's library "
        "(√m times lower θ: closer to the paper's central DPLSF numbers)",
        when={"method": DPLSF_METHODS},
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
    users: int = option(
        20_000, "synthetic data: number of users n", at_least=2, size=True, source="synthetic"
    )
    dims: int = option(
        8, "synthetic data: number of attributes m", at_least=1, size=True, source="synthetic"
    )
    cluster_sd: float = option(
        0.1,
        "synthetic data: std of each Gaussian component per coordinate",
        above=0,
        source="synthetic",
    )
    bounds: dict[str, list[float]] | None = option(
        None,
        "data file: declared [low, high] of every feature column (mapped to [-1, 1])",
        source="file",
    )
    out_of_bounds: Literal["error", "refuse", "clip"] = option(
        "error",
        "a data value outside its declared bounds: error (refuse: the same) stops the run naming "
        "the column; clip clips it to the bounds, counted in the headline and the metrics",
    )
    label: str | None = option(
        None,
        "data file: reference label column for the V-measure (default: central k-means labels)",
        source="file",
    )
    evaluate: bool = option(
        True, "add loss, V-measure and intersection error (computed from the raw data: not private)"
    )
    data: DataConfig = field(default_factory=DataConfig, metadata={"help": "data source"})

    def validate(self) -> None:
        check_budget(self.epsilon, 0.0 if self.delta is None else self.delta)
        if self.delta == 0 and self.method in FM_METHODS:
            raise ConfigError("delta", "FM sketches need δ > 0", "e.g. 1/users (the default)")
        if self.delta is None and self.method in FM_METHODS and self.data.path is not None:
            raise ConfigError(
                "delta",
                f"{self.method} with a data file needs a public δ for its FM sketches: the server "
                "is sent their phantom count, a function of δ, so δ = 1/n counted from the file "
                "would tell it n (which the add/remove-one guarantee protects)",
                "delta=1/N for a public bound N on the number of users (e.g. --set delta=1e-6)",
            )
        check_party_split(self)


def resolve_randomness(cfg: VflKmeansConfig, randomness: str) -> tuple[VflKmeansConfig, str]:
    """``key_agreement=secure`` makes the run secure; a secure run makes it secure."""
    return reconcile_randomness(cfg, randomness, "key_agreement", upgrade=("seeded",))
