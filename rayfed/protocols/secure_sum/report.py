"""What a ``secure-sum`` run reports: the privacy statement of each mode, the exactness check of
every round against a reference computed outside the protocol, the sum and rounds tables and the
headline.

Two references per round: the *clipped* sum (the survivors' inputs clipped to [-clip, clip] and
quantised, what secure aggregation must decode to bit for bit: the exactness check) and the *raw*
plaintext sum (the same without the clip). They differ only where a data file's values were
clipped (``out_of_domain=clip``), and then the headline states both."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from rayfed.actors.base import StepContext
from rayfed.protocols.base import Outcome, Plan
from rayfed.protocols.secure_sum.config import SecureSumConfig
from rayfed.protocols.secure_sum.params import Params
from rayfed.protocols.secure_sum.steps import synthetic_inputs
from rayfed.secagg import AggregationResult, RoundSpec
from rayfed.secagg.graph import NeighbourGraph
from rayfed.secagg.phases import INDEX, NEVER, drop_codes
from rayfed.secagg.reference import exact_sum, expected_survivors, raw_sum, to_float

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
#: secure mode's statement under threat_model=malicious (STATEMENTS["secure"] is semi-honest's)
MALICIOUS_STATEMENT = (
    "no differential privacy: the server learns the exact sum of the survivors' inputs and, under "
    "the SecAgg+ assumptions against a malicious server (Bell et al.: it may lie about who dropped "
    "and show users different lists, colluding with at most a corrupt_fraction of the users, "
    "corrupted independently of the public neighbour graph; the consistency round and a PKI of "
    "the users' signing keys), nothing else; the server still chooses which users count as "
    "survivors (any U3 of at least min_survivors users, which the users check: a smaller one "
    "they refuse), and it may abort"
)


def statement(cfg: SecureSumConfig) -> str:
    """The run's privacy statement: the mode's, and in secure mode the threat model's."""
    if cfg.mode == "secure" and cfg.threat_model == "malicious":
        return MALICIOUS_STATEMENT
    return STATEMENTS[cfg.mode]


# --- the exactness reference (evaluation only, computed outside the protocol) ----------------------
def reference(
    cfg: SecureSumConfig,
    plan: Plan,
    spec: RoundSpec,
    *,
    seed: int,
    graph_seed: int,
    faults: tuple,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """With :mod:`rayfed.secagg.reference`: the users whose input must be in round ``spec.round``'s
    sum — from the dropout schedule, the round's graph (``graph_seed``: in secure mode the server's
    draw or the PKI's beacon, published with the key table) and the cohorts planned to die — and
    the exact integer sums of their inputs, clipped (what the protocol must decode to) and raw
    (read from the file as given, not from the users' clipped table; column by column, so an
    integer column is added as integers). A cohort that died unplanned makes the round
    unverifiable (not exact)."""
    params: Params = plan.params
    registry = params.registry
    survivors = expected_survivors(
        registry,
        drop_codes(spec.dropout, seed, spec.round, registry),
        NeighbourGraph.build(registry.size, spec.degree, spec.complete, graph_seed, spec.round),
        spec.threshold,
        _lost_at(plan, spec, faults),
    )
    if params.columns:
        table = plan.evaluation.table
        keys = table.column(cfg.data.key).to_numpy()
        order = np.argsort(keys)
        rows = order[np.searchsorted(keys[order], survivors)]
        cols = [table.column(c).to_numpy()[rows] for c in params.columns]
        x = np.column_stack(cols)
        raw = np.concatenate([raw_sum(col[:, None], cfg.frac_bits) for col in cols])
    else:
        ctx = StepContext(name="evaluation", role="driver", seed=seed)
        x = synthetic_inputs(ctx, spec.round, survivors, params.dim, cfg.clip)
        raw = raw_sum(x, cfg.frac_bits)
    return survivors, exact_sum(x, cfg.clip, cfg.frac_bits), raw


def _lost_at(plan: Plan, spec: RoundSpec, faults: tuple) -> np.ndarray:
    """Per registry position, the index of the phase at which its cohort is planned to die."""
    registry = plan.params.registry
    lost = np.full(registry.size, NEVER)
    planned = []
    for fault in faults:  # --fail: @round=R dies at R's first phase, @phase=P in
        if fault.role != "cohorts":  # the first round (cohorts restart after a round)
            continue
        if fault.round == spec.round or (fault.round is None and spec.round == 0):
            planned.append((fault.member, fault.phase or "advertise"))
    for cohort, phase in planned:
        if phase not in INDEX:  # a fault in no phase of secure aggregation never fires
            continue
        members = np.unique(plan.cohorts[cohort][0].column("user_id"))  # per_user renames the key
        at = np.searchsorted(registry, members)
        lost[at] = np.minimum(lost[at], INDEX[phase])  # the earliest death counts
    return lost


def round_row(
    r: int,
    result: AggregationResult,
    params: Params,
    survivors: np.ndarray,
    reference: np.ndarray,
) -> dict[str, Any]:
    """Round ``r``'s line of the rounds table: exact when the protocol's survivors and decoded sum
    are the reference's (the clipped sum: ``reference``)."""
    exact = bool(
        np.array_equal(survivors, result.survivors)
        and np.array_equal(params.encoding.signed(result.words), reference)
    )
    return {
        "round": r,
        "exact": exact,
        "expected_survivors": int(survivors.size),
        "survivors": int(result.survivors.size),
        **{f"alive_{k}": v for k, v in result.counts.items()},
        "failed_cohorts": ",".join(result.failed_cohorts),
    }


# --- the outcome -----------------------------------------------------------------------------------
def outcome(
    cfg: SecureSumConfig,
    params: Params,
    rows: list[dict[str, Any]],
    last: AggregationResult,
    reference: np.ndarray,
    raw: np.ndarray,
    *,
    cohorts: int,
    phase_seconds: dict[str, float],
    simulated_seconds: list[dict[str, float]],
) -> Outcome:
    """The last round's sum next to the raw plaintext sum and the clipped one it must equal, every
    round's check, and the metrics (what the domain check clipped among them)."""
    secagg = params.secagg
    plaintext = to_float(raw, cfg.frac_bits)  # ±inf where the raw sum is beyond float64
    clipped = to_float(reference, cfg.frac_bits)
    metrics = {
        "exact": all(row["exact"] for row in rows),
        "mode": cfg.mode,
        "secure": cfg.mode == "secure",
        "threat_model": secagg.threat_model,
        "users": int(params.registry.size),
        "dim": params.dim,
        "cohorts": cohorts,
        "degree": secagg.degree,
        "threshold": secagg.threshold,
        "min_survivors": secagg.min_survivors,
        "complete_graph": secagg.complete,
        "log2_security_failure": secagg.log2_security_failure,
        "log2_correctness_failure": secagg.log2_correctness_failure,
        "modulus_bits": params.encoding.modulus_bits,
        "phase_seconds": phase_seconds,
        # per round and client phase, the time on the simulated clock of the latency model
        "simulated_seconds": simulated_seconds,
        "simulated_round_seconds": [sum(r.values()) for r in simulated_seconds],
        "rounds": rows,
        # a data file's values clipped into [-clip, clip] (None: synthetic inputs, drawn there)
        "clipped": params.clipped.to_dict() if params.clipped else None,
        # the last round: the largest |raw plaintext sum - clipped sum| over the coordinates
        "clipping_gap": float(np.max(np.abs(plaintext - clipped), initial=0.0)),
        # coordinates whose raw plaintext sum lies beyond float64's range (±inf in the table)
        "raw_sum_beyond_float64": int(np.count_nonzero(np.isinf(plaintext))),
    }
    tables = {
        "sum": pa.table(
            {
                "coordinate": np.arange(params.dim),
                "secure_sum": last.sum,
                "plaintext_sum": plaintext,  # the raw inputs (no clip)
                "clipped_sum": clipped,  # what secure aggregation computes: the exactness check
            }
        ),
        "rounds": pa.Table.from_pylist(rows),
    }
    text = headline(cfg, params, last, metrics, plaintext)
    return Outcome(tables=tables, metrics=metrics, headline=text)


def headline(
    cfg: SecureSumConfig,
    params: Params,
    last: AggregationResult,
    metrics: dict[str, Any],
    plaintext: np.ndarray,
) -> str:
    """Survivors, exactness, graph and mode; where a data file's values were clipped, exactness is
    claimed against the clipped values only, with the count and the raw plaintext sum beside."""
    secagg = params.secagg
    graph = (
        f"complete graph k={secagg.degree} (SecAgg, k = n - 1)"
        if secagg.complete
        else f"Harary graph k={secagg.degree} (SecAgg+)"
    )
    verdict = "EXACT" if metrics["exact"] else "NOT EXACT"
    clipped = params.clipped
    if clipped is not None and clipped.count:
        if params.dim == 1:
            raw = f"secure sum {last.sum[0]:.6g}, raw plaintext sum {plaintext[0]:.6g}"
        else:
            raw = (
                f"the raw plaintext sum differs by up to {metrics['clipping_gap']:.6g} in a "
                "coordinate (sum table: plaintext_sum beside clipped_sum)"
            )
        beyond = metrics["raw_sum_beyond_float64"]
        if beyond:
            raw += (
                f"; the raw plaintext sum lies beyond float64's range in {beyond} coordinate(s): "
                "±inf in the sum table"
            )
        verdict += f" for the clipped values ({clipped.statement()}: {raw})"
    text = (
        f"sum of {last.survivors.size}/{params.registry.size} survivors' {params.dim}-vectors "
        f"{verdict}; {graph}, t={secagg.threshold}, mode={cfg.mode}; "
        f"threat model {secagg.threat_model}: {secagg.bounds()}"
    )
    if cfg.mode != "secure":
        text += f" [{STATEMENTS[cfg.mode].split(':')[0]}]"
    return text
