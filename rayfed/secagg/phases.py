"""SecAgg's phases and what availability means for them: the one place that names them.

A round of secure aggregation has four client phases, in order (the consistency round, when on,
lies between masked_input and unmask and loses no one by schedule):

* ``advertise``    — a user sends its public keys (U1);
* ``share_keys``   — it sends its encrypted Shamir shares (U2);
* ``masked_input`` — it sends its masked input (U3: its input is in the sum);
* ``unmask``       — it answers the unmasking (reveals shares for survivors and dropouts).

A user lost at phase P (:mod:`rayfed.dropout`) answers every phase before P and none from P on;
one offline at a round is lost at ``advertise``. A user *late* at ``share_keys`` is counted as
lost at ``advertise``: its late shares leave it out of the round before any mask involves it, and
its neighbours count it as absent when they check for t live neighbours (the cautious side). A
late answer at any other phase is a loss at that phase.

:func:`drop_codes` turns a round's availability into the code each client step and the exactness
reference read: the index of the first phase a user does not answer (:data:`NEVER` = 4 when it
answers all).
"""

from __future__ import annotations

import numpy as np

from rayfed.dropout import LATE, DropoutSchedule, Phases

#: the i.i.d. loss rates read the uniform columns of the drop points the schedule named before
#: these phases (before_advertise 0, after_share_keys 1, after_masked_input 2), so a seeded
#: schedule loses the same users; share_keys, new, reads the last column
PHASES = Phases(("advertise", "share_keys", "masked_input", "unmask"), draws=(0, 3, 1, 2))
ADVERTISE, SHARE_KEYS, MASKED_INPUT, UNMASK = range(len(PHASES))
NEVER = len(PHASES)
#: the fault-injection phase names (``--fail cohort=K@phase=P``) of the client steps
INDEX = {name: i for i, name in enumerate(PHASES.names)}


def schedule(**kwargs) -> DropoutSchedule:
    """A dropout schedule in SecAgg's phases (``rates``, ``explicit``, ``availability``,
    ``stragglers`` as :class:`~rayfed.dropout.DropoutSchedule` takes them)."""
    return DropoutSchedule(PHASES, **kwargs)


def drop_codes(dropout: DropoutSchedule, seed: int, round: int, ids: np.ndarray) -> np.ndarray:
    """Per user, the index of the first phase it does not answer (NEVER if none), from the
    round's availability: a user late at share_keys is lost at advertise (see above)."""
    if dropout.phases != PHASES:
        raise ValueError(
            f"secure aggregation needs a schedule in its phases {PHASES.names}, "
            f"got {dropout.phases.names}"
        )
    availability = dropout.round(seed, round, ids)
    code = availability.phase.copy()
    code[(availability.state == LATE) & (code == SHARE_KEYS)] = ADVERTISE
    return code
