"""What :func:`rayfed.secagg.secure_sum` needs of the members it sums over and of its server.

Any group of members works — the parties (one SecAgg user per party) or the user cohorts (many
users per member) — as long as it runs a step on some of its members and turns a member that
fails into a dropout; the federation's ``Group`` is one. The server is a one-member group
(the coordinator) that can also scatter one message per member. Nothing here imports the
federation: secagg depends on these shapes only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from rayfed.backends import PerMember, Replies

__all__ = ["Members", "PerMember", "Server", "party_ids"]


class Members(Protocol):
    """The members whose users' inputs are summed."""

    @property
    def names(self) -> list[str]: ...

    def run(
        self,
        step,
        *args,
        phase: str,
        members: list[str] | None = None,
        on_failure: str = "raise",
        scatter_to: list[str] | None = None,
        **kwargs,
    ) -> Replies:
        """``step(ctx, *args, **kwargs)`` on ``members``; with ``on_failure="drop"`` a member
        that dies or misses its deadline is listed in ``Replies.failed`` instead of raising.
        A :class:`PerMember` argument sends each member its own value. With ``scatter_to`` (receiver
        names) the step answers one message per receiver, each member's payload is
        ``{receiver: payload}`` and each part a separate object."""
        ...


class Server(Protocol):
    """The aggregating server: a one-member group."""

    def run(self, step, *args, phase: str, **kwargs) -> Replies: ...

    def call(self, step, *args, phase: str, **kwargs) -> Any: ...

    def scatter(self, step, *args, to: list[str], phase: str, **kwargs) -> Replies:
        """Run a step returning one message per member of ``to``; ``PerMember(replies)`` then
        sends each its own."""
        ...


def party_ids(names: Sequence[str]) -> dict[str, np.ndarray]:
    """One SecAgg user per party: party ``names[i]`` is user ``i`` (its index in the order given),
    for ``secure_sum(..., ids=party_ids(order))`` with ``registry=np.arange(len(names))``."""
    return {name: np.array([i], dtype=np.int64) for i, name in enumerate(names)}


def member_ids(ids: Mapping[str, Any] | None):
    """The advertise step's argument for ``ids``: none (every member reads its registered users)
    or each member its own ids."""
    if ids is None:
        return None
    return PerMember(
        {name: np.atleast_1d(np.asarray(v, dtype=np.int64)) for name, v in ids.items()}
    )
