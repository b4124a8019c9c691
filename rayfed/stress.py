"""``rayfed stress``: dropout-tolerance sweeps, written as a table, JSON and a plot.

For ``federated-mf`` (LFL) it runs the protocol at each dropout rate (applied in both rounds) and
records the test MSE, the ε spent and the iterations skipped below the threshold. For
``square-wave`` it records the estimate's error (W1, or the moments' mean error), the ε spent, the
share of users whose report did not arrive and the simulated round time. With ``sweep=(option,
values)`` both run at every value of one option (a population model's parameter, ε, ...), ``reps``
seeds each, and record the mean and standard deviation of each of these and the ε per point.

For ``secure-sum`` it runs the protocol at each dropout rate (0–50 % by default) and under four
adversarial patterns, and records for each whether the round completed with the exact sum or
aborted with BelowThreshold (which reveals nothing beyond the transcript), the survivors and the
time:

* ``exactly min_survivors`` — just enough users stay to the end (the global quorum): completes;
* ``min_survivors - 1``     — one user fewer: aborts;
(the users that drop are ``population.lost={unmask: [...]}``: lost after their masked input)

* ``whole cohort lost``     — a cohort actor exits during the masked input (``--fail
  cohort=K@phase=masked_input``): its users become dropouts; completes if enough users remain
  in the other cohorts;
* ``t / t-1 / no neighbour of one user`` — all but t (then t-1, then 0) of user 0's neighbours are
  lost at unmask: with t its self-mask is still rebuilt from t shares; with fewer it is
  not, the sparse graph's known failure mode, which the parameter finder makes unlikely for random
  dropouts but an adversary who knows the graph can force: aborts. (Not in secure mode on a
  sparse graph, which the server draws from the OS during the round.)

With ``sweep=(option, values)`` it instead runs ``secure-sum`` at every value of one option (a
population model's parameter, say ``markov_off``), ``reps`` seeds each, and records per point the
abort rate with its 95 % (Wilson) interval beside the parameter finder's bound — P[abort] <= 2^-η
while the dropout stays within ``tolerated_dropout``, so stated only at a point whose dropout is
within its own (:func:`abort_bound`) — the share of users missing from the sum (``not_in_sum``)
and the dropout observed, the users alive after each phase, wrong sums (there must be none), and
the simulated and wall time per round. Every row records the randomness its runs had.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from rayfed.errors import BelowThreshold, ConfigError
from rayfed.rundir import _atomic_write, check_out_dir, new_run_id

DEFAULT_RATES = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)
SUPPORTED = ("secure-sum", "federated-mf", "square-wave")


@dataclass(frozen=True)
class Point:
    """One point of a stress run: its key (stable across re-runs of the same sweep, so a resumed
    run knows it is done), the protocol runs it takes, and how to compute its row (calling
    ``tick`` after each run, for the progress bar)."""

    key: str
    runs: int
    compute: Callable[[Callable[[], None]], dict]


def log2_text(x: float) -> str:
    """``2^x`` with x to one decimal (a bound of 2^-1100 is not the 0 a float makes of it)."""
    text = f"{x:.1f}".rstrip("0").rstrip(".")
    return f"2^{text}"


def planned_dropout(cfg: dict[str, Any], faults: list[str] | None = None) -> float | None:
    """The share of its users a round loses by a run's own options where only i.i.d. rates
    decide it (``dropout`` and ``population.rates``, one after the other); None where a
    population model (markov, a trace, an outage, named users, latencies) or an injected fault
    decides it."""
    population = cfg.get("population") or {}
    if (
        faults
        or population.get("availability", "iid") != "iid"
        or population.get("latency", "none") != "none"
        or any(population.get(k) for k in ("lost", "outage", "outage_cohort", "outage_column"))
    ):
        return None
    keep = 1.0 - float(cfg.get("dropout") or 0.0)
    for rate in (population.get("rates") or {}).values():
        keep *= 1.0 - float(rate)
    return 1.0 - keep


def abort_bound(
    log2_bound: float | None, tolerated: float, dropout: float | None, how: str = ""
) -> dict[str, Any]:
    """The parameter finder's abort bound as a stress row states it. The finder bounds
    P[abort] <= 2^log2_bound only while the dropout stays within ``tolerated``: at a point whose
    ``dropout`` is above it there is no bound (``abort_bound_log2`` None), and at one whose
    dropout is unknown (None) the bound is stated with its condition only. ``how`` says where
    the dropout compared came from. (log2_bound None: no secure aggregation, no bound.)"""
    if log2_bound is None:
        return {"abort_bound_log2": None, "abort_bound": "none, no secure aggregation"}
    bound = (
        f"P[abort] = 0 at dropout <= {tolerated:g} (no round within it can abort)"
        if log2_bound == -math.inf
        else f"P[abort] <= {log2_text(log2_bound)} at dropout <= {tolerated:g}"
    )
    if dropout is None:
        return {
            "abort_bound_log2": None,
            "abort_bound": f"{bound}; not checked: the population model decides the dropout",
        }
    if dropout > tolerated + 1e-12:
        return {
            "abort_bound_log2": None,
            "abort_bound": f"none at dropout {dropout:.3g}{how}: the finder's bound holds at "
            f"dropout <= {tolerated:g} only",
        }
    return {"abort_bound_log2": float(log2_bound), "abort_bound": bound}


def planned_randomness(protocol: str, options: dict[str, Any], sets: list[str]) -> str:
    """The randomness a run of these options reconciles to (what :func:`rayfed.api.run` does):
    the record of a run that aborted, and so has no result to read it from."""
    from rayfed.api import resolve

    proto, run_opts, cfg = resolve(protocol, options, sets)
    return proto.resolve_randomness(cfg, run_opts.randomness)[1]


def _attempt(
    scenario: str, value: float | None, expected: str, options: dict[str, Any], sets: list[str]
) -> dict:
    from rayfed.api import run

    started = time.perf_counter()
    row = {"scenario": scenario, "dropout": value, "expected": expected}
    try:
        result = run("secure-sum", {**options, "out_dir": None}, sets=sets)
        (last,) = result.metrics["rounds"][-1:]
        row.update(
            outcome="complete" if result.metrics["exact"] else "WRONG SUM",
            survivors=last["survivors"],
            alive_unmask=last.get("alive_unmask"),
            randomness=result.privacy.randomness,
        )
    except BelowThreshold as err:
        row.update(
            outcome="aborted",
            survivors=err.alive,
            alive_unmask=None,
            phase=err.phase,
            randomness=planned_randomness("secure-sum", options, sets),
        )
    row["seconds"] = time.perf_counter() - started
    return row


def secure_sum_points(options: dict[str, Any], sets: list[str], rates) -> list[Point]:
    """Every scenario above, as points of one run each."""
    from rayfed.api import resolve
    from rayfed.protocols.secure_sum.report import statement

    proto, run_opts, cfg = resolve("secure-sum", options, sets)
    plan = proto.plan(cfg, run_opts.seed)
    note = statement(cfg)
    specs = [
        (
            "rate",
            float(rate),
            "complete" if rate <= cfg.tolerated_dropout else "may abort",
            {**options, "dropout": float(rate)},
        )
        for rate in rates
    ]
    specs += _adversarial_specs(options, plan, run_opts.seed, cfg.mode)

    def point(scenario: str, value: float, expected: str, opts: dict[str, Any]) -> Point:
        def compute(tick: Callable[[], None]) -> dict:
            row = _attempt(scenario, value, expected, opts, sets)
            tick()
            return {**row, "mode": cfg.mode, "security": note}

        return Point(f"rate={value!r}" if scenario == "rate" else scenario, 1, compute)

    return [point(*spec) for spec in specs]


def _adversarial_specs(
    options: dict[str, Any], plan, seed: int, mode: str
) -> list[tuple[str, float, str, dict[str, Any]]]:
    """Dropouts placed at the edge of what the parameters tolerate: exactly the minimum number of
    survivors and one fewer, a whole cohort, and one user's neighbourhood — except in secure
    mode on a sparse graph, which the server draws from the OS during the round: nobody can aim
    at a neighbourhood in advance, which is the point. (scenario, dropout, expected, options)
    each."""
    from rayfed.secagg.graph import NeighbourGraph

    params, registry = plan.params.secagg, plan.params.registry
    n = registry.size
    specs = []
    drop = n - params.min_survivors
    for name, count, expected in (
        ("exactly min_survivors", drop, "complete"),
        ("min_survivors - 1", drop + 1, "aborted"),
    ):
        specs.append((name, count / n, expected, _lost(options, registry[:count])))
    cohorts = sorted(plan.cohorts)
    lost = plan.cohorts[cohorts[-1]][0].num_rows
    specs.append(
        (
            "whole cohort lost",
            lost / n,
            "complete" if n - lost >= params.min_survivors else "aborted",
            {
                **options,
                "dropout": 0.0,
                "fail": [*(options.get("fail") or []), f"cohort={cohorts[-1]}@phase=masked_input"],
            },
        )
    )
    if mode == "secure" and not params.complete:  # the graph is drawn during the round
        return specs
    # one user's neighbourhood: keep exactly t of its neighbours (its self-mask is still
    # recoverable), then t - 1 (it is not), then none
    graph = NeighbourGraph.build(n, params.degree, params.complete, seed, 0)
    neighbours = registry[graph.neighbours(np.array([0]))[0]]
    t = params.threshold
    global_ok = n - (len(neighbours) - t) >= params.min_survivors
    for name, keep, expected in (
        ("t of one user's neighbours", t, "complete" if global_ok else "aborted"),
        ("t-1 of one user's neighbours", t - 1, "aborted"),
        ("no neighbour of one user", 0, "aborted"),
    ):
        gone = neighbours[keep:]
        specs.append((name, len(gone) / n, expected, _lost(options, gone)))
    return specs


def _lost(options: dict[str, Any], users: np.ndarray) -> dict[str, Any]:
    """``options`` with no i.i.d. dropout and ``users`` lost at unmask (after their masked input
    is in the sum) in every round, beside the users the options' own ``population.lost`` names
    (merged: its other phases kept, its unmask list joined)."""
    population = dict(options.get("population") or {})
    lost = {phase: list(ids) for phase, ids in (population.get("lost") or {}).items()}
    lost["unmask"] = sorted({int(u) for u in [*lost.get("unmask", []), *users.tolist()]})
    population["lost"] = lost
    return {**options, "dropout": 0.0, "population": population}


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson score interval of a proportion k / n."""
    if n == 0:
        return 0.0, 1.0
    p, z2 = k / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _repeat(options: dict[str, Any], sets: list[str], seed: int) -> dict:
    """One secure-sum run: its outcome, survivors, the users alive after each phase of its last
    round, and its simulated and wall time per round."""
    from rayfed.api import run

    started = time.perf_counter()
    try:
        result = run("secure-sum", {**options, "seed": seed, "out_dir": None}, sets=sets)
    except BelowThreshold as err:
        return {
            "outcome": "aborted",
            "survivors": err.alive,
            "users": None,
            "alive": err.alive,
            "phases": {},
            "randomness": None,
        }
    metrics = result.metrics
    rounds = metrics["rounds"]
    phases = {k: v for k, v in rounds[-1].items() if k.startswith("alive_")}
    return {
        "outcome": "complete" if metrics["exact"] else "WRONG SUM",
        "survivors": rounds[-1]["survivors"],
        "users": metrics["users"],
        # alive after the last phase (of the last round): the dropout the finder's bound is about
        "alive": list(phases.values())[-1] if phases else rounds[-1]["survivors"],
        "randomness": result.privacy.randomness,
        "phases": phases,
        "simulated": float(np.mean(metrics["simulated_round_seconds"])),
        "wall": (time.perf_counter() - started) / len(rounds),
    }


def sweep_points(
    options: dict[str, Any], sets: list[str], option: str, values: list[str], reps: int
) -> list[Point]:
    """secure-sum at every value of ``option``, ``reps`` seeds each (see the module's
    docstring); each value's parameters resolved here, before any run."""
    import dataclasses

    from rayfed.api import resolve

    first = int(options.get("seed", 0))

    def point(value: str) -> Point:
        point_sets = [*sets, f"{option}={value}"]
        proto, run_opts, cfg = resolve("secure-sum", options, point_sets)
        params = proto.plan(cfg, run_opts.seed).params
        secagg, users = params.secagg, params.registry.size
        # what a run of this point reconciles its randomness to (an aborted run has no result)
        randomness = proto.resolve_randomness(cfg, run_opts.randomness)[1]
        planned = planned_dropout(dataclasses.asdict(cfg), run_opts.fail)

        def compute(tick: Callable[[], None]) -> dict:
            runs = []
            for r in range(reps):
                runs.append(_repeat(options, point_sets, first + r))
                tick()
            for run in runs:
                run["randomness"] = run["randomness"] or randomness
            return _sweep_row(option, value, reps, runs, secagg, cfg, planned, users)

        return Point(f"{option}={value}", reps, compute)

    return [point(value) for value in values]


def _sweep_row(
    option: str,
    value: str,
    reps: int,
    runs: list[dict],
    secagg,
    cfg,
    planned: float | None,
    users: int,
) -> dict:
    """One point of a secure-sum sweep. ``not_in_sum`` is the share of users whose input is
    missing from the sum (completed runs): a user lost at unmask is still summed. The finder's
    bound is stated where the point's dropout is within its ``tolerated_dropout``: the dropout
    its options ask (``planned``, i.i.d. rates only), else the one observed over every run
    (users lost by the end of the round, or by its abort)."""
    done = [r for r in runs if r["outcome"] != "aborted"]
    aborts = reps - len(done)
    low, high = wilson(aborts, reps)
    phases = list(done[0]["phases"]) if done else []  # in the protocol's order
    observed = float(np.mean([1 - r["alive"] / (r["users"] or users) for r in runs]))
    dropout = planned if planned is not None else observed
    how = " (asked)" if planned is not None else " (observed)"
    kinds = sorted({r["randomness"] for r in runs})
    return {
        "scenario": "sweep",
        "option": option,
        "value": value,
        "not_in_sum": float(np.mean([1 - r["survivors"] / r["users"] for r in done]))
        if done
        else None,
        "observed_dropout": observed,
        "reps": reps,
        "aborts": aborts,
        "abort_rate": aborts / reps,
        "abort_ci_low": low,
        "abort_ci_high": high,
        **abort_bound(secagg.log2_correctness_failure, cfg.tolerated_dropout, dropout, how),
        "tolerated_dropout": cfg.tolerated_dropout,
        "wrong_sums": sum(r["outcome"] == "WRONG SUM" for r in runs),
        **{p: float(np.mean([r["phases"].get(p, 0) for r in done])) for p in phases},
        "simulated_round_seconds": float(np.mean([r["simulated"] for r in done])) if done else None,
        "wall_round_seconds": float(np.mean([r["wall"] for r in done])) if done else None,
        "mode": cfg.mode,
        # every run's own (a mix would be a bug: stated, never averaged away)
        "randomness": kinds[0] if len(kinds) == 1 else "mixed: " + ", ".join(kinds),
        "outcome": f"{aborts}/{reps} aborted",
        "expected": "no wrong sum; aborts rare while the dropout is within tolerated",
    }


#: a bound below this share of the abort-rate axis is stated in words, not drawn: a line at the
#: axis' zero would read as the observed rate touching it
VISIBLE_BOUND = 0.01


def _draw_bounds(ax, x, rows: list[dict]) -> None:
    """The parameter finder's P[abort] bound at each point where it applies (its dropout within
    its tolerated_dropout): drawn where it is visible on the linear axis, else written on the
    plot as 2^x with its condition; the points where no bound applies are named."""
    shown = [
        (xi, r) for xi, r in zip(x, rows, strict=True) if r.get("abort_bound_log2") is not None
    ]
    drawn = [(xi, 2.0 ** r["abort_bound_log2"]) for xi, r in shown]
    drawn = [(xi, b) for xi, b in drawn if b >= VISIBLE_BOUND]
    if drawn:
        tolerated = sorted({f"{r['tolerated_dropout']:g}" for _, r in shown})
        ax.plot(*zip(*drawn, strict=True), "_", ms=18, mew=2, color="tab:red",
                label=f"finder's bound (at dropout <= {', '.join(tolerated)})")  # fmt: skip
    tiny = [r for _, r in shown if 2.0 ** r["abort_bound_log2"] < VISIBLE_BOUND]
    lines = [
        f"finder's bound: {r['abort_bound']}"
        + ("" if r["abort_bound_log2"] == -math.inf else "\n(too small to draw)")
        for r in {r["abort_bound"]: r for r in tiny}.values()
    ]
    none = [str(r["value"]) for r in rows if r.get("abort_bound_log2") is None]
    if none:
        lines.append(
            f"no bound at {rows[0]['option']}={', '.join(none)}:\nits dropout is above "
            "tolerated_dropout"
        )
    if lines:
        ax.text(0.02, 0.93, "\n".join(lines), transform=ax.transAxes, fontsize=7,
                color="tab:red", va="top")  # fmt: skip


def plot_sweep(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = np.arange(len(rows))
    labels = [str(r["value"]) for r in rows]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.2))
    rate = np.array([r["abort_rate"] for r in rows])
    err = [rate - [r["abort_ci_low"] for r in rows], [r["abort_ci_high"] for r in rows] - rate]
    ax1.errorbar(x, rate, yerr=err, fmt="o", capsize=4, label="observed (95 % interval)")
    _draw_bounds(ax1, x, rows)
    ax1.set(ylabel="abort rate", title="aborts", ylim=(-0.05, 1.05))
    ax1.legend(fontsize=8)
    names = next((list(r) for r in rows if any(k.startswith("alive_") for k in r)), [])
    for name in [k for k in names if k.startswith("alive_")]:
        ax2.plot(x, [r.get(name) for r in rows], marker="o", label=name.removeprefix("alive_"))
    ax2.set(ylabel="users alive after the phase (completed runs)", title="survivors")
    ax2.legend(fontsize=8)
    ax3.plot(x, [r["simulated_round_seconds"] for r in rows], marker="o", label="simulated")
    ax3.plot(x, [r["wall_round_seconds"] for r in rows], marker="s", label="wall")
    ax3.set(ylabel="seconds per round", title="time")
    ax3.legend(fontsize=8)
    for ax in (ax1, ax2, ax3):
        ax.set_xticks(x, labels)
        ax.set_xlabel(rows[0]["option"])
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def measure(protocol: str, result) -> dict[str, Any]:
    """What a stress row records of one run: the utility, the ε spent and who took part."""
    m = result.metrics
    if protocol == "federated-mf" and "iterations" not in m:  # VFL, HFL: no dropout, no SecAgg
        return {"test_mse": m["test_mse"], "epsilon": result.privacy.epsilon}
    if protocol == "federated-mf":
        done = [row for row in m["iterations"] if not row["skipped"]]
        return {
            "test_mse": m["test_mse"],
            "epsilon": result.privacy.epsilon,
            "skipped": len(m["skipped_iterations"]),
            "iterations": len(m["iterations"]),
            # survivors of each secure-aggregation round, over the iterations that completed
            "alive_round1": float(np.mean([r["u1"] for r in done])) if done else 0.0,
            # (method=gd-dr has one round of reports: no Round 2)
            "alive_round2": float(np.mean([r.get("u2", 0) for r in done])) if done else 0.0,
            # stated where the run's dropout is within ω (None for gd-dr: no secure aggregation)
            **abort_bound(
                m["secagg_log2_abort_bound"],
                m["tolerated_dropout"],
                planned_dropout(result.config["protocol"], result.config["run"].get("fail")),
            ),
            "tolerated_dropout": m["tolerated_dropout"],
        }
    error = "wasserstein" if "wasserstein" in m else "mean_error"
    if error not in m and "range_error_0.1" not in m:
        raise ConfigError(
            "evaluate", "a square-wave stress measures the error against the raw values", "true"
        )
    return {
        "error": m.get(error, m.get("range_error_0.1")),
        "error_metric": error if error in m else "range_error_0.1",
        "epsilon": result.privacy.epsilon,
        "observed_dropout": m["dropout"],
        "reports": sum(m["reports"]),
        "simulated_round_seconds": float(np.mean(m["simulated_round_seconds"])),
    }


#: measures every seed of a point shares (its options decide them): kept, not averaged
PER_POINT = ("abort_bound_log2", "tolerated_dropout")

#: the utility a rate or sweep row plots, per protocol
UTILITY = {"federated-mf": "test_mse", "square-wave": "error"}


def abort_stats(measured: list[dict]) -> dict[str, Any]:
    """LFL: iterations skipped below the threshold (an aborted secure aggregation) over every
    iteration of every seed, with the 95 % Wilson interval; nothing for a protocol without
    aborts (square-wave's LDP reports)."""
    if "skipped" not in measured[0]:
        return {}
    aborts = int(sum(m["skipped"] for m in measured))
    trials = int(sum(m["iterations"] for m in measured))
    low, high = wilson(aborts, trials)
    return {
        "aborts": aborts,
        "abort_rate": aborts / trials if trials else 0.0,
        "abort_ci_low": low,
        "abort_ci_high": high,
    }


def rate_points(protocol: str, options: dict[str, Any], sets: list[str], rates) -> list[Point]:
    """``protocol`` at each dropout rate (for LFL in both rounds): utility, ε and who took
    part."""
    from rayfed.api import run

    def point(rate: float) -> Point:
        def compute(tick: Callable[[], None]) -> dict:
            started = time.perf_counter()
            result = run(protocol, {**options, "out_dir": None, "dropout": rate}, sets=sets)
            tick()
            measured = measure(protocol, result)
            return {
                "scenario": "rate",
                "dropout": rate,
                **measured,
                **abort_stats([measured]),
                "mode": result.metrics.get("mode", "ldp"),
                "randomness": result.privacy.randomness,
                "outcome": "complete",
                "expected": "complete",
                "seconds": time.perf_counter() - started,
            }

        return Point(f"rate={rate!r}", 1, compute)

    return [point(float(rate)) for rate in rates]


def value_points(
    protocol: str,
    options: dict[str, Any],
    sets: list[str],
    option: str,
    values: list[str],
    reps: int,
) -> list[Point]:
    """``protocol`` at every value of ``option``, ``reps`` seeds each: the mean and standard
    deviation over the seeds of every measure, and the ε each point spends."""
    from rayfed.api import run

    first = int(options.get("seed", 0))

    def point(value: str) -> Point:
        point_sets = [*sets, f"{option}={value}"]

        def compute(tick: Callable[[], None]) -> dict:
            started = time.perf_counter()
            runs = []
            for r in range(reps):
                opts = {**options, "seed": first + r, "out_dir": None}
                runs.append(run(protocol, opts, sets=point_sets))
                tick()
            measured = [measure(protocol, r) for r in runs]
            row = {"scenario": "sweep", "option": option, "value": value, "reps": reps}
            for key, v in measured[0].items():
                if isinstance(v, str) or v is None or key in PER_POINT:
                    row[key] = v
                    continue
                column = np.array([m[key] for m in measured], dtype=float)
                row[key] = float(column.mean())
                row[f"{key}_sd"] = float(column.std(ddof=1)) if reps > 1 else 0.0
            row.update(abort_stats(measured))
            kinds = sorted({r.privacy.randomness for r in runs})
            row.update(
                mode=runs[0].metrics.get("mode", "ldp"),
                randomness=kinds[0] if len(kinds) == 1 else "mixed: " + ", ".join(kinds),
                outcome="complete",
                expected="complete",
                dropout=row.get("observed_dropout"),
                wall_seconds=(time.perf_counter() - started) / reps,
            )
            return row

        return Point(f"{option}={value}", reps, compute)

    return [point(value) for value in values]


def plot_utility(rows: list[dict], path: Path, title: str, protocol: str) -> None:
    """Utility (± sd over seeds for a sweep) and ε per point; LFL's skipped iterations or the
    square-wave's observed dropout beside them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = UTILITY[protocol]
    sweep = rows[0]["scenario"] == "sweep"
    x = np.arange(len(rows)) if sweep else [100 * r["dropout"] for r in rows]
    xlabel = rows[0]["option"] if sweep else "dropout per round (%)"
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    ylabel = "test MSE" if key == "test_mse" else rows[0]["error_metric"]
    ax1.errorbar(x, [r[key] for r in rows], yerr=[r.get(f"{key}_sd", 0) for r in rows], marker="o")
    ax1.set(xlabel=xlabel, ylabel=ylabel, title="utility")
    eps = ax1.twinx()
    eps.plot(x, [r["epsilon"] for r in rows], color="tab:gray", ls="--", marker=".")
    eps.set_ylabel("ε spent", color="tab:gray")
    if protocol == "federated-mf" and "skipped" not in rows[0]:  # VFL, HFL: no dropouts
        ax2.set_visible(False)
    elif protocol == "federated-mf":
        ax2.bar(x, [r["skipped"] for r in rows], width=0.6 if sweep else 6, color="tab:red")
        ax2.set(ylabel="iterations skipped (below threshold)", title="aborts")
    else:
        ax2.plot(x, [100 * r["observed_dropout"] for r in rows], marker="o")
        ax2.set(ylabel="users whose report did not arrive (%)", title="dropouts")
    ax2.set_xlabel(xlabel)
    for ax in (ax1, ax2):
        if sweep:
            ax.set_xticks(x, [str(r["value"]) for r in rows])
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = [r for r in rows if r["scenario"] == "rate"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    rates = [100 * r["dropout"] for r in sweep]
    ok = [r["outcome"] == "complete" for r in sweep]
    ax1.bar(rates, [1] * len(rates), width=6, color=["tab:green" if o else "tab:red" for o in ok])
    for x, r in zip(rates, sweep, strict=True):
        ax1.text(
            x, 0.5, r["outcome"], rotation=90, ha="center", va="center", color="white", fontsize=9
        )
    ax1.set(
        xlabel="dropout after masked input (%)", yticks=[], title="round outcome per dropout rate"
    )
    ax2.plot(rates, [r["seconds"] for r in sweep], marker="o")
    ax2.set(xlabel="dropout after masked input (%)", ylabel="seconds per run", title="time")
    ax2.grid(alpha=0.3)
    patterns = [r for r in rows if r["scenario"] != "rate"]
    text = "\n".join(
        f"{r['scenario']}: {r['outcome']} (expected {r['expected']})" for r in patterns
    )
    fig.suptitle(title)
    fig.text(0.5, -0.02, text, ha="center", va="top", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def points(
    protocol: str,
    options: dict[str, Any],
    sets: list[str],
    rates=DEFAULT_RATES,
    sweep: tuple[str, list[str]] | None = None,
    reps: int = 5,
) -> list[Point]:
    """The points of one stress run, every one's configuration checked (a ConfigError names the
    option) before any protocol runs."""
    from rayfed.api import resolve

    if protocol not in SUPPORTED:
        raise ConfigError("protocol", f"no stress test for {protocol!r}", SUPPORTED)
    if reps < 1:
        raise ConfigError("--reps", f"must be at least 1, got {reps}")
    if sweep is not None:
        option, values = sweep
        if not option or not values or any(not v.strip() for v in values):
            raise ConfigError(
                "--sweep", f"expected OPTION=V1,V2,... with no empty value, got {sweep!r}"
            )
        checks = [[*sets, f"{option}={value}"] for value in values]
        for point_sets in checks:
            resolve(protocol, options, point_sets)
    else:
        for rate in rates:
            if not (isinstance(rate, (int, float)) and math.isfinite(rate) and 0 <= rate <= 1):
                raise ConfigError("--rates", f"a dropout rate must lie in [0, 1], got {rate!r}")
        _check_setting(protocol, options, sets)
        for rate in rates:
            try:
                resolve(protocol, {**options, "dropout": float(rate)}, sets)
            except ConfigError as err:  # the protocol's own range of its dropout option
                if err.field != "dropout":
                    raise
                raise ConfigError("--rates", f"rate {rate:g}: {err.problem}", err.allowed) from err
    if sweep is not None and protocol == "secure-sum":
        return sweep_points(options, sets, *sweep, reps)
    if sweep is not None:
        return value_points(protocol, options, sets, *sweep, reps)
    if protocol == "secure-sum":
        return secure_sum_points(options, sets, rates)
    return rate_points(protocol, options, sets, rates)


def _check_setting(protocol: str, options: dict[str, Any], sets: list[str]) -> None:
    """A dropout sweep of federated-mf needs the LFL setting (VFL and HFL parties have no
    dropout: their sweeps go through ``--sweep``)."""
    if protocol != "federated-mf":
        return
    from rayfed.api import resolve

    _, _, cfg = resolve(protocol, options, sets)
    if cfg.setting != "lfl":
        raise ConfigError(
            "setting",
            f"rayfed stress federated-mf varies the dropout rate, which only setting=lfl has "
            f"(got setting={cfg.setting})",
            "setting=lfl, or --sweep OPTION=V1,V2,... (e.g. --sweep epsilon=0.5,1,2) to sweep "
            f"another option of setting={cfg.setting}",
        )


def parse_rates(text: str) -> list[float]:
    """``--rates 0,0.1,0.2``: dropout rates, numbers (their range is checked by :func:`points`)."""
    rates = []
    for item in text.split(","):
        try:
            rate = float(item)
        except ValueError:
            raise ConfigError(
                "--rates",
                f"{item.strip()!r} in {text!r} is not a number"
                if item.strip()
                else f"an empty rate in {text!r}",
                "comma-separated dropout rates in [0, 1], e.g. --rates 0,0.1,0.2",
            ) from None
        rates.append(rate)
    return rates


def stress(
    protocol: str,
    options: dict[str, Any],
    sets: list[str],
    rates=DEFAULT_RATES,
    out_dir: str | Path = "runs",
    sweep: tuple[str, list[str]] | None = None,
    reps: int = 5,
    *,
    progress: bool = False,
    resume: bool = True,
) -> Path:
    """Run the sweep into a stress directory ``<out_dir>/stress-<protocol>-<time>-<hex>/`` and
    return it.

    Each point is written as it finishes: a line of ``points.jsonl`` and the whole
    ``stress.parquet`` and ``stress.json`` so far (the JSON's ``status`` is ``running``, then
    ``complete``, ``interrupted`` or ``failed``); ``stress.png`` at the end (also after an
    interruption, of the points that finished). With ``resume`` (the default), an unfinished
    stress directory under ``out_dir`` of the same protocol, options, rates or sweep and reps,
    that no other process is writing, is taken up again: its finished points are skipped (said
    on stderr). Bad options, rates or ``out_dir`` are ConfigErrors before any protocol runs.
    """
    todo = points(protocol, options, sets, rates, sweep, reps)
    spec = {
        "protocol": protocol,
        "options": options,
        "sets": list(sets),
        "rates": None if sweep else [float(r) for r in rates],
        "sweep": None if sweep is None else [sweep[0], list(sweep[1])],
        "reps": reps if sweep else 1,
    }
    store = StressDir.open(out_dir, spec, resume=resume)
    done = store.rows
    finished = [p for p in todo if p.key in done]
    if finished:
        print(
            f"rayfed stress: resuming {store.path}: {len(finished)} of {len(todo)} points "
            "already finished, skipped",
            file=sys.stderr,
        )
    bar = tqdm(
        total=sum(p.runs for p in todo),
        initial=sum(p.runs for p in finished),
        desc=f"stress {protocol}",
        unit="run",
        disable=not progress,
        leave=False,
        mininterval=0,  # a point takes a run or more: draw every one (tqdm skips updates <0.1 s)
    )
    status, error = "failed", None
    try:
        for point in todo:
            if point.key in done:
                continue
            bar.set_postfix_str(point.key, refresh=False)
            store.add(point.key, point.compute(lambda: bar.update(1)))
        status = "complete"
    except KeyboardInterrupt as err:
        status = "interrupted"
        err.stress_dir = (store.path, len(store.rows), len(todo))  # what the CLI's line says
        raise
    except BaseException as err:
        error = f"{type(err).__name__}: {err}"
        raise
    finally:
        bar.close()
        rows = [store.rows[p.key] for p in todo if p.key in store.rows]
        store.finish(rows, status, error, len(todo))
        if rows and status != "failed":
            with contextlib.suppress(Exception):  # a partial table's plot is a bonus
                _plot(protocol, rows, store.path / "stress.png", sweep is not None)
    return store.path


def _plot(protocol: str, rows: list[dict], path: Path, sweep: bool) -> None:
    title = f"{protocol} ({rows[0]['mode']} mode): dropout tolerance"
    if protocol != "secure-sum":
        plot_utility(rows, path, title, protocol)
    else:
        (plot_sweep if sweep else plot)(rows, path, title)


class StressDir:
    """One stress run's directory, held under an exclusive lock (``.lock``, released when the
    process ends, however it ends) so that no two processes write it."""

    def __init__(self, path: Path, spec: dict[str, Any], lock, rows: dict[str, dict]):
        self.path, self.spec, self._lock, self.rows = path, spec, lock, rows

    @staticmethod
    def open(out_dir: str | Path, spec: dict[str, Any], *, resume: bool) -> StressDir:
        out = _writable(out_dir)
        if resume:
            for path in sorted(out.glob(f"stress-{spec['protocol']}-*"), reverse=True):
                taken = StressDir._take(path, spec)
                if taken is not None:
                    return taken
        for _ in range(10):  # a name another run took in the same second: draw again
            path = out / new_run_id(f"stress-{spec['protocol']}")
            try:
                path.mkdir()
                break
            except FileExistsError:
                continue
            except OSError as err:
                raise _out_error(out_dir, err) from err
        lock = _lock(path)
        store = StressDir(path, spec, lock, {})
        store._write([], "running", None, None)
        return store

    @staticmethod
    def _take(path: Path, spec: dict[str, Any]) -> StressDir | None:
        """``path`` if it is an unfinished stress directory of ``spec`` that nobody holds."""
        try:
            record = json.loads((path / "stress.json").read_text())
        except (OSError, ValueError):
            return None
        if record.get("status") == "complete" or _canonical(record.get("spec")) != _canonical(spec):
            return None
        try:
            lock = _lock(path)
        except BlockingIOError:  # another process is writing it
            return None
        rows: dict[str, dict] = {}
        with contextlib.suppress(FileNotFoundError), open(path / "points.jsonl") as handle:
            for line in handle:
                with contextlib.suppress(ValueError):  # a line cut short by a crash
                    entry = json.loads(line)
                    rows[entry["point"]] = entry["row"]
        return StressDir(path, spec, lock, rows)

    def add(self, key: str, row: dict) -> None:
        """One finished point: a line of points.jsonl (synced), then the tables so far."""
        self.rows[key] = row
        line = json.dumps({"point": key, "row": row}, default=str)
        with open(self.path / "points.jsonl", "a") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self._write(list(self.rows.values()), "running", None, None)

    def finish(self, rows: list[dict], status: str, error: str | None, total: int) -> None:
        self._write(rows, status, error, total)
        with contextlib.suppress(OSError):
            self._lock.close()

    def _write(self, rows: list[dict], status: str, error: str | None, total: int | None) -> None:
        record = {
            "protocol": self.spec["protocol"],
            "status": status,
            "points_finished": len(rows),
            "points": total,
            "options": self.spec["options"],
            "sets": self.spec["sets"],
            "spec": self.spec,
            **randomness_of(rows),
            "rows": rows,
        }
        if error:
            record["error"] = error
        text = json.dumps(record, indent=2, default=str) + "\n"
        if rows:
            _atomic_write(self.path / "stress.parquet", lambda p: pq.write_table(_table(rows), p))
        _atomic_write(self.path / "stress.json", lambda p: p.write_text(text))


def randomness_of(rows: list[dict]) -> dict[str, Any]:
    """The randomness the runs of these rows had (each row records its own runs'), and its
    statement: one for all, or ``mixed`` naming which points had which (never one picked)."""
    from rayfed.privacy.source import STATEMENTS

    kinds = list(dict.fromkeys(r.get("randomness") for r in rows if r.get("randomness")))
    if not kinds:
        return {}
    if len(kinds) == 1 and kinds[0] in STATEMENTS:
        return {"randomness": kinds[0], "randomness_statement": STATEMENTS[kinds[0]]}
    points = {
        kind: [str(r.get("value", r.get("dropout", r["scenario"]))) for r in rows
               if r.get("randomness") == kind]
        for kind in kinds
    }  # fmt: skip
    return {
        "randomness": "mixed",
        "randomness_statement": "the points' runs differ in randomness: "
        + "; ".join(f"{kind} at {', '.join(at)}" for kind, at in points.items()),
    }


def _table(rows: list[dict]) -> pa.Table:
    """The rows as one table, every column any row has (a row without it: null)."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    return pa.Table.from_pylist([{key: row.get(key) for key in columns} for row in rows])


def _canonical(spec: Any) -> str:
    return json.dumps(spec, sort_keys=True, default=str)


def _lock(path: Path):
    """An exclusive, non-blocking lock on ``path/.lock`` (BlockingIOError if held)."""
    import fcntl

    handle = open(path / ".lock", "a")  # noqa: SIM115 - held open for the run's life
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        handle.close()
        raise
    return handle


def _writable(out_dir: str | Path) -> Path:
    """``out_dir`` as a directory this process can write in (created if missing), or a
    ConfigError naming ``--out``."""
    out = Path(out_dir)
    check_out_dir(out, "--out")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise _out_error(out_dir, err) from err
    return out


def _out_error(out_dir: str | Path, err: OSError) -> ConfigError:
    return ConfigError(
        "--out",
        f"cannot create the stress directory under {str(out_dir)!r}: {err.strerror or err}",
        "a writable directory (created if missing)",
    )
