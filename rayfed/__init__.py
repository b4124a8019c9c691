"""rayfed: differentially private federated protocols as real multi-party programs on Ray.

The public API is small: :func:`run` a protocol by name, or build a :class:`Federation` yourself;
configuration types; and the typed errors. Everything not in ``__all__`` is internal.
"""

from rayfed.api import run
from rayfed.config import DataConfig, RunOptions
from rayfed.errors import (
    BelowThreshold,
    BudgetExceeded,
    ConfigError,
    DataError,
    Interrupted,
    PartyFailed,
    RayfedError,
    RoundTimeout,
    UnaccountedNoise,
)
from rayfed.federation import Federation
from rayfed.privacy import Budget, PrivacyLedger, PrivacyReport
from rayfed.protocols import REGISTRY as PROTOCOLS
from rayfed.protocols.base import Result
from rayfed.runtime import connect, ensure_ray, shutdown

__version__ = "0.1.0"

__all__ = [
    "PROTOCOLS",
    "BelowThreshold",
    "Budget",
    "BudgetExceeded",
    "ConfigError",
    "DataConfig",
    "DataError",
    "Federation",
    "Interrupted",
    "PartyFailed",
    "PrivacyLedger",
    "PrivacyReport",
    "RayfedError",
    "Result",
    "RoundTimeout",
    "RunOptions",
    "UnaccountedNoise",
    "connect",
    "ensure_ray",
    "run",
    "shutdown",
]
