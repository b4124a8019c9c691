"""Secure sum: n simulated users in cohort actors sum their vectors through SecAgg / SecAgg+.

The protocol of :mod:`rayfed.secagg` on its own, for measuring it: users, vector length, dropout
rates and patterns, mode and degree are options; the result says whether the decoded sum equals
the plaintext sum of the survivors' quantised inputs *exactly*, with the time of every phase.

Privacy: secure aggregation adds no noise, so there is no differential privacy here: the server
learns the exact sum over the users whose masked input arrived and, in ``secure`` mode under the
SecAgg assumptions, nothing else. ``simulation`` runs the same protocol with seeded keys (anyone
with the seed can derive them), ``dealer`` is not secure against the server, ``plain`` is no
protection: every output says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pyarrow as pa

from rayfed import rng
from rayfed.actors.base import StepContext
from rayfed.config import DataConfig, option
from rayfed.data import load_table, per_user, require_clean, require_columns
from rayfed.dropout import NEVER, DropoutSchedule
from rayfed.errors import ConfigError, DataError
from rayfed.privacy import Budget
from rayfed.protocols.base import Outcome, Plan, Protocol, reconcile_randomness
from rayfed.secagg import FixedPoint, check_params, find_params, make_spec, secure_sum
from rayfed.secagg.graph import NeighbourGraph
from rayfed.secagg.reference import PHASE_INDEX, exact_sum, expected_survivors
from rayfed.sizing import default_cohorts

STATEMENTS = {
    "secure": "no differential privacy: the server learns the exact sum of the survivors' inputs and, under "
    "the SecAgg assumptions (a semi-honest server colluding with at most a corrupt_fraction of the users, "
    "who are corrupted independently of the public neighbour graph), nothing else",
    "simulation": "simulation mode, NOT secure: the same protocol, but every key and seed is derived from the "
    "run's root seed, so anyone holding it (the coordinator included) can derive them; reproducible; no DP",
    "dealer": "dealer mode, NOT secure against the server: a trusted dealer (the coordinator) holds every mask "
    "seed; no DP",
    "plain": "INSECURE baseline (mode=plain): inputs are sent unmasked; no DP",
}
MAX_COMPLETE_BYTES = 4 << 30


@dataclass(frozen=True)
class SecureSumConfig:
    """Options of ``rayfed run secure-sum``."""

    users: int = option(1000, "number of simulated users n (synthetic data)", at_least=2, size=True)
    dim: int = option(100, "vector length d per user", at_least=1, size=True)
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
    clip: float = option(1.0, "inputs are clipped to [-clip, clip]", above=0)
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
    data: DataConfig = field(default_factory=DataConfig, metadata={"help": "data source"})

    def validate(self) -> None:
        self.schedule()  # unknown phases or rates outside [0, 1] fail here, before any actor
        if self.kill is not None:
            cohort, _, phase = self.kill.partition("@")
            if not cohort or phase not in ("advertise", "share_keys", "masked_input", "unmask"):
                raise ConfigError(
                    "kill",
                    f"expected COHORT@PHASE, got {self.kill!r}",
                    "phases advertise, share_keys, masked_input, unmask",
                )

    def schedule(self) -> DropoutSchedule:
        rates = (
            dict(self.dropout_rates)
            if self.dropout_rates is not None
            else ({self.dropout_phase: self.dropout} if self.dropout else {})
        )
        return DropoutSchedule(rates=rates, explicit=dict(self.dropout_users or {}))


# --- inputs, computed inside each cohort for its users -------------------------------------------
def synthetic_inputs(
    ctx: StepContext, round: int, ids: np.ndarray, dim: int, clip: float
) -> np.ndarray:
    """Uniform on [-clip, clip], keyed by (round, user id): the same wherever the user is hosted."""
    return (rng.keyed_uniform(ctx.seed, "synthetic", round, ids, dim) * 2 - 1) * clip


def table_inputs(ctx: StepContext, round: int, ids: np.ndarray, columns: list[str]) -> np.ndarray:
    """The users' rows of the value columns (one row per user)."""
    rows = np.searchsorted(ctx.table.column("user_id").to_numpy(), ids)
    return np.column_stack([ctx.table.column(c).to_numpy()[rows] for c in columns]).astype(
        np.float64
    )


def _check_params(cfg: SecureSumConfig, params, n: int, n_cohorts: int) -> None:
    """Weak overrides and complete graphs too large for memory are errors before any actor starts."""
    weak = params.log2_security_failure > -cfg.sigma or params.log2_correctness_failure > -cfg.eta
    if weak and not cfg.allow_weak_params:
        field = "threshold" if cfg.threshold is not None else "degree"
        raise ConfigError(
            field,
            f"degree {params.degree} / threshold {params.threshold} miss the bounds: "
            f"log2 P[security failure] = {params.log2_security_failure:.1f} (need <= -{cfg.sigma:g}), "
            f"log2 P[abort] = {params.log2_correctness_failure:.1f} (need <= -{cfg.eta:g})",
            "drop the override, or set allow_weak_params=true to measure a weak setting",
        )
    if params.complete and cfg.mode in ("secure", "simulation"):
        per_cohort = -(-n // n_cohorts) * n * 13 * 8 * 2
        if per_cohort > MAX_COMPLETE_BYTES:
            raise ConfigError(
                "graph",
                f"the complete graph with {n:,} users needs ~{per_cohort / 2**30:.1f} GiB of "
                "Shamir shares per cohort",
                f"at most {MAX_COMPLETE_BYTES >> 30} GiB: graph=harary, "
                "more cohorts, or fewer users",
            )


class SecureSum(Protocol):
    name = "secure-sum"
    summary = (
        "secure aggregation (SecAgg / SecAgg+) of users' vectors with dropouts, real cryptography"
    )
    Config = SecureSumConfig
    examples = (
        {"users": 60, "dim": 4, "cohorts": 2},
        {"users": 60, "dim": 4, "cohorts": 2, "dropout": 0.1, "graph": "complete"},
    )

    def data_bytes(self, cfg: SecureSumConfig) -> int:
        """Every user's input, encoded and masked words (float64 and two word arrays), and its
        keys and shares; the complete graph's share tables are checked in plan."""
        if cfg.data.path is not None:
            return 0
        return cfg.users * (cfg.dim * 8 * 3 + 512)

    def resolve_randomness(self, cfg: SecureSumConfig, randomness: str):
        """``mode=secure`` makes the run secure; in a secure run ``simulation`` is ``secure`` (the
        same protocol with OS keys) and ``dealer`` (seeds from the run seed) is refused."""
        return reconcile_randomness(
            cfg, randomness, "mode", upgrade=("simulation",), refused=("dealer",)
        )

    def plan(self, cfg: SecureSumConfig, seed: int) -> Plan:
        if cfg.data.path is None:
            table = pa.table({"user_id": np.arange(cfg.users, dtype=np.int64)})
            columns: list[str] = []
        else:
            if cfg.data.key is None:
                raise ConfigError(
                    "data.key",
                    "a data file needs the user key column",
                    "e.g. --set data.key=user_id",
                )
            table = load_table(cfg.data.path, cfg.data.format)
            require_columns(table, [cfg.data.key], "data.key")
            columns = (cfg.data.columns or {}).get("values") or [
                c for c in table.column_names if c != cfg.data.key
            ]
            require_columns(table, columns, "data.columns.values")
            require_clean(table, columns, "data.columns.values", numeric=True)
            keys = table.column(cfg.data.key).to_numpy()
            if np.unique(keys).size != keys.size:
                raise DataError(
                    "data.key", "one row per user is expected", "aggregate the rows per user first"
                )
            if cfg.users != SecureSumConfig.users or cfg.dim != SecureSumConfig.dim:
                raise ConfigError(
                    "users",
                    "users and dim come from the data file when data.path is given",
                    "drop users/dim",
                )
        n = table.num_rows
        dim = len(columns) or cfg.dim
        n_cohorts = default_cohorts(n, cfg.cohorts)
        cohorts = per_user(table, cfg.data.key or "user_id", n_cohorts)
        if cfg.kill is not None and cfg.kill.split("@")[0] not in cohorts:
            raise ConfigError("kill", f"no cohort {cfg.kill.split('@')[0]!r}", sorted(cohorts))
        if cfg.degree is not None or cfg.threshold is not None:
            base = find_params(
                n,
                dropout=cfg.tolerated_dropout,
                corrupt=cfg.corrupt_fraction,
                sigma=cfg.sigma,
                eta=cfg.eta,
                graph=cfg.graph,
            )
            params = check_params(
                n,
                cfg.degree or base.degree,
                cfg.threshold or base.threshold,
                dropout=cfg.tolerated_dropout,
                corrupt=cfg.corrupt_fraction,
            )
        else:
            params = find_params(
                n,
                dropout=cfg.tolerated_dropout,
                corrupt=cfg.corrupt_fraction,
                sigma=cfg.sigma,
                eta=cfg.eta,
                graph=cfg.graph,
            )
        encoding = FixedPoint.choose(n, cfg.clip, cfg.frac_bits, cfg.modulus_bits)
        _check_params(cfg, params, n, n_cohorts)
        statement = STATEMENTS[cfg.mode]
        return Plan(
            budget=Budget.none(),
            ledger=dict(statement=statement),
            cohorts={name: (t, {}) for name, t in cohorts.items()},
            rounds=cfg.rounds,
            cohort_restarts=cfg.rounds,  # a cohort's state lives for one round: restart it
            evaluation={"table": table if columns else None},
            info={
                "registry": np.sort(table.column(cfg.data.key or "user_id").to_numpy()),
                "params": params,
                "encoding": encoding,
                "dim": dim,
                "columns": columns,
            },
        )

    def drive(self, fed, cfg: SecureSumConfig, plan: Plan) -> Outcome:
        info = plan.info
        kill = tuple(cfg.kill.split("@")) if cfg.kill else None
        rows, results = [], []
        for r in range(cfg.rounds):
            with fed.round(r):
                spec = make_spec(
                    round=r,
                    mode=cfg.mode,
                    registry=info["registry"],
                    params=info["params"],
                    encoding=info["encoding"],
                    dim=info["dim"],
                    dropout=cfg.schedule(),
                    tag=fed.run_id.encode(),
                    kill=kill if r == 0 else None,
                )
                if info["columns"]:
                    result = secure_sum(fed, spec, table_inputs, (info["columns"],))
                else:
                    result = secure_sum(fed, spec, synthetic_inputs, (info["dim"], cfg.clip))
                fed.record(
                    survivors=int(result.survivors.size),
                    dropouts=int(info["registry"].size - result.survivors.size),
                )
            survivors, reference = self._reference(fed, cfg, plan, spec, kill)
            exact = bool(
                np.array_equal(survivors, result.survivors)
                and np.array_equal(info["encoding"].signed(result.words), reference)
            )
            results.append((result, exact))
            rows.append(
                {
                    "round": r,
                    "exact": exact,
                    "expected_survivors": int(survivors.size),
                    "survivors": int(result.survivors.size),
                    **{f"alive_{k}": v for k, v in result.counts.items()},
                    "failed_cohorts": ",".join(result.failed_cohorts),
                }
            )

        last, exact = results[-1]
        plain = np.ldexp(reference.astype(np.float64), -cfg.frac_bits)
        params = info["params"]
        phase_seconds = fed.phase_seconds()
        metrics = {
            "exact": all(e for _, e in results),
            "mode": cfg.mode,
            "secure": cfg.mode == "secure",
            "users": int(info["registry"].size),
            "dim": info["dim"],
            "cohorts": len(fed.cohorts),
            "degree": params.degree,
            "threshold": params.threshold,
            "min_survivors": params.min_survivors,
            "complete_graph": params.complete,
            "log2_security_failure": params.log2_security_failure,
            "log2_correctness_failure": params.log2_correctness_failure,
            "modulus_bits": info["encoding"].modulus_bits,
            "phase_seconds": phase_seconds,
            "rounds": rows,
        }
        graph = (
            "complete graph (SecAgg)"
            if params.complete
            else f"Harary graph k={params.degree} (SecAgg+)"
        )
        headline = (
            f"sum of {last.survivors.size}/{info['registry'].size} survivors' {info['dim']}-vectors "
            f"{'EXACT' if metrics['exact'] else 'NOT EXACT'}; {graph}, t={params.threshold}, mode={cfg.mode}"
        )
        if cfg.mode != "secure":
            headline += f" [{STATEMENTS[cfg.mode].split(':')[0]}]"
        tables = {
            "sum": pa.table(
                {
                    "coordinate": np.arange(info["dim"]),
                    "secure_sum": last.sum,
                    "plaintext_sum": plain,
                }
            ),
            "rounds": pa.Table.from_pylist(rows),
        }
        return Outcome(tables=tables, metrics=metrics, headline=headline)

    @staticmethod
    def _reference(fed, cfg: SecureSumConfig, plan: Plan, spec, kill) -> tuple:
        """Evaluation only, computed outside the protocol (:mod:`rayfed.secagg.reference`): the
        users whose input must be in round ``spec.round``'s sum — from the dropout schedule, the
        public graph and the cohorts planned to die — and the exact integer sum of their raw
        inputs. A cohort that died unplanned makes the round unverifiable (not exact)."""
        info = plan.info
        registry = info["registry"]
        lost = np.full(registry.size, NEVER)
        planned = [kill] if kill and spec.round == 0 else []
        for fault in fed.injected_faults:  # --fail: @round=R dies at R's first phase, @phase=P in
            if fault.role != "cohorts":  # the first round (cohorts restart after a round)
                continue
            if fault.round == spec.round or (fault.round is None and spec.round == 0):
                planned.append((fault.member, fault.phase or "advertise"))
        for cohort, phase in planned:
            if phase not in PHASE_INDEX:  # a fault in no phase of secure aggregation never fires
                continue
            members = np.unique(plan.cohorts[cohort][0].column(cfg.data.key or "user_id"))
            at = np.searchsorted(registry, members)
            lost[at] = np.minimum(lost[at], PHASE_INDEX[phase])  # the earliest death counts
        survivors = expected_survivors(
            registry,
            spec.dropout.drop_phase(fed.seed, spec.round, registry),
            NeighbourGraph.build(registry.size, spec.degree, spec.complete, fed.seed, spec.round),
            spec.threshold,
            lost,
        )
        if info["columns"]:
            table = plan.evaluation["table"]
            keys = table.column(cfg.data.key).to_numpy()
            order = np.argsort(keys)
            rows = order[np.searchsorted(keys[order], survivors)]
            x = np.column_stack([table.column(c).to_numpy()[rows] for c in info["columns"]])
        else:
            ctx = StepContext(name="evaluation", role="driver", seed=fed.seed)
            x = synthetic_inputs(ctx, spec.round, survivors, info["dim"], cfg.clip)
        return survivors, exact_sum(x, cfg.clip, cfg.frac_bits)
