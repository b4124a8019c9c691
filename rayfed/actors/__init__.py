"""The three generic Ray actors. They hold data and state and run step functions; no protocol logic."""

from rayfed.actors.base import Message, MessageMeta, StepContext
from rayfed.actors.cohort import UserCohortActor
from rayfed.actors.coordinator import CoordinatorActor
from rayfed.actors.party import PartyActor

__all__ = [
    "CoordinatorActor",
    "Message",
    "MessageMeta",
    "PartyActor",
    "StepContext",
    "UserCohortActor",
]
