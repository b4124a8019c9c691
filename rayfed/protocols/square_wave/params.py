"""Everything ``square-wave`` resolves at planning time, handed to the driver."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rayfed.dropout import DropoutSchedule
from rayfed.privacy import Clipped, Measurement
from rayfed.protocols.square_wave.config import REPORT


@dataclass(frozen=True)
class Estimator:
    """What the aggregator needs to turn a histogram method's reports into d buckets: the
    method, ε, d, SW's band half-width b and report buckets d̃ (continuous SW), whether SW is
    discrete (bucketize=br), EM's stopping rule, CFO's bins, the hierarchy's branching, the wave's shape
    and how M is held."""

    method: str
    epsilon: float
    buckets: int
    b: float
    output_buckets: int
    discrete: bool
    tolerance: float
    max_iterations: int
    bins: int
    branching: int
    wave_ratio: float = 1.0  # General Wave's top/bottom ratio: 1 = SW, 0 = the triangle
    structured: bool = False  # M as its structured O(d) product instead of a dense array


@dataclass(frozen=True)
class Evaluation:
    """Ground truth from the raw values (``evaluate``): the true histogram over the buckets, the
    mean and the variance. Not private; never sent to an actor."""

    histogram: np.ndarray
    mean: float
    variance: float


@dataclass(frozen=True)
class Params:
    """How many users there are; the aggregator's settings (histogram methods), or the parts of
    SR/PM in round order (``"mean"`` and ``"variance"`` halves, or ``None``: every user for the
    mean); whose report arrives in which round (the dropout rate and the population models);
    the releases, one per kind of report (``"distribution"``, or the moments' ``"mean"`` and
    ``"variance"``); and what the declared bounds clipped (a data file with
    ``out_of_domain=clip``)."""

    users: int
    estimator: Estimator | None
    moment_parts: tuple[str | None, ...]
    schedule: DropoutSchedule = field(default_factory=lambda: DropoutSchedule(REPORT))
    releases: dict[str, Measurement] = field(default_factory=dict)
    clipped: Clipped | None = None
