"""Options of ``rayfed run hfl-kmeans``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rayfed.clustering import dplloyd
from rayfed.clustering.constrained import ASSIGNMENTS, POSTS
from rayfed.config import DataConfig, option
from rayfed.errors import ConfigError
from rayfed.privacy import check_budget
from rayfed.protocols.base import reconcile_randomness

DATA_INITS = ("data-random", "kmeans++")
INITS = ("sphere-packing", "random", *DATA_INITS)
#: the assignments that bound the cluster sizes (and so read min_size and max_size)
SIZED = {"assignment": ("constrained", "non-exclusive")}


@dataclass(frozen=True)
class HflKmeansConfig:
    """Options of ``rayfed run hfl-kmeans``."""

    aggregation: Literal["nma", "amn"] = option(
        "nma",
        "nma: masked per-cluster sums and counts + DPLloyd noise; amn: masked local centroids + "
        "CDPLloyd noise",
    )
    epsilon: float = option(
        4.0, "total privacy budget ε over all iterations", above=0, when={"noise": ("laplace",)}
    )
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
        1,
        "E: constrained assignment puts a point in at most E clusters",
        at_least=1,
        when={"assignment": ("constrained",)},
    )
    min_size: int | Literal["auto"] = option(
        "auto", "global c_min; auto: ⌈N/(1.5k)⌉", at_least=0, when=SIZED
    )
    max_size: int | Literal["auto"] = option(
        "auto", "global c_max; auto: ⌊3N/k⌋", at_least=1, when=SIZED
    )
    init: Literal[INITS] = option(
        "sphere-packing",
        "sphere-packing or random (uniform in [-1,1]^d), both from the clients' group key; "
        "data-random or kmeans++ (the first client's rows: not private, noise=none only)",
    )
    sum_post: Literal[POSTS] = option(
        "none", "post-processing of the noisy sums (NMA)", when={"aggregation": ("nma",)}
    )
    count_post: Literal[POSTS] = option(
        "none", "post-processing of the noisy counts (NMA)", when={"aggregation": ("nma",)}
    )
    centroid_post: Literal[POSTS] = option(
        "fold",
        "post-processing of the centroids; trunc (and sum_post with count_post trunc) is refused "
        "with the constrained assignment's corrected calibration: it puts two centroids on one "
        "point, where the flow's costs tie",
    )
    iterations: int | Literal["auto"] = option(
        "auto",
        "t_max; auto: the thesis's rule clip(ε/ε^(m), 2, 7) from N (private; with "
        "sensitivity=corrected ε^(m) is scaled to the thesis's MSE under the true Δ of the sums or "
        "centroids) "
        "or 7 (non-private)",
        at_least=1,
    )
    rho: float = option(
        dplloyd.RHO,
        "ρ of the NMA budget split and iteration rule",
        above=0,
        when={"aggregation": ("nma",), "noise": ("laplace",)},
    )
    sensitivity: Literal["corrected", "thesis"] = option(
        "corrected",
        "corrected: noise calibrated to what one point really moves (a size-constrained "
        "assignment re-routes up to k - 1 other points: sums (2k-1)·d·B, AMN centroids k-1 "
        "replacements + 1 addition); thesis: the thesis's Δ^Σ = B·E, Δ^C = E, Δ^μ = B·E/c_min "
        "(one point moves only its own clusters): its noise, with the ε it really buys in the "
        "ledger",
        when={"noise": ("laplace",)},
    )
    masking: Literal["shared-seed", "pairwise", "none"] = option(
        "shared-seed",
        "shared-seed: the thesis's pads from a seed all clients share; pairwise: the padded "
        "uploads go through the one secure sum over the clients (SecAgg pairwise masks, threshold "
        "t = max(2, M/2 + 1), at least M - honest_clients + 1 with split noise, at most M - 1; "
        "any lost client ends the run): a semi-honest server colluding with fewer than t clients "
        "sees no client's upload (M >= 3); none: plaintext uploads (an insecure baseline); on "
        "the ring, shared-seed is the first client's random pad and pairwise the secure sum of "
        "the noisy values, no partial sums (the coordinator relays it and learns the released "
        "sum)",
    )
    threat_model: Literal["semi-honest", "malicious"] = option(
        "semi-honest",
        "the server masking=pairwise's secure sum defends against: semi-honest (follows the "
        "protocol; t as above) or malicious (may lie about who dropped: SecAgg's consistency "
        "round and signed keys, t = M - 1, holding against up to M - 2 colluding clients; "
        "M >= 3)",
        when={"masking": ("pairwise",)},
    )
    topology: Literal["server", "ring"] = option(
        "server",
        "server: the server adds central noise to the padded sum; ring: serverless ring secure "
        "sum, the clients add the noise (ring_noise)",
    )
    ring_noise: Literal["local", "split", "mpc"] = option(
        "local",
        "ring noise: local (§7.3.1: every client adds full noise for its own rows), split "
        "(§7.3.3, with masking=pairwise: the clients add shares of one central noise, DP against "
        "any M - honest_clients of them) or mpc (§7.3.2, with masking=pairwise: the clients "
        "sample one central noise in additive shares with a dealer's Beaver triples; DP unless "
        "all clients collude, or the dealer colludes with one or with the driver)",
        when={"topology": ("ring",), "noise": ("laplace",)},
    )
    honest_clients: int | Literal["majority"] = option(
        "majority",
        "ring_noise=split: h < M, the clients assumed honest; each adds a 1/h share of the "
        "noise (the release carries M/h times the central noise variance); majority: "
        "min(⌊M/2⌋ + 1, M - 1)",
        at_least=1,
        when={"ring_noise": ("split",)},
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
    users: int = option(
        10_000, "synthetic data: number of points N", at_least=1, size=True, source="synthetic"
    )
    dims: int = option(2, "synthetic data: dimension d", at_least=1, size=True, source="synthetic")
    cluster_sd: float = option(
        0.06, "synthetic data: std of each blob per coordinate", above=0, source="synthetic"
    )
    bounds: dict[str, list[float]] | None = option(
        None,
        "data file: feature column -> declared [low, high] (mapped to [-1, 1])",
        source="file",
    )
    out_of_bounds: Literal["error", "clip"] = option(
        "error",
        "a data value outside its declared bounds: error (refused, naming the column), or clip "
        "it to the bounds (counted and stated in the headline)",
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
        if "auto" not in (self.min_size, self.max_size) and self.min_size > self.max_size:
            raise ConfigError("min_size", f"{self.min_size} > max_size = {self.max_size}")
        if self.assignment == "non-exclusive" and self.min_size == 0:
            raise ConfigError("min_size", "non-exclusive clusters of 0 points are empty", ">= 1")
        if self._truncation_ties():
            field, what = (
                ("centroid_post", "centroid_post=trunc clips two centroids to one point")
                if self.centroid_post == "trunc"
                else (
                    "sum_post",
                    "sum_post=trunc with count_post=trunc clips two clusters' sums and counts "
                    "to one centroid",
                )
            )
            raise ConfigError(
                field,
                f"{what} with positive probability; every point then costs nearly the same in "
                "both clusters and the size-constrained assignment's sensitivity (which assumes "
                "the flow's optimum unique) fails on data placed on the tie",
                "fold or none; or assignment=unconstrained; or sensitivity=thesis (its ε not "
                "a guarantee then)",
            )
        if self.init in DATA_INITS and self.noise != "none":
            raise ConfigError(
                "init",
                f"{self.init} picks centroids from a client's rows: not differentially private",
                "sphere-packing or random, or noise=none",
            )
        if self.honest_clients != "majority" and self.honest_clients >= self.clients:
            # every client knows its own share: the others' data must be covered by M - 1 shares
            raise ConfigError(
                "honest_clients",
                f"h = {self.honest_clients} of M = {self.clients} clients: a client that removes "
                "its own share leaves fewer than h shares on the others' data",
                f"1..{self.clients - 1}",
            )
        if self.ring_noise == "split" and self.masking != "pairwise":
            raise ConfigError(
                "masking",
                "ring_noise=split needs each upload hidden: with the first client's pad a "
                "client's two ring neighbours see its upload with only its share of the noise "
                "(masking=pairwise sums the uploads securely, with no partial sums)",
                "pairwise",
            )
        if self.ring_noise == "mpc" and self.masking != "pairwise":
            # an MPC share is uniform, so it would hide the upload, but the ring's pad is the
            # first client's alone; pairwise masks keep the MPC's and the ring's trust the same
            raise ConfigError(
                "masking",
                "ring_noise=mpc runs with pairwise masks (no single client's pad over the ring)",
                "pairwise",
            )

    def _truncation_ties(self) -> bool:
        """A post-processing that maps noisy values to a bound, so that two centroids coincide
        with positive probability, under the constrained assignment's corrected calibration."""
        if self.noise == "none" or self.assignment != "constrained":
            return False
        if self.sensitivity != "corrected":
            return False
        both = self.aggregation == "nma" and self.sum_post == self.count_post == "trunc"
        return self.centroid_post == "trunc" or both


def resolve_randomness(cfg: HflKmeansConfig, randomness: str) -> tuple[HflKmeansConfig, str]:
    """``key_agreement=secure`` makes the run secure; a secure run makes it secure."""
    return reconcile_randomness(cfg, randomness, "key_agreement", upgrade=("seeded",))
