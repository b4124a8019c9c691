"""Privacy amplification by shuffling: ε0-LDP reports whose multiset alone reaches the analyst.

Feldman, McMillan and Talwar, "Hiding among the clones" (FOCS 2021), Theorem 3.1: if each of n
users applies an ε0-DP local randomizer and a trusted shuffler hands the analyst only the
multiset of the n reports, the result is (ε, δ)-DP (one user's data replaced) for δ in (0, 1) and
ε0 <= log(n / (16 log(2/δ))), with, as the paper states it,

    ε <= log(1 + (e^ε0 - 1)/(e^ε0 + 1) · (a + c)),  a = 8 sqrt(e^ε0 log(4/δ) / n),  c = 8 e^ε0 / n.

The authors' public implementation (apple/ml-shuffling-amplification, ``closedformanalysis``)
computes a larger ε from the same a and c, log(1 + (1 - e^-ε0)/(1 + e^(-ε0 - ε1)) · (a + c)) with
ε1 = log(1 + a + c), and takes the narrower range ε0 <= log(n / (16 log(4/δ))). We charge that
form in that range: it is never below the paper's (e^-ε1 <= 1), so the guarantee holds whichever
of the two is the theorem's exact statement. The report vector is itself ε0-DP (one user's report
changes), so the shuffled output is also (ε0, 0)-DP: the charge is the smaller of the two. The
bound falls as n grows, so a release among at least n reports is covered by the bound at n.
"""

from __future__ import annotations

import math

import attr
from dp_accounting import dp_event


@attr.s(frozen=True, slots=True, auto_attribs=True)
class ShuffledDpEvent(dp_event.DpEvent):
    """``event`` — a pure ε0-DP local randomizer — run by each of at least ``num_users`` users,
    their reports seen only as a multiset (a trusted shuffler): (min(ε0, ε), δ)-DP with ε from
    :func:`shuffled_epsilon`. Only the ``pure`` accountant supports it; ε0 above
    :func:`shuffle_epsilon0_limit` is refused (the theorem does not cover it)."""

    event: dp_event.DpEvent
    num_users: int
    delta: float

    def drawn_events(self) -> list[dp_event.DpEvent]:
        """The mechanism each user drew under (for the noise-origin check)."""
        return [self.event]


def shuffle_epsilon0_limit(num_users: int, delta: float) -> float:
    """The largest ε0 charged: log(n / (16 log(4/δ))), the authors' code's range, inside the
    paper's log(n / (16 log(2/δ))) (<= 0: too few users)."""
    return math.log(num_users / (16.0 * math.log(4.0 / delta)))


def shuffled_epsilon(epsilon0: float, num_users: int, delta: float) -> float:
    """ε of n shuffled ε0-LDP reports at δ, the authors' code's form of Theorem 3.1 (>= the
    paper's; the caller checks the range)."""
    e0 = math.exp(epsilon0)
    spread = 8.0 * math.sqrt(e0 * math.log(4.0 / delta) / num_users) + 8.0 * e0 / num_users
    epsilon1 = math.log1p(spread)
    return math.log1p(-math.expm1(-epsilon0) / (1.0 + math.exp(-epsilon0 - epsilon1)) * spread)


def shuffled_guarantee(epsilon0: float, num_users: int, delta: float) -> float:
    """The ε charged for one shuffled release: min(ε0, Theorem 3.1's ε)."""
    return min(epsilon0, shuffled_epsilon(epsilon0, num_users, delta))
