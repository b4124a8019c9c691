"""Secure sum: n simulated users in cohort actors sum their vectors through SecAgg / SecAgg+.

The protocol of :mod:`rayfed.secagg` on its own, for measuring it: users, vector length, dropout
rates and patterns, mode and degree are options; the result says whether the decoded sum equals
the plaintext sum of the survivors' quantised inputs, clipped to [-clip, clip], *exactly*, with
the time of every phase. A data file's values outside that range are refused, or clipped and
counted (``out_of_domain``), and the raw plaintext sum is kept beside the clipped one.

Privacy: secure aggregation adds no noise, so without ``dp_mechanism`` there is no differential
privacy here: the server learns the exact sum over the users whose masked input arrived and, in
``secure`` mode under the SecAgg assumptions, nothing else. With ``dp_mechanism`` (gaussian, ddg,
skellam) the run is a private mean estimation: users add noise shares (in the ring for ddg and
skellam, through :mod:`rayfed.secagg.ddp`) and the release is (ε, δ)-DP, charged for the worst
accepted dropout outcome (:mod:`rayfed.protocols.secure_sum.dp`). ``simulation`` runs the same protocol with seeded keys (anyone
with the seed can derive them), ``dealer`` is not secure against the server, ``plain`` is no
protection: every output says so.

The maths is in :mod:`rayfed.secagg` (the exactness reference in
:mod:`rayfed.secagg.reference`); this package is config, params, plan, steps, driver and report,
as every protocol's.
"""

from __future__ import annotations

from rayfed.errors import ConfigError
from rayfed.faults import COMMON_PHASES, SECAGG_PHASES
from rayfed.protocols.base import Protocol
from rayfed.protocols.secure_sum.config import SecureSumConfig, resolve_randomness
from rayfed.protocols.secure_sum.driver import drive
from rayfed.protocols.secure_sum.plan import data_bytes, plan


class SecureSum(Protocol):
    name = "secure-sum"
    #: the phases its members run (a --fail phase outside them is refused)
    phases = COMMON_PHASES + SECAGG_PHASES + ("remove_excess",)
    summary = (
        "secure aggregation (SecAgg / SecAgg+) of users' vectors with dropouts, real cryptography"
    )
    Config = SecureSumConfig
    examples = (
        {"users": 60, "dim": 4, "cohorts": 2},
        {"users": 60, "dim": 4, "cohorts": 2, "dropout": 0.1, "graph": "complete"},
        # private mean estimation: the distributed Skellam in the ring, a user lost at unmask
        {
            "users": 60,
            "dim": 5,
            "cohorts": 2,
            "dropout": 0.05,
            "dp_mechanism": "skellam",
            "epsilon": 1.0,
            "bits": 16,
        },
        # add then remove: users lost before the masked input, the survivors remove the excess
        {
            "users": 60,
            "dim": 5,
            "cohorts": 2,
            "population": {"rates": {"masked_input": 0.15}},
            "dp_mechanism": "skellam",
            "epsilon": 1.0,
            "dp_dropout": "add-then-remove",
        },
    )
    data_bytes = staticmethod(data_bytes)
    resolve_randomness = staticmethod(resolve_randomness)
    plan = staticmethod(plan)
    drive = staticmethod(drive)

    def check_faults(self, cfg: SecureSumConfig, faults: list) -> None:
        if faults and cfg.hierarchy != "none":
            raise ConfigError(
                "fail",
                "the hierarchical rounds' reference does not predict injected faults (a cohort "
                "holds users of several groups, and may host an aggregator)",
                "drop --fail, or hierarchy=none",
            )
