"""The protocol registry: name → module and class, imported only when used."""

from __future__ import annotations

import importlib

from rayfed.errors import ConfigError
from rayfed.protocols.base import Outcome, Plan, Protocol, Result

#: name -> (module, class). Add a protocol here and in its own module; see README "Adding a protocol".
REGISTRY: dict[str, tuple[str, str]] = {
    "pattern-count": ("rayfed.protocols.pattern_count", "PatternCount"),
    "secure-sum": ("rayfed.protocols.secure_sum", "SecureSum"),
    "federated-mf": ("rayfed.protocols.federated_mf", "FederatedMF"),
    "vfl-kmeans": ("rayfed.protocols.vfl_kmeans", "VflKmeans"),
    "square-wave": ("rayfed.protocols.square_wave", "SquareWave"),
    "vfl-primitives": ("rayfed.protocols.vfl_primitives", "VflPrimitives"),
    "ldp-bitvector": ("rayfed.protocols.ldp_bitvector", "LdpBitvector"),
    "hfl-kmeans": ("rayfed.protocols.hfl_kmeans", "HflKmeans"),
}


def get_protocol(name: str) -> Protocol:
    """The protocol registered as ``name``; ConfigError listing the known names otherwise."""
    try:
        module, cls = REGISTRY[name]
    except KeyError:
        raise ConfigError("protocol", f"unknown protocol {name!r}", sorted(REGISTRY)) from None
    return getattr(importlib.import_module(module), cls)()


__all__ = ["REGISTRY", "Outcome", "Plan", "Protocol", "Result", "get_protocol"]
