"""Options of ``rayfed run secure-sum``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

import numpy as np

from rayfed.config import DataConfig, option
from rayfed.dropout import DropoutSchedule, PopulationConfig
from rayfed.errors import ConfigError
from rayfed.privacy.calibration import MAX_DELTA, MAX_DELTA_WHY
from rayfed.protocols.base import reconcile_randomness
from rayfed.secagg.phases import PHASES


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
        0.0,
        "fraction of users lost at unmask (after their masked input is in the sum), per round; "
        "other phases, explicit users and population models: population.*",
        at_least=0,
        at_most=1,
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
    server_shards: int | Literal["auto"] = option(
        "auto",
        "server-shard actors that split the server's reconstruction and mask removal by user "
        "range (bit-identical sums); auto: 1 below 8 cluster CPUs (the coordinator alone), "
        "else CPUs // 4, at most 16",
        at_least=1,
    )
    rounds: int = option(1, "aggregation rounds (fresh keys each round)", at_least=1)
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
    hierarchy: Literal["none", "revealed", "secure"] = option(
        "none",
        "hierarchical aggregation (Bonawitz et al. 2019, Aggregators under a Master): the users "
        "split into `groups` contiguous groups, each its own SecAgg+ round; revealed: the master "
        "(coordinator) learns every group's sum and adds them; secure: each group's aggregator "
        "keeps its sum and the aggregators run a second secure sum, so the master learns only "
        "the total; a group below its threshold is dropped (the total misses it)",
    )
    groups: int | None = option(
        None,
        "number of groups G of hierarchy=revealed|secure (sizes as equal as possible)",
        at_least=2,
    )
    data: DataConfig = field(default_factory=DataConfig, metadata={"help": "data source"})
    dp_mechanism: Literal["none", "gaussian", "ddg", "skellam"] = option(
        "none",
        "private mean estimation: none (the exact sum, no DP); gaussian: continuous Gaussian "
        "shares in floats (as LFL's, fixed-point encoded); ddg / skellam: the distributed "
        "discrete Gaussian / Skellam in the ring (ℓ2 clip, rotation, scale, rounding, integer "
        "shares mod 2^bits). Inputs are rows clipped to ℓ2 norm clip",
    )
    epsilon: float | None = option(
        None,
        "the (ε, δ) target of the release (one round), at the worst accepted dropout outcome",
        above=0,
        when={"dp_mechanism": ("gaussian", "ddg", "skellam")},
    )
    delta: float | None = option(
        None,
        "δ of the target (default 1/users²)",
        above=0,
        at_most=MAX_DELTA,
        why=MAX_DELTA_WHY,
        when={"dp_mechanism": ("gaussian", "ddg", "skellam")},
    )
    dp_dropout: Literal["worst-case", "add-then-remove"] = option(
        "worst-case",
        "dropouts in the private mean: worst-case (each share calibrated for only min_survivors "
        "shares in the sum: more survivors, more noise) or add-then-remove (Dordis: the share "
        "drawn in components, the survivors reveal the excess once U3 is known; skellam only, "
        "semi-honest server)",
        when={"dp_mechanism": ("gaussian", "ddg", "skellam")},
    )
    bits: int = option(
        16,
        "ring bits per coordinate of ddg / skellam (the modulus 2^bits of the secure sum)",
        at_least=2,
        at_most=62,
        when={"dp_mechanism": ("ddg", "skellam")},
    )

    #: options that went, and where they went (a ConfigError names the new place)
    MOVED: ClassVar[dict[str, str]] = {
        "dropout_phase": "population.rates, a rate per SecAgg phase (e.g. "
        "population.rates={share_keys: 0.1}); phases: advertise, share_keys, masked_input, unmask",
        "dropout_rates": "population.rates, in SecAgg's phases: advertise, share_keys, "
        "masked_input, unmask (before_advertise -> advertise, after_share_keys -> masked_input, "
        "after_masked_input and during_unmask -> unmask)",
        "dropout_users": "population.lost, in SecAgg's phases (e.g. population.lost={unmask: [3]})",
        "kill": "--fail cohort=K@phase=P, the run's fault injection (e.g. --fail "
        "cohort=c1@phase=masked_input)",
        "consistency": "threat_model=malicious (the consistency round, the PKI and a threshold "
        "sized for a malicious server)",
    }

    def validate(self) -> None:
        self.schedule()  # unknown phases or rates outside [0, 1] fail here, before any actor
        self._validate_hierarchy()
        if self.dp_mechanism != "none":
            if self.epsilon is None:
                raise ConfigError(
                    "epsilon",
                    f"dp_mechanism={self.dp_mechanism} needs the privacy target",
                    "e.g. --set epsilon=1 (delta defaults to 1/users²)",
                )
            if self.data.path is not None:
                raise ConfigError(
                    "dp_mechanism",
                    "private mean estimation runs on the synthetic inputs only (a data file's "
                    "rows are not yet clipped to the ℓ2 ball the release is declared on)",
                    "dp_mechanism=none with a data file, or no data.path",
                )
            if self.rounds != 1:
                raise ConfigError(
                    "rounds",
                    "private mean estimation is one release (one round)",
                    "rounds=1",
                )
        if self.dp_dropout == "add-then-remove" and self.dp_mechanism != "skellam":
            raise ConfigError(
                "dp_dropout",
                f"add-then-remove splits each share into independent components whose sum is "
                f"the same law: Skellam is closed under sums ({self.dp_mechanism} is not "
                "implemented: the discrete Gaussian is not closed)",
                "dp_mechanism=skellam, or dp_dropout=worst-case",
            )
        if self.dp_dropout == "add-then-remove" and self.threat_model == "malicious":
            raise ConfigError(
                "dp_dropout",
                "add-then-remove trusts the server's count of survivors (a server that claims "
                "more makes the users remove too much noise)",
                "dp_dropout=worst-case, or threat_model=semi-honest",
            )
        if self.dp_mechanism != "none" and self.mode == "plain":
            raise ConfigError(
                "mode",
                f"dp_mechanism={self.dp_mechanism} is distributed DP: its shares protect only "
                "inside secure aggregation, and plain sends each noisy row unmasked",
                "mode=secure (or simulation / dealer to measure it)",
            )
        if self.threat_model == "malicious" and self.allow_weak_params:
            raise ConfigError(
                "allow_weak_params",
                "threat_model=malicious claims the sigma/eta bounds against a malicious server, "
                "which a weak setting does not meet",
                "allow_weak_params=false, or threat_model=semi-honest to measure a weak setting",
            )

    def _validate_hierarchy(self) -> None:
        """``hierarchy`` and ``groups`` go together; the variants compose what they support."""
        if self.hierarchy == "none":
            if self.groups is not None:
                raise ConfigError(
                    "groups",
                    "groups splits the users for hierarchical aggregation, which is off",
                    "set hierarchy=revealed or hierarchy=secure, or drop groups",
                )
            return
        if self.groups is None:
            raise ConfigError(
                "groups",
                f"hierarchy={self.hierarchy} needs the number of groups",
                "e.g. --set groups=10 (at least 2)",
            )
        if self.data.path is None and self.groups > self.users // 2:
            raise ConfigError(
                "groups",
                f"{self.groups} groups of {self.users} users leave a group below 2 users",
                f"groups <= {self.users // 2}",
            )
        if self.hierarchy == "secure" and self.mode == "plain":
            raise ConfigError(
                "hierarchy",
                "mode=plain sends the aggregators' inputs to the second sum unmasked: the master "
                "would receive every group's sum, which hierarchy=secure keeps from it",
                "mode=secure (or simulation/dealer to measure), or hierarchy=revealed",
            )
        if self.dp_mechanism != "none":
            raise ConfigError(
                "hierarchy",
                "private mean estimation is calibrated for one aggregation over all users",
                "hierarchy=none with a dp_mechanism, or dp_mechanism=none",
            )
        if self.threat_model == "malicious":
            raise ConfigError(
                "hierarchy",
                "the hierarchical rounds are semi-honest only (the second sum among the "
                "aggregators has no PKI of its own)",
                "threat_model=semi-honest, or hierarchy=none",
            )
        if self.degree is not None or self.threshold is not None:
            raise ConfigError(
                "degree" if self.degree is not None else "threshold",
                "each group's graph and threshold come from the finder for its own size",
                "drop the override, or hierarchy=none",
            )

    def schedule(
        self, cohorts: dict[str, np.ndarray] | None = None, users=None, rounds: int | None = None
    ) -> DropoutSchedule:
        """The run's availability model in SecAgg's phases: ``dropout`` at unmask, and the
        population's; ``cohorts`` (name -> user ids) resolves the population's ``outage_cohort``,
        ``users`` (ids, data rows) its ``outage_column``; ``rounds`` checks the outage and the
        trace against the run's rounds."""
        return self.population.schedule(PHASES, {"unmask": self.dropout}, cohorts, users, rounds)


def resolve_randomness(cfg: SecureSumConfig, randomness: str):
    """``mode=secure`` makes the run secure; in a secure run ``simulation`` is ``secure`` (the
    same protocol with OS keys) and ``dealer`` (seeds from the run seed) is refused."""
    return reconcile_randomness(
        cfg, randomness, "mode", upgrade=("simulation",), refused=("dealer",)
    )
