"""ServerShardActor: one shard of the aggregating server, for runs that split the server's work.

The coordinator keeps the control flow and the small final sums; a shard does the server's
per-round work for the contiguous range of user positions each step names (see
:mod:`rayfed.secagg.server`). It holds no data partition and no ledger.
"""

from __future__ import annotations

from rayfed.actors.base import RoleActor


class ServerShardActor(RoleActor):
    """A server shard: no partition, no ledger; it runs the server steps it is given."""

    role = "shard"
