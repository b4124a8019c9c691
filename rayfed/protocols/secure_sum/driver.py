"""The rounds of ``secure-sum``: one secure aggregation per round (every phase inside
:func:`rayfed.secagg.secure_sum`), each checked against the exact (clipped) sum of the expected survivors, the raw sum beside."""

from __future__ import annotations

import dataclasses

import numpy as np

from rayfed.federation import Group
from rayfed.protocols.base import Outcome, Plan
from rayfed.protocols.secure_sum import dp as private
from rayfed.protocols.secure_sum import report
from rayfed.protocols.secure_sum.config import SecureSumConfig
from rayfed.protocols.secure_sum.steps import synthetic_inputs, table_inputs
from rayfed.secagg import make_spec, secure_sum
from rayfed.secagg.hierarchy import AtRound, group_rounds, hierarchical_sum


def drive(fed, cfg: SecureSumConfig, plan: Plan) -> Outcome:
    params = plan.params
    if params.dp is not None:
        return _private(fed, cfg, plan)
    if params.group_registries:
        return _hierarchical(fed, cfg, plan)
    rows, clock, sums = [], [], []
    for r in range(cfg.rounds):
        with fed.round(r):
            spec = _spec(fed, cfg, params, r, params.dim)
            if params.columns:
                result = secure_sum(
                    fed.cohorts,
                    spec,
                    table_inputs,
                    (params.columns,),
                    server=fed.coordinator,
                    shards=fed.shards,
                )
            else:
                result = secure_sum(
                    fed.cohorts,
                    spec,
                    synthetic_inputs,
                    (params.dim, cfg.clip),
                    server=fed.coordinator,
                    shards=fed.shards,
                )
            _record(fed, params, result)
        survivors, reference, raw = report.reference(
            cfg,
            plan,
            spec,
            seed=fed.seed,
            graph_seed=result.graph_seed,
            faults=fed.injected_faults,
        )
        rows.append(report.round_row(r, result, params, survivors, reference))
        sums.append(report.round_sums(r, result, cfg, reference, raw))
        clock.append(params.schedule.simulated_seconds(fed.seed, r, params.registry))
    outcome = report.outcome(
        cfg,
        params,
        rows,
        result,
        reference,
        raw,
        cohorts=len(fed.cohorts),
        phase_seconds=fed.phase_seconds(),
        simulated_seconds=clock,
        sums=sums,
    )
    outcome.metrics["server_shards"] = max(1, len(fed.shards))
    return outcome


def _spec(fed, cfg: SecureSumConfig, params, r: int, dim: int):
    """Round ``r``'s secure aggregation over the plan's registry, ``dim`` words per user."""
    return make_spec(
        round=r,
        mode=cfg.mode,
        registry=params.registry,
        params=params.secagg,
        encoding=params.encoding,
        dim=dim,
        dropout=params.schedule,
        tag=fed.run_id.encode(),
        corrupt=cfg.corrupt_fraction,
    )


def _record(fed, params, result) -> None:
    """The round's survivors and dropouts, in the run's per-round record."""
    fed.record(
        survivors=int(result.survivors.size),
        dropouts=int(params.registry.size - result.survivors.size),
    )


def _private(fed, cfg: SecureSumConfig, plan: Plan) -> Outcome:
    """Private mean estimation: the release charged before its noise is drawn, the users' noisy
    rows (or ring words) summed, the coordinator's decoded sum over |U3|."""
    params = plan.params
    dp = params.dp
    rows, clock = [], []
    for r in range(cfg.rounds):
        with fed.round(r):
            fed.charge([dp.measurement.charge("run")])
            spec = _spec(fed, cfg, params, r, dp.width)
            result = secure_sum(
                fed.cohorts,
                spec,
                private.private_inputs,
                (dp,),
                server=fed.coordinator,
                shards=fed.shards,
            )
            removed = None
            if dp.excess is not None:
                words, removed = _remove(fed, dp, r, result, params.schedule)
                result = dataclasses.replace(result, words=words)
            _record(fed, params, result)
        survivors, _, _ = report.reference(
            cfg,
            plan,
            spec,
            seed=fed.seed,
            graph_seed=result.graph_seed,
            faults=fed.injected_faults,
            values=False,
        )
        rows.append(report.private_row(r, result, survivors, removed))
        clock.append(params.schedule.simulated_seconds(fed.seed, r, params.registry))
    released = private.release(dp, result, int(result.survivors.size))
    truth = report.true_mean(plan, result.survivors)
    outcome = report.private_outcome(
        cfg,
        plan,
        rows,
        result,
        released,
        truth,
        cohorts=len(fed.cohorts),
        phase_seconds=fed.phase_seconds(),
        simulated_seconds=clock,
    )
    outcome.metrics["server_shards"] = max(1, len(fed.shards))
    return outcome


def _remove(fed, dp, r: int, result, schedule):
    """Add then remove: the level the survivor count reaches, the survivors' excess (a cohort
    lost here leaves its users' excess in: more noise), subtracted from the sum's words. Only
    the survivors still online after unmask answer: one lost at unmask (its input already in the
    sum) keeps its whole share."""
    upto = dp.level(int(result.survivors.size))
    if upto == 0:
        return result.words, 0
    survivors = np.asarray(result.survivors)
    online = schedule.drop_phase(fed.seed, r, survivors) == len(schedule.phases)
    replies = fed.cohorts.run(
        private.remove_step,
        survivors[online],
        round=r,
        dp=dp,
        upto=upto,
        phase="remove_excess",
        on_failure="drop",
    )
    got = list(fed.get(replies).values())
    excess = sum((m["excess"] for m in got), np.zeros(dp.width, dtype=np.int64))
    removed = int(sum(len(m["ids"]) for m in got))
    return private.subtract(dp, result.words, excess), removed


def _hierarchical(fed, cfg: SecureSumConfig, plan: Plan) -> Outcome:
    """``hierarchy=revealed|secure`` (:mod:`rayfed.secagg.hierarchy`): each round, one SecAgg+
    round per group (its own spec: the finder's graph and threshold for its size, its own round
    number, so its own salt and masks), the group sums combined by the master or by a second
    secure sum among the aggregators; each group checked against its own reference."""
    params = plan.params
    columns = params.columns
    inputs, args = (
        (table_inputs, (columns,)) if columns else (synthetic_inputs, (params.dim, cfg.clip))
    )
    users = {name: t.column("user_id").to_numpy() for name, (t, _) in plan.cohorts.items()}
    n_groups = len(params.group_registries)
    hosts = list(params.aggregator_hosts)  # plan's placement: no group's users on its host
    rows, clock, sums = [], [], []
    for r in range(cfg.rounds):
        with fed.round(r):
            numbers, top_round = group_rounds(r, n_groups)
            specs = [
                make_spec(
                    round=numbers[g],
                    mode=cfg.mode,
                    registry=reg,
                    params=params.group_secagg[g],
                    encoding=params.encoding,
                    dim=params.dim,
                    dropout=AtRound.of(params.schedule, r),  # drawn at r, not numbers[g]
                    tag=fed.run_id.encode() + b"|group=%d" % g,
                    corrupt=cfg.corrupt_fraction,
                )
                for g, reg in enumerate(params.group_registries)
            ]
            extra = {}
            if cfg.hierarchy == "secure":
                extra = dict(
                    aggregators=[_on(fed, h) for h in hosts],
                    aggregator_members=_on(fed, *sorted(set(hosts))),
                    aggregator_hosts=hosts,
                    top_spec=make_spec(
                        round=top_round,
                        mode=cfg.mode,
                        registry=np.arange(n_groups, dtype=np.int64),
                        params=params.top_secagg,
                        encoding=params.encoding,
                        dim=params.dim,
                        tag=fed.run_id.encode() + b"|aggregators",
                        corrupt=0.0,
                    ),
                )
            result = hierarchical_sum(
                fed.cohorts,
                users,
                specs,
                inputs,
                args,
                round=r,
                variant=cfg.hierarchy,
                master=fed.coordinator,
                **extra,
            )
            fed.record(
                survivors=result.survivor_count,
                dropouts=int(params.registry.size - result.survivor_count),
                groups_dropped=len(result.dropped),
            )
        check = report.group_references(cfg, plan, specs, result, seed=fed.seed, round=r)
        rows.append(report.hierarchy_row(r, result, params, check))
        sums.append(report.round_sums(r, result, cfg, check["reference"], check["raw"]))
        clock.append(params.schedule.simulated_seconds(fed.seed, r, params.registry))
    return report.hierarchy_outcome(
        cfg,
        params,
        rows,
        result,
        check,
        cohorts=len(fed.cohorts),
        phase_seconds=fed.phase_seconds(),
        simulated_seconds=clock,
        sums=sums,
    )


def _on(fed, *names: str) -> Group:
    """The cohort actors ``names`` as a group of their own: an aggregator's one-member server
    (``hierarchy=secure``: the aggregators are simulated on cohort actors), or the aggregators'
    hosts as the members of the second sum."""
    group = Group(fed, "cohorts")
    group.handles = {n: fed.cohorts.handles[n] for n in names}
    return group
