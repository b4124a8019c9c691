"""Everything ``ldp-bitvector`` resolves at planning time, handed to the driver."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rayfed.privacy import Clipped, Measurement


@dataclass(frozen=True)
class Clustering:
    """How the collector clusters its distance matrix: the method and that method's options."""

    method: str
    k: int
    restarts: int
    dbscan_eps: float
    min_samples: int
    linkage: str


@dataclass(frozen=True)
class Evaluation:
    """Ground truth (a labelled data set): every record's true label, for the clustering's
    scores. Not private; never sent to an actor."""

    labels: np.ndarray


@dataclass(frozen=True)
class Params:
    """The custodians in order (the trusted party alone for a baseline; Alice then Bob for the
    decomposition), the records n and attributes d, the most bits two values' codes can differ in
    (k_max), the anchor range μ, each custodian's attribute count, Algorithm 1's radius (None:
    off) and, for the decomposition, Bob's pair codes' μ and k_max; each encoding custodian's
    release (per-bit RR on its codes: None for the noise-free encodings and the baselines), and
    what the declared bounds clipped."""

    order: list[str]
    records: int
    dims: int
    k_max: int
    mu: float
    attributes: dict[str, int]
    consistence: float | None
    decomposition: bool
    pair_mu: float | None
    pair_k_max: int | None
    clustering: Clustering
    releases: dict[str, Measurement] = field(default_factory=dict)
    clipped: Clipped | None = None
