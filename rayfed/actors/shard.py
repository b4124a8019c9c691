"""ServerShardActor: one shard of the aggregating server, for runs that split the server's work.

The coordinator keeps the control flow and the small final sums; a shard holds the server's
per-round work for one contiguous range of user positions (its ``meta``: ``index`` of ``shards``)
and runs the steps the server gives it. It holds no data partition and no ledger.
"""

from __future__ import annotations

from rayfed.actors.base import RoleActor


class ServerShardActor(RoleActor):
    """A server shard: no partition; ``ctx.meta`` says which range of users it owns."""

    role = "shard"
