"""Noise mechanisms and the privacy ledger."""

from rayfed.privacy.calibration import gaussian_noise_multiplier, gaussian_steps_event
from rayfed.privacy.ledger import (
    Budget,
    EpsilonDeltaDpEvent,
    PrivacyLedger,
    PrivacyReport,
    PureDpAccountant,
    check_budget,
    event_to_dict,
)
from rayfed.privacy.mechanisms import (
    binary_randomized_response,
    binary_rr_event,
    discrete_laplace,
    gaussian,
    kary_randomized_response,
    laplace,
    rr_keep_probability,
)

__all__ = [
    "Budget",
    "EpsilonDeltaDpEvent",
    "PrivacyLedger",
    "PrivacyReport",
    "PureDpAccountant",
    "binary_randomized_response",
    "binary_rr_event",
    "check_budget",
    "discrete_laplace",
    "event_to_dict",
    "gaussian",
    "gaussian_noise_multiplier",
    "gaussian_steps_event",
    "kary_randomized_response",
    "laplace",
    "rr_keep_probability",
]
