"""Seeded dropout schedules: which simulated user stops answering at which round and phase.

Phases of one secure-aggregation round, in order (a user that drops at a phase is absent from it
and from every later phase of that round):

* ``before_advertise``   — never sends its public keys;
* ``after_share_keys``   — sent its encrypted shares, never sends its masked input;
* ``after_masked_input`` — its masked input is in the sum, it does not answer the unmasking;
* ``during_unmask``      — drops while the unmasking runs; to the server this is the same as
  ``after_masked_input`` (its answer never arrives).

A rate is a per-phase hazard: the probability of dropping at that phase for a user still present
(so rates of 0.1 at two phases drop 19 %, not 20 %). A user's draw is a pure function of (root
seed, round, user id), so schedules do not depend on how users are dealt to cohorts. Explicit lists
name user ids per phase and apply to every round.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rayfed import rng
from rayfed.errors import ConfigError

PHASES = ("before_advertise", "after_share_keys", "after_masked_input", "during_unmask")
NEVER = len(PHASES)


@dataclass(frozen=True)
class DropoutSchedule:
    """Per-phase dropout probabilities and explicit per-phase user lists."""

    rates: dict[str, float] = field(default_factory=dict)
    explicit: dict[str, list[int]] = field(default_factory=dict)

    def __post_init__(self):
        for name, table in (("dropout", self.rates), ("dropout_users", self.explicit)):
            for phase in table:
                if phase not in PHASES:
                    raise ConfigError(f"{name}.{phase}", "unknown phase", PHASES)
        for phase, rate in self.rates.items():
            if not 0 <= rate <= 1:
                raise ConfigError(
                    f"dropout.{phase}", f"must be a probability in [0, 1], got {rate}"
                )

    @staticmethod
    def uniform(rate: float, phase: str = "after_masked_input") -> DropoutSchedule:
        return DropoutSchedule(rates={phase: rate})

    def drop_phase(self, seed: int, round: int, ids: np.ndarray) -> np.ndarray:
        """Index into PHASES of the phase each user drops at (NEVER = 4 if it stays)."""
        ids = np.asarray(ids, dtype=np.int64)
        out = np.full(ids.size, NEVER, dtype=np.int8)
        if self.rates:
            u = rng.keyed_uniform(seed, "dropout", round, ids, len(PHASES))
            for p, phase in reversed(list(enumerate(PHASES))):
                out[u[:, p] < self.rates.get(phase, 0.0)] = p
        for p, phase in reversed(list(enumerate(PHASES))):
            listed = np.isin(ids, np.asarray(self.explicit.get(phase, []), dtype=np.int64))
            out[listed] = np.minimum(out[listed], p)
        return out
