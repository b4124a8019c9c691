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
    discrete_laplace_event,
    gaussian,
    kary_randomized_response,
    kary_rr_event,
    laplace,
    laplace_event,
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
    "discrete_laplace_event",
    "event_to_dict",
    "gaussian",
    "gaussian_noise_multiplier",
    "gaussian_steps_event",
    "kary_randomized_response",
    "kary_rr_event",
    "laplace",
    "laplace_event",
    "rr_keep_probability",
]
