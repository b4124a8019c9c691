"""The generic Ray actors. They hold data and state and run step functions; no protocol logic."""

from rayfed.actors.base import Message, MessageMeta, StepContext
from rayfed.actors.cohort import UserCohortActor
from rayfed.actors.coordinator import CoordinatorActor
from rayfed.actors.party import PartyActor
from rayfed.actors.shard import ServerShardActor

__all__ = [
    "CoordinatorActor",
    "Message",
    "MessageMeta",
    "PartyActor",
    "ServerShardActor",
    "StepContext",
    "UserCohortActor",
]
