"""PartyActor: one data party (a silo or a client) holding its partition as a pyarrow.Table."""

from __future__ import annotations

from rayfed.actors.base import RoleActor


class PartyActor(RoleActor):
    """Holds one party's Arrow partition and per-run state; runs the steps it is given."""

    role = "party"
