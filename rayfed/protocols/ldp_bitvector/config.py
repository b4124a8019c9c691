"""Options of ``rayfed run ldp-bitvector``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rayfed.config import DataConfig, option
from rayfed.errors import ConfigError
from rayfed.privacy import check_budget

METHODS = ("kcluster", "dbscan", "agglomerative", "kmeans", "adp", "rsp")
BASELINES = ("kmeans", "adp", "rsp")  # run by one trusted party on the raw data, not private
ENCODED = ("kcluster", "dbscan", "agglomerative")  # the custodians encode; the analyst clusters
_ENCODED = {"method": ENCODED}  # the options only these methods read


@dataclass(frozen=True)
class LdpBitvectorConfig:
    """Options of ``rayfed run ldp-bitvector``."""

    method: Literal[METHODS] = option(
        "kcluster", "clustering, or a baseline: " + ", ".join(METHODS)
    )
    encoding: Literal["dpbv", "bv", "exact"] = option(
        "dpbv",
        "dpbv: LDP bit vectors; bv: noise-free bit vectors; exact: true distances",
        when=_ENCODED,
    )
    epsilon: float = option(
        1.0,
        "ε of each bit's randomized response (the paper's ε), in [1e-6, 18]",
        at_least=1e-6,
        at_most=18.0,
        why=(
            "randomized response keeps a bit with probability p = e^ε/(1 + e^ε); the distance "
            "estimates divide by (2p − 1)² ≈ ε²/4, which below ε = 1e-6 leaves them no finite "
            "precision (the clustering failed after the release); above 18 float64 holds 1 − p "
            "too coarsely for the ledger to recover ε to its 1e-9 tolerance, and above about 37 "
            "p rounds to 1 (no noise: the release would be the exact codes)"
        ),
        when=_ENCODED,
    )
    bits: int = option(1000, "s, bits per attribute value", at_least=1, size=True, when=_ENCODED)
    half_width: float = option(
        25.0, "t, the BV interval half-width (on the [L, U] scale)", above=0, when=_ENCODED
    )
    low: float = option(0.0, "L of the encoding range the data is mapped to", when=_ENCODED)
    high: float = option(50.0, "U of the encoding range", when=_ENCODED)
    k: int = option(
        10,
        "clusters (kcluster, agglomerative, the baselines)",
        at_least=1,
        when={"method": tuple(m for m in METHODS if m != "dbscan")},
    )
    restarts: int = option(
        1,
        "kcluster: random starts, the best by the Eq. 17 objective",
        at_least=1,
        when={"method": ("kcluster",)},
    )
    dbscan_eps: float = option(
        3.5,
        "DBSCAN: neighbourhood radius E (on the [L, U] scale)",
        above=0,
        when={"method": ("dbscan",)},
    )
    min_samples: int = option(
        5, "DBSCAN: minimum neighbourhood size", at_least=1, when={"method": ("dbscan",)}
    )
    linkage: Literal["average", "complete", "single"] = option(
        "average", "agglomerative linkage", when={"method": ("agglomerative",)}
    )
    consistence: bool = option(
        False, "apply distance consistence (Algorithm 1) per attribute", when=_ENCODED
    )
    consistence_radius: float = option(
        0.5,
        "Algorithm 1's local-view radius as a fraction of 2t",
        above=0,
        at_most=1,
        when={**_ENCODED, "consistence": (True,)},
    )
    adp_sigma: float = option(
        1.0, "adp: noise sd on the raw data scale", above=0, when={"method": ("adp",)}
    )
    rsp_dims: int = option(32, "rsp: projected dimensions q", at_least=1, when={"method": ("rsp",)})
    partition: Literal["horizontal", "vertical", "vertical-decomposition"] = option(
        "horizontal",
        "custodians hold row blocks (horizontal) or column blocks (vertical: each encodes its "
        "attributes); vertical-decomposition: Alice (the analyst) uses her attributes exactly and "
        "Bob encodes two sums per record pair (Eq. 21–23)",
        when=_ENCODED,
    )
    parties: int = option(
        2,
        "number of data custodians (the decomposition has two: Alice and Bob)",
        at_least=1,
        when={**_ENCODED, "partition": ("horizontal", "vertical")},
    )
    dataset: Literal["digits"] = option(
        "digits", "bundled data when no data.path: scikit-learn's digits"
    )
    records: int | None = option(
        None,
        "bundled data: its first N records (default: all 1,797)",
        at_least=2,
        source="synthetic",
    )
    bounds: list[float] | None = option(
        None, "declared [low, high] of every feature (mapped to [L, U]); digits: [0, 16]"
    )
    out_of_domain: Literal["refuse", "clip"] = option(
        "refuse",
        "a feature value outside the declared bounds is refused, or clipped to them (the count "
        "is stated in the headline and the metrics)",
    )
    label: str | None = option(None, "data file: the true-label column (for NMI)", source="file")
    max_points: int = option(
        40_000, "refuse more records: the n x n distance matrix takes 4n² bytes", at_least=1
    )
    data: DataConfig = field(default_factory=DataConfig, metadata={"help": "data source"})

    def validate(self) -> None:
        check_budget(self.epsilon, 0.0)
        if not self.low < self.high:
            raise ConfigError("high", f"the range needs low < high, got [{self.low}, {self.high}]")
        if self.bounds is not None and (
            len(self.bounds) != 2 or not self.bounds[0] < self.bounds[1]
        ):
            raise ConfigError("bounds", f"must be [low, high] with low < high, got {self.bounds}")
