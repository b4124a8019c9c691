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
from rayfed.secagg.client import chunk_rows
from rayfed.secagg.graph import NeighbourGraph
from rayfed.secagg.hierarchy import HierarchyResult, server_learns
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


def statement(cfg: SecureSumConfig, hosts: list[str] | None = None) -> str:
    """The run's privacy statement: the mode's, and in secure mode the threat model's; with
    ``hierarchy``, what its variant lets the master learn under the mode, and (``secure``) where
    the aggregators run, ``hosts[g]`` group g's (:func:`server_learns`)."""
    if cfg.mode == "secure" and cfg.threat_model == "malicious":
        text = MALICIOUS_STATEMENT
    else:
        text = STATEMENTS[cfg.mode]
    if cfg.hierarchy != "none":
        text += f"; hierarchical aggregation ({cfg.hierarchy}): " + server_learns(
            cfg.hierarchy, cfg.groups, mode=cfg.mode, hosts=hosts
        )
    return text


# --- the exactness reference (evaluation only, computed outside the protocol) ----------------------
def reference(
    cfg: SecureSumConfig,
    plan: Plan,
    spec: RoundSpec,
    *,
    seed: int,
    graph_seed: int,
    faults: tuple,
    values: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """With :mod:`rayfed.secagg.reference`: the users whose input must be in round ``spec.round``'s
    sum — from the dropout schedule, the round's graph (``graph_seed``: in secure mode the server's
    draw or the PKI's beacon, published with the key table) and the cohorts planned to die — and
    the exact integer sums of their inputs, clipped (what the protocol must decode to) and raw
    (read from the file as given, not from the users' clipped table; column by column, so an
    integer column is added as integers). A cohort that died unplanned makes the round
    unverifiable (not exact). ``values=False``: the survivors only."""
    params: Params = plan.params
    registry = params.registry
    survivors = expected_survivors(
        registry,
        drop_codes(spec.dropout, seed, spec.round, registry),
        NeighbourGraph.build(registry.size, spec.degree, spec.complete, graph_seed, spec.round),
        spec.threshold,
        _lost_at(plan, spec, faults),
    )
    if not values:  # the survivors only (private mean estimation: its own evaluation)
        return survivors, np.zeros(0), np.zeros(0)
    clipped, raw = _sums_of(cfg, plan, survivors, spec.round, seed)
    return survivors, clipped, raw


def _sums_of(cfg: SecureSumConfig, plan: Plan, survivors: np.ndarray, round: int, seed: int):
    """The exact clipped and raw sums of ``survivors``' inputs in ``round`` (see reference)."""
    params: Params = plan.params
    if params.columns:
        table = plan.evaluation.table
        keys = table.column(cfg.data.key).to_numpy()
        order = np.argsort(keys)
        rows = order[np.searchsorted(keys[order], survivors)]
        cols = [table.column(c).to_numpy()[rows] for c in params.columns]
        x = np.column_stack(cols) if cols else np.zeros((0, 0))
        raw = np.concatenate([raw_sum(col[:, None], cfg.frac_bits) for col in cols])
    else:
        ctx = StepContext(name="evaluation", role="driver", seed=seed)
        return _synthetic_sums(ctx, round, survivors, params.dim, cfg)
    return exact_sum(x, cfg.clip, cfg.frac_bits), raw


def _synthetic_sums(
    ctx: StepContext, r: int, survivors: np.ndarray, dim: int, cfg: SecureSumConfig
) -> tuple[np.ndarray, np.ndarray]:
    """(clipped, raw) exact sums of the survivors' synthetic inputs, generated a chunk of users
    at a time (a user's row depends on its id only), so the reference's memory does not grow
    with n. The chunks' exact integer sums are added exactly, and each total has the dtype the
    one-chunk sum would have (int64 while its bound fits, Python integers beyond)."""
    clipped = raw = np.zeros(dim, dtype=object)
    largest = 0
    step = chunk_rows(dim)
    for a in range(0, survivors.size, step):
        x = synthetic_inputs(ctx, r, survivors[a : a + step], dim, cfg.clip)
        clipped = clipped + exact_sum(x, cfg.clip, cfg.frac_bits).astype(object)
        raw = raw + raw_sum(x, cfg.frac_bits).astype(object)
        # round(max|x|·2^f) = max round(|x|·2^f): the scale is a power of two
        largest = max(largest, int(np.rint(np.max(np.abs(x), initial=0.0) * 2.0**cfg.frac_bits)))
    n, grid = survivors.size, int(round(cfg.clip * 2**cfg.frac_bits))
    return (
        clipped.astype(np.int64) if n * grid < 2**62 else clipped,
        raw.astype(np.int64) if n * largest < 2**62 else raw,
    )


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


def round_sums(
    r: int, result: AggregationResult, cfg: SecureSumConfig, reference: np.ndarray, raw: np.ndarray
) -> pa.Table:
    """Round ``r``'s rows of the ``sums`` table: per coordinate, the secure sum, the raw
    plaintext sum and the clipped sum it must equal (the ``sum`` table has the last round's)."""
    return pa.table(
        {
            "round": np.full(result.sum.size, r, dtype=np.int64),
            "coordinate": np.arange(result.sum.size),
            "secure_sum": result.sum,
            "plaintext_sum": to_float(raw, cfg.frac_bits),
            "clipped_sum": to_float(reference, cfg.frac_bits),
        }
    )


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
    sums: list[pa.Table],
) -> Outcome:
    """The last round's sum next to the raw plaintext sum and the clipped one it must equal (the
    ``sum`` table; every round's in ``sums``), every round's check, and the metrics (what the
    domain check clipped among them)."""
    metrics, tables, plaintext = _summary(
        cfg, params, rows, last.sum, reference, raw, cohorts, phase_seconds, simulated_seconds, sums
    )
    text = headline(cfg, params, last, metrics, plaintext)
    return Outcome(tables=tables, metrics=metrics, headline=text)


def _summary(
    cfg, params, rows, total, reference, raw, cohorts, phase_seconds, simulated_seconds, sums
) -> tuple[dict[str, Any], dict[str, pa.Table], np.ndarray]:
    """What every secure-sum outcome holds: the metrics, the ``sum``/``rounds``/``sums`` tables,
    and the raw plaintext sum as floats."""
    plaintext = to_float(raw, cfg.frac_bits)  # ±inf where the raw sum is beyond float64
    clipped = to_float(reference, cfg.frac_bits)
    metrics = {
        "exact": all(row["exact"] for row in rows),
        **_run_metrics(cfg, params, cohorts),
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
                "secure_sum": total,
                "plaintext_sum": plaintext,  # the raw inputs (no clip)
                "clipped_sum": clipped,  # what secure aggregation computes: the exactness check
            }
        ),
        "rounds": pa.Table.from_pylist(rows),
        "sums": pa.concat_tables(sums),
    }
    return metrics, tables, plaintext


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
    rounds = metrics["rounds"]
    if len(rounds) > 1:  # every round's survivors and check, not the last round's alone
        n = params.registry.size
        counts = ", ".join(f"{row['survivors']}/{n}" for row in rounds)
        wrong = [str(row["round"]) for row in rounds if not row["exact"]]
        verdict = "EXACT in every round" if not wrong else f"NOT EXACT in round {', '.join(wrong)}"
        what = (
            f"{len(rounds)} rounds of {params.dim}-vector sums, survivors {counts} (rounds "
            f"0-{rounds[-1]['round']}): {verdict}; the sum table holds the last round's, the "
            "sums table every round's"
        )
    else:
        what = (
            f"sum of {last.survivors.size}/{params.registry.size} survivors' {params.dim}-vectors "
            f"{verdict}"
        )
    text = (
        f"{what}; {graph}, Shamir threshold t={secagg.threshold}, at least "
        f"{secagg.min_survivors} survivors, mode={cfg.mode}; "
        f"threat model {secagg.threat_model}: {secagg.bounds()}"
    )
    if cfg.mode != "secure":
        text += f" [{STATEMENTS[cfg.mode].split(':')[0]}]"
    return text + weak_statement(cfg, secagg)


def weak_statement(cfg: SecureSumConfig, secagg) -> str:
    """For the headline: parameters accepted under allow_weak_params that miss the sigma / eta
    bounds, with the bounds they reach (a bound of 2^0 or more guarantees nothing)."""
    missed = []
    if secagg.log2_security_failure > -cfg.sigma:
        missed.append(
            f"log2 P[security failure] = {secagg.log2_security_failure:+.2f} (sigma asks "
            f"<= -{cfg.sigma:g})"
        )
    if secagg.log2_correctness_failure > -cfg.eta:
        missed.append(
            f"log2 P[abort] = {secagg.log2_correctness_failure:+.2f} (eta asks <= -{cfg.eta:g})"
        )
    if not missed:
        return ""
    void = (
        "; a bound of 2^0 or more guarantees nothing"
        if max(secagg.log2_security_failure, secagg.log2_correctness_failure) >= 0
        else ""
    )
    return f" [WEAK PARAMETERS (allow_weak_params): {', '.join(missed)}{void}]"


def _run_metrics(cfg: SecureSumConfig, params, cohorts: int) -> dict[str, Any]:
    """What every secure-sum run reports of its setting: mode, threat model, sizes, secure
    aggregation's graph, threshold and failure bounds, the ring."""
    secagg = params.secagg
    return {
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
    }


# --- hierarchical aggregation (hierarchy=revealed|secure) -----------------------------------------
def group_references(
    cfg: SecureSumConfig,
    plan: Plan,
    specs: list[RoundSpec],
    result: HierarchyResult,
    *,
    seed: int,
    round: int,
) -> dict[str, Any]:
    """Per group, the users whose input must be in its sum (its own registry, dropout drawn at the
    protocol's round, its own graph: the seed its server published; an aborted group's is the run
    seed outside secure mode, unknown in it) and their exact sums at the protocol's ``round``; a
    group is expected to abort when fewer than its quorum are left. In secure mode an aborted
    group's graph is unknown: its abort is expected when fewer users than the quorum answer up to
    the masked input (graph-independent); an abort at the unmask (or consistency) is taken as
    given, not predicted. The total's references are
    the sums over the groups expected to complete. Evaluation only: computed outside the protocol."""
    survivors, clipped, expected_dropped = [], [], []
    total, raw = 0, 0
    for g, spec in enumerate(specs):
        done = result.group_results[g]
        graph_seed = done.graph_seed if done is not None else None
        if graph_seed is None and cfg.mode != "secure":
            graph_seed = seed
        reg = spec.registry
        codes = drop_codes(spec.dropout, seed, spec.round, reg)
        if graph_seed is None:  # aborted in secure mode: the graph is the server's secret draw
            # graph-independent: fewer users answering up to the masked input than the quorum
            # abort the round before the unmask whatever the graph; an abort at the unmask (the
            # survivors' shares, which depend on the graph) is taken as given
            bound = int(np.count_nonzero(codes > INDEX["masked_input"]))
            phases = result.abort_phases or []
            at_unmask = g < len(phases) and phases[g] in ("consistency", "unmask")
            survivors.append(None)
            clipped.append(None)
            if bound < spec.min_survivors or at_unmask:
                expected_dropped.append(g)
            continue
        expected = expected_survivors(
            reg,
            codes,
            NeighbourGraph.build(reg.size, spec.degree, spec.complete, graph_seed, spec.round),
            spec.threshold,
        )
        if expected.size < spec.min_survivors:
            survivors.append(None)
            clipped.append(None)
            expected_dropped.append(g)
            continue
        ref, raw_g = _sums_of(cfg, plan, expected, round, seed)
        survivors.append(expected)
        clipped.append(ref)
        total, raw = total + ref, raw + raw_g
    dim = plan.params.dim
    zero = np.zeros(dim, dtype=np.int64)
    return {
        "survivors": survivors,
        "group_reference": clipped,
        "expected_dropped": expected_dropped,
        "reference": zero + total,
        "raw": zero + raw,
    }


def hierarchy_row(
    r: int, result: HierarchyResult, params: Params, check: dict[str, Any]
) -> dict[str, Any]:
    """Round ``r``'s line: exact when the dropped groups, every completed group's survivor count
    (and, in ``revealed``, its survivor set and sum) and the total are the references'."""
    enc = params.encoding
    exact = result.dropped == check["expected_dropped"] and np.array_equal(
        enc.signed(result.words), check["reference"]
    )
    for g, done in enumerate(result.group_results):
        want = check["survivors"][g]
        if done is None or want is None:
            continue
        exact = exact and result.group_counts[g] == want.size
        if result.variant == "revealed":
            exact = (
                exact
                and np.array_equal(done.survivors, want)
                and np.array_equal(enc.signed(done.words), check["group_reference"][g])
            )
    expected = sum(s.size for s in check["survivors"] if s is not None)
    return {
        "round": r,
        "exact": bool(exact),
        "hierarchy": result.variant,
        "groups": len(result.group_users),
        "groups_dropped": ",".join(str(g) for g in result.dropped),
        "expected_survivors": int(expected),
        "survivors": result.survivor_count,
        "group_survivors": ",".join("-" if c is None else str(c) for c in result.group_counts),
    }


def hierarchy_outcome(
    cfg: SecureSumConfig,
    params: Params,
    rows: list[dict[str, Any]],
    last: HierarchyResult,
    check: dict[str, Any],
    *,
    cohorts: int,
    phase_seconds: dict[str, float],
    simulated_seconds: list[dict[str, float]],
    sums: list[pa.Table],
) -> Outcome:
    """The last round's total beside its references, every round's check, what the master
    learned (the variant's statement, and in ``revealed`` the group sums table)."""
    metrics, tables, _ = _summary(
        cfg,
        params,
        rows,
        last.sum,
        check["reference"],
        check["raw"],
        cohorts,
        phase_seconds,
        simulated_seconds,
        sums,
    )
    learned = last.server_learned
    metrics["hierarchy"] = {
        "variant": last.variant,
        "groups": len(last.group_users),
        "group_sizes": [int(g.size) for g in last.group_users],
        "group_survivors": last.group_counts,
        "groups_dropped": last.dropped,
        "group_degree": [p.degree for p in params.group_secagg],
        "group_threshold": [p.threshold for p in params.group_secagg],
        "server_learned": learned,
        "aggregator_hosts": last.hosts,
    }
    group_sums = last.group_sums
    if group_sums is not None:  # revealed: what the master saw of each group
        done = [(g, v) for g, v in enumerate(group_sums) if v is not None]
        tables["group_sums"] = pa.table(
            {
                "group": np.repeat([g for g, _ in done], params.dim),
                "coordinate": np.tile(np.arange(params.dim), len(done)),
                "sum": np.concatenate([v for _, v in done]),
            }
        )
    verdict = "EXACT" if metrics["exact"] else "NOT EXACT"
    if len(rows) > 1:
        wrong = [str(row["round"]) for row in rows if not row["exact"]]
        verdict = "EXACT in every round" if not wrong else f"NOT EXACT in round {', '.join(wrong)}"
    g0 = params.group_secagg[0]
    text = (
        f"hierarchy={last.variant}: sum of {last.survivor_count}/{params.registry.size} "
        f"survivors' {params.dim}-vectors over {len(last.group_users)} groups {verdict}"
        f" ({len(rows)} round(s)); per group (largest) "
        f"{'complete graph' if g0.complete else 'Harary graph'} k={g0.degree}, t={g0.threshold}, "
        f"mode={cfg.mode}; the server learned: {learned}"
    )
    if cfg.mode != "secure":
        text += f" [{STATEMENTS[cfg.mode].split(':')[0]}]"
    return Outcome(tables=tables, metrics=metrics, headline=text)


# --- private mean estimation (dp_mechanism != none) ------------------------------------------------
def private_statement(cfg: SecureSumConfig, dp) -> str:
    """What the (ε, δ) of a private run protects, and against whom."""
    who = {
        "secure": "against a server that sees only the secure sum (SecAgg's assumptions, "
        f"threat model {cfg.threat_model})",
        "simulation": "against a server that sees only the secure sum — but simulation mode "
        "derives every key from the run's seed: NOT secure, a measurement of the mechanism",
        "dealer": "against a server that sees only the secure sum — but dealer mode is a scale "
        "simulation, NOT secure against the server (it holds every mask seed)",
    }[cfg.mode]
    return (
        "the released mean of the survivors' rows (each clipped to ℓ2 norm "
        f"{cfg.clip:g}; the decoded noisy sum over U3 divided by |U3|, which is public) is "
        f"(ε, δ)-DP for one user's row replaced by zero (zero-out: the user stays registered and "
        f"still sends its noise share; the registry is public), {who}; the noise is charged for the "
        f"worst accepted outcome, the {dp.quorum} honest users' shares of the smallest U3 secure "
        f"aggregation accepts ({dp.quorum + dp.corrupt} survivors less the {dp.corrupt} users "
        "its parameters assume colluding with the server, who know their own shares; more "
        "survivors only add noise)"
        + (
            "; add then remove: the survivors reveal excess share components once U3 is known "
            "(independent of the data and of the noise left, which stays at least the target; "
            "the removal trusts the server's count of survivors: semi-honest server)"
            if cfg.dp_dropout == "add-then-remove"
            else ""
        )
    )


def private_row(
    r: int, result: AggregationResult, survivors: np.ndarray, removed: int | None = None
) -> dict[str, Any]:
    """The round's line; with add then remove, how many survivors' excess came back."""
    extra = {} if removed is None else {"removed_excess": removed}
    return {
        "round": r,
        **extra,
        "survivors_as_expected": bool(np.array_equal(survivors, result.survivors)),
        "expected_survivors": int(survivors.size),
        "survivors": int(result.survivors.size),
        **{f"alive_{k}": v for k, v in result.counts.items()},
        "failed_cohorts": ",".join(result.failed_cohorts),
    }


def true_mean(plan: Plan, survivors: np.ndarray) -> np.ndarray:
    """Evaluation only: the mean of the survivors' (ℓ2-clipped) rows, from the plan's table."""
    dp = plan.params.dp
    table = plan.evaluation.table
    rows = np.searchsorted(table.column("user_id").to_numpy(), survivors)
    x = np.column_stack([table.column(c).to_numpy()[rows] for c in dp.columns])
    return x.mean(axis=0) if len(rows) else np.zeros(len(dp.columns))


def private_outcome(
    cfg: SecureSumConfig,
    plan: Plan,
    rows: list[dict[str, Any]],
    last: AggregationResult,
    released: np.ndarray,
    truth: np.ndarray,
    *,
    cohorts: int,
    phase_seconds: dict[str, float],
    simulated_seconds: list[dict[str, float]],
) -> Outcome:
    """The released mean beside the true one, its MSE beside the central continuous Gaussian's
    at the same (ε, δ) (evaluation only), the pipeline's numbers and the guarantee."""
    params: Params = plan.params
    dp = params.dp
    survivors = int(last.survivors.size)
    mse = float(np.mean((released - truth) ** 2))
    central = (dp.central_z * cfg.clip / max(survivors, 1)) ** 2
    metrics: dict[str, Any] = {
        **_run_metrics(cfg, params, cohorts),
        "dp_mechanism": dp.mechanism,
        "epsilon_target": dp.epsilon,
        "delta": dp.delta,
        "epsilon_charged": dp.charged_epsilon,
        "accountant": "tightest",
        "quorum": dp.quorum,
        "colluding_users": dp.corrupt,
        "survivors": survivors,
        "rows_clipped_to_l2": params.rows_clipped,
        "mse": mse,
        # evaluation only: no second release, the MSE a central continuous Gaussian at the same
        # (ε, δ) would give, (z·clip/|U3|)² with z calibrated under tightest
        "central_gaussian_mse_evaluation_only": central,
        "central_noise_multiplier": dp.central_z,
        "mse_ratio_to_central": mse / central,
        "phase_seconds": phase_seconds,
        "simulated_seconds": simulated_seconds,
        "simulated_round_seconds": [sum(r.values()) for r in simulated_seconds],
        "rounds": rows,
    }
    p = dp.pipeline
    removed = sum(row.get("removed_excess", 0) for row in rows[-1:])
    if p is not None:
        mech = dp.measurement.mechanism
        share = float(getattr(mech, "sigma2", None) or mech.variance)
        metrics.update(
            bits=p.bits,
            gamma=p.gamma,
            padded_dim=p.padded_dim,
            modular_clip_bound=p.modular_clip_bound(),
            inflation_bound=p.inflation_bound,
            l2_bound=p.l2_bound,
            l1_bound=p.l1_bound,
            share_variance=share,
            predicted_mse=_predicted(dp, survivors, removed),
            # the sum's noise variance per integer coordinate, against the target the event holds
            noise_variance_in_sum=dp.noise_variance(survivors, removed),
            target_noise_variance=dp.quorum * share,
            dp_dropout="add-then-remove" if dp.excess is not None else "worst-case",
        )
        if dp.excess is not None:
            metrics.update(
                levels=list(dp.levels),
                level=dp.levels[dp.level(survivors)],
                removed_excess=removed,
            )
    else:
        metrics.update(
            noise_multiplier=dp.noise_multiplier, predicted_mse=_predicted(dp, survivors)
        )
    tables = {
        "mean": pa.table(
            {
                "coordinate": np.arange(params.dim),
                "released_mean": released,
                "true_mean": truth,  # evaluation only
            }
        ),
        "rounds": pa.Table.from_pylist(rows),
    }
    pipe = (
        f"{p.bits} bits, γ={p.gamma:.4g}, modular-clipping bound {p.modular_clip_bound():.2g}, "
        f"norm inflation ≤ {p.inflation_bound:.4f}; "
        if p is not None
        else ""
    )
    mode = "" if cfg.mode == "secure" else f" [{STATEMENTS[cfg.mode].split(':')[0]}]"
    text = (
        f"private mean ({dp.mechanism}) of {survivors}/{params.registry.size} survivors' "
        f"{params.dim}-vectors: MSE {mse:.4g} per coordinate vs {central:.4g} for a central "
        f"continuous Gaussian at the same (ε, δ) [evaluation only] (ratio {mse / central:.3f}); "
        f"{pipe}(ε={dp.charged_epsilon:.4g}, δ={dp.delta:.3g})-DP, zero-out neighbours (one "
        "user's row replaced by zero, its share kept), "
        f"charged at the worst accepted outcome ({dp.quorum} honest users' shares: "
        f"{dp.quorum + dp.corrupt} survivors less {dp.corrupt} colluding)"
        + (
            f", add then remove: {removed} survivors removed their excess (noise in the sum ×"
            f"{dp.noise_variance(survivors, removed) / (dp.quorum * share):.3f} of the target, "
            f"{dp.corrupt} colluding users' part included)"
            if dp.excess is not None
            else ""
        )
        + f"; mode={cfg.mode}"
        f"{mode}"
    )
    return Outcome(
        tables=tables, metrics=metrics, headline=text + weak_statement(cfg, params.secagg)
    )


def _predicted(dp, survivors: int, removed: int = 0) -> float:
    """The released mean's expected MSE per coordinate from the noise (|U3| shares, less the
    excess removed) and, for the pipeline, the rounding's at most 1/4 per user and coordinate."""
    s = max(survivors, 1)
    if dp.pipeline is None:
        return (dp.noise_multiplier * dp.measurement.sensitivity) ** 2 / dp.quorum / s
    return (dp.noise_variance(s, removed) + s / 4) / (dp.pipeline.gamma**2 * s**2)
