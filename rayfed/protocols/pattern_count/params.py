"""Everything ``pattern-count`` resolves at planning time, handed to the driver."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rayfed.privacy import Measurement


@dataclass(frozen=True)
class Params:
    """The parties in order, every party's value labels, the requested patterns (None: all of the
    product space), how many users there are and how many the public sample sends, the values
    outside their declared domains (per column, encoded as all-zero), and each party's release."""

    order: list[str]
    labels: list[list[str]]
    patterns: np.ndarray | None
    users: int
    sent: int
    outside: dict[str, int]
    eps_prime: float
    releases: dict[str, Measurement]


@dataclass(frozen=True)
class Evaluation:
    """Ground truth from the raw data (synthetic runs, or ``evaluate=true``): the true count of
    every requested pattern and the estimator's predicted variance. Not private; never sent to
    an actor."""

    true: np.ndarray
    variance: np.ndarray
