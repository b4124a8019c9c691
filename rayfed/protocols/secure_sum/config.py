"""Options of ``rayfed run secure-sum``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from rayfed.config import DataConfig, option
from rayfed.dropout import DropoutSchedule, PopulationConfig
from rayfed.errors import ConfigError
from rayfed.protocols.base import reconcile_randomness

KILL_PHASES = ("advertise", "share_keys", "masked_input", "unmask")


@dataclass(frozen=True)
class SecureSumConfig:
    """Options of ``rayfed run secure-sum``."""

    users: int = option(
        1000,
        "number of simulated users n (synthetic data)",
        at_least=2,
        size=True,
        source="synthetic",
    )
    dim: int = option(100, "vector length d per user", at_least=1, size=True, source="synthetic")
    mode: Literal["secure", "simulation", "dealer", "plain"] = option(
        "simulation",
        "secure: keys from the OS (makes the run randomness=secure); simulation: the same with "
        "seeded keys (becomes secure in a secure run); dealer: no key agreement; plain: insecure",
    )
    graph: Literal["auto", "complete", "harary"] = option(
        "auto",
        "neighbour graph: complete (SecAgg), harary (SecAgg+), auto: sparse when it meets the bounds",
    )
    degree: int | None = option(
        None, "override the neighbour degree k (even; >= users-1 is the complete graph)", at_least=2
    )
    threshold: int | None = option(None, "override the Shamir threshold t", at_least=1)
    tolerated_dropout: float = option(
        0.3, "dropout fraction δ the parameters must tolerate", at_least=0, below=1
    )
    corrupt_fraction: float = option(
        0.05, "fraction γ of clients that may collude with the server", at_least=0, below=0.5
    )
    sigma: float = option(
        40.0, "statistical security parameter: failure probability <= 2^-sigma", above=0
    )
    eta: float = option(
        30.0, "correctness parameter: abort probability <= 2^-eta at tolerated_dropout", above=0
    )
    dropout: float = option(
        0.0, "fraction of users dropping at dropout_phase, per round", at_least=0, at_most=1
    )
    dropout_phase: Literal[
        "before_advertise", "after_share_keys", "after_masked_input", "during_unmask"
    ] = option("after_masked_input", "phase at which the `dropout` fraction drops")
    dropout_rates: dict[str, float] | None = option(
        None, "per-phase dropout rates (replaces dropout/dropout_phase)"
    )
    dropout_users: dict[str, list[int]] | None = option(
        None, "explicit user ids dropping per phase"
    )
    population: PopulationConfig = field(
        default_factory=PopulationConfig,
        metadata={"help": "who is online each round and how fast they answer (models)"},
    )
    clip: float = option(
        1.0,
        "inputs lie in [-clip, clip] (the fixed-point range; synthetic inputs are drawn in it, a "
        "data file's values outside it: see out_of_domain)",
        above=0,
    )
    out_of_domain: Literal["refuse", "clip"] = option(
        "refuse",
        "a data file's values outside [-clip, clip]: refuse the run (a DataError naming the "
        "column) or clip them into it (the count is stated in the result, and the raw plaintext "
        "sum kept beside the clipped one secure aggregation computes)",
        source="file",
    )
    frac_bits: int = option(16, "fixed-point scale 2^frac_bits", at_least=0, at_most=52)
    modulus_bits: int | None = option(
        None, "modulus 2^b (default: the smallest that holds the sum)", at_least=8, at_most=64
    )
    cohorts: int | None = option(
        None, "user-cohort actors (default: this machine's CPUs)", at_least=1
    )
    rounds: int = option(1, "aggregation rounds (fresh keys each round)", at_least=1)
    kill: str | None = option(
        None, "fault injection 'COHORT@PHASE', e.g. c1@masked_input: that actor exits"
    )
    allow_weak_params: bool = option(
        False, "accept a degree/threshold override that misses the sigma/eta bounds"
    )
    threat_model: Literal["semi-honest", "malicious"] = option(
        "semi-honest",
        "the server the round defends against. semi-honest: it follows the protocol (a server "
        "that lies about who dropped can isolate a user on the sparse graph: out of scope); "
        "malicious: SecAgg's consistency round (users sign the survivors list U3 and their keys, "
        "checked against a simulated PKI) and t > (k + corrupt neighbours)/2 (Bell et al.), "
        "with k grown to keep the bounds",
        when={"mode": ("secure", "simulation")},
    )
    data: DataConfig = field(default_factory=DataConfig, metadata={"help": "data source"})

    def validate(self) -> None:
        self.schedule()  # unknown phases or rates outside [0, 1] fail here, before any actor
        if self.threat_model == "malicious" and self.allow_weak_params:
            raise ConfigError(
                "allow_weak_params",
                "threat_model=malicious claims the sigma/eta bounds against a malicious server, "
                "which a weak setting does not meet",
                "allow_weak_params=false, or threat_model=semi-honest to measure a weak setting",
            )
        if self.kill is not None:
            cohort, _, phase = self.kill.partition("@")
            if not cohort or phase not in KILL_PHASES:
                raise ConfigError(
                    "kill",
                    f"expected COHORT@PHASE, got {self.kill!r}",
                    "phases " + ", ".join(KILL_PHASES),
                )

    def schedule(self, cohorts: dict[str, np.ndarray] | None = None, users=None) -> DropoutSchedule:
        """The run's dropout schedule; ``cohorts`` (name -> user ids) resolves the population's
        ``outage_cohort``, ``users`` (ids, data rows) its ``outage_column``."""
        rates = (
            dict(self.dropout_rates)
            if self.dropout_rates is not None
            else ({self.dropout_phase: self.dropout} if self.dropout else {})
        )
        return self.population.schedule(rates, dict(self.dropout_users or {}), cohorts, users)

    def kill_point(self) -> tuple[str, str] | None:
        """(cohort, phase) of the injected kill, if any."""
        return tuple(self.kill.split("@")) if self.kill else None


def resolve_randomness(cfg: SecureSumConfig, randomness: str):
    """``mode=secure`` makes the run secure; in a secure run ``simulation`` is ``secure`` (the
    same protocol with OS keys) and ``dealer`` (seeds from the run seed) is refused."""
    return reconcile_randomness(
        cfg, randomness, "mode", upgrade=("simulation",), refused=("dealer",)
    )
