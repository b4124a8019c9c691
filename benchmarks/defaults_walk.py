"""Defaults walk (issue 30, item 5): every protocol's default run at ε = 0.5, 1, 4, 8, seeds 0-2.

    python benchmarks/defaults_walk.py [--only PROTOCOL ...] [--out benchmarks/results/defaults_walk.json]

Each cell is one protocol run with its defaults and only ε changed (``rayfed.run(name,
backend="local", out_dir=None, epsilon=e, seed=s)``), or one mode-like option whose default
differs (a method, task, aggregation, mechanism, setting) and nothing else. Its headline quality
metric is recorded as mean ± sample sd over seeds 0, 1, 2, beside the non-private reference where
the protocol has one (a non-private method of the same protocol, run once per seed, or the
evaluation-only reference the run itself reports).

Two runs use another *equivalent* option so the walk fits its budget: secure-sum and LFL
federated-mf run their secure aggregation in ``dealer`` mode, whose sums are bit-identical to the
default ``simulation`` (DESIGN.md; checked here on secure-sum gaussian/skellam at ε = 4, seed 1,
and on LFL at ε = 1, seed 0: the same MSE to the last bit).

A cell is **flagged** when its metric should improve with ε and does not: no pair of ε (lower,
higher) has the higher one's mean better by more than the two seed spreads (sd) together
(``flat``), or one step up in ε makes it worse by more than the two spreads (``worsens``, even
where both ends sit at the reference). A cell that does not worsen and whose both ends already
sit at the non-private reference (within the spreads: nothing left to gain) is
``at-reference``. A step whose mean is worse within the spreads is listed as a dip, not flagged.
federated-mf is report-only (issue 30's items 1–4 own its defaults). The budget is about 5 minutes on 2 shared cores.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import rayfed
from rayfed.errors import ConfigError

EPSILONS = (0.5, 1.0, 4.0, 8.0)
SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class Cell:
    """One protocol run shape of the walk."""

    protocol: str
    label: str
    options: dict[str, Any]
    metric: str  # a key of Result.metrics, or a name of METRICS below
    higher_is_better: bool = False
    #: the non-private reference: another run of the same protocol (its options), ε-free
    reference_run: dict[str, Any] | None = None
    #: or a key of the run's own metrics (an evaluation-only reference)
    reference_key: str | None = None
    report_only: bool = False
    note: str = ""
    extra: tuple[str, ...] = field(default=())  # further metrics recorded beside the headline


#: derived metrics: name -> function of Result.metrics
METRICS = {
    "l1_relative_error": lambda m: abs(m["error"]) / abs(m["true"]),
    "abs_relative_error": lambda m: abs(m["relative_error"]),
}

CELLS: list[Cell] = [
    Cell("pattern-count", "default (calibration=paper)", {}, "rmse", extra=("mean_predicted_sd",)),
    Cell("pattern-count", "calibration=exact", {"calibration": "exact"}, "rmse"),
    *(
        Cell(
            "secure-sum",
            f"dp_mechanism={m}",
            {"dp_mechanism": m, "mode": "dealer"},
            "mse",
            reference_key="central_gaussian_mse_evaluation_only",
            note="default dp_mechanism=none has no ε; reference: the central continuous "
            "Gaussian at the same (ε, δ) (evaluation only); the non-private error is 0",
            extra=("mse_ratio_to_central", "predicted_mse"),
        )
        for m in ("gaussian", "ddg", "skellam")
    ),
    *(
        Cell(
            "square-wave",
            f"method={m}" + (" (default)" if m == "sw-ems" else ""),
            {"method": m},
            metric,
        )
        for m, metric in (
            ("sw-ems", "wasserstein"),
            ("sw-em", "wasserstein"),
            ("cfo", "wasserstein"),
            ("hh-admm", "wasserstein"),
            ("hh", "range_error_0.1"),
            ("haar-hrr", "range_error_0.1"),
            ("sr", "mean_error"),
            ("pm", "mean_error"),
        )
    ),
    *(
        Cell(
            "vfl-kmeans",
            f"method={m}" + (" (default)" if m == "dpfmps-2pest" else ""),
            {"method": m},
            "loss",
            reference_run={"method": "vfl-nonprivate"},
            extra=("v_measure",),
        )
        for m in ("dpfmps-2pest", "ind-lap", "ldp-agg-2pest", "central-dplsf")
    ),
    *(
        Cell(
            "hfl-kmeans",
            f"aggregation={a}" + (" (default)" if a == "nma" else ""),
            {"aggregation": a, "silhouette_points": 2000},
            "nicv",
            reference_run={"aggregation": a, "noise": "none", "silhouette_points": 2000},
            note="silhouette on a 2,000-point sample (evaluation only; NICV is exact)",
            extra=("t_max", "silhouette"),
        )
        for a in ("nma", "amn")
    ),
    Cell(
        "ldp-bitvector",
        "default (kcluster, dpbv)",
        {},
        "nmi",
        higher_is_better=True,
        reference_run={"encoding": "exact"},
    ),
    Cell(
        "vfl-primitives",
        "task=kmeans (default)",
        {},
        "cost_ratio",
        reference_key="cost_ratio_nonprivate_vfl",
    ),
    Cell(
        "vfl-primitives",
        "task=kmedian",
        {"task": "kmedian"},
        "cost_ratio",
        reference_key="cost_ratio_nonprivate_vfl",
    ),
    Cell("vfl-primitives", "task=l1-moment", {"task": "l1-moment"}, "l1_relative_error"),
    Cell("vfl-primitives", "task=lp-moment", {"task": "lp-moment"}, "abs_relative_error"),
    Cell("vfl-primitives", "task=l2-moment", {"task": "l2-moment"}, "abs_relative_error"),
    Cell(
        "vfl-primitives",
        "task=lowrank",
        {"task": "lowrank"},
        "ratio",
        reference_key="ratio_noiseless_sketch",
    ),
    Cell("vfl-primitives", "task=regression", {"task": "regression"}, "loss_ratio"),
    Cell(
        "federated-mf",
        "setting=lfl (default)",
        {"secagg_mode": "dealer"},
        "test_mse",
        reference_key="central_test_mse",
        report_only=True,
        extra=("stage1_test_mse",),
    ),
    *(
        Cell(
            "federated-mf",
            f"setting={s}",
            {"setting": s},
            "test_mse",
            reference_run={"setting": s, "method": "central"},
            report_only=True,
        )
        for s in ("vfl", "hfl")
    ),
]


def _value(cell: Cell, metrics: dict[str, Any], name: str | None = None) -> float:
    name = name or cell.metric
    return float(METRICS[name](metrics) if name in METRICS else metrics[name])


def _run(protocol: str, options: dict[str, Any], seed: int) -> dict[str, Any]:
    result = rayfed.run(protocol, backend="local", out_dir=None, seed=seed, **options)
    return result.metrics


def _stats(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=float)
    return {"mean": float(a.mean()), "sd": float(a.std(ddof=1)) if a.size > 1 else 0.0}


def _gain(cell: Cell, a: dict[str, float], b: dict[str, float]) -> float:
    """How much better b is than a (positive: better), in the metric's units."""
    return (b["mean"] - a["mean"]) * (1.0 if cell.higher_is_better else -1.0)


def verdict(
    cell: Cell, by_eps: dict[float, dict[str, float]], reference: float | None
) -> tuple[str, list[str]]:
    """(improves / flat / worsens / at-reference, the dips), by the rule of the module docstring.

    A dip is a step up in ε whose mean is worse, within the two spreads: listed, not flagged."""
    ran = [e for e in EPSILONS if e in by_eps]  # an ε the protocol refuses is left out
    steps = list(zip(ran, ran[1:], strict=False))
    spread = {e: by_eps[e]["sd"] for e in ran}
    worse = [
        (a, b) for a, b in steps if _gain(cell, by_eps[a], by_eps[b]) < -(spread[a] + spread[b])
    ]
    dips = [f"{a:g}->{b:g}" for a, b in steps if _gain(cell, by_eps[a], by_eps[b]) < 0]
    if worse:  # before at-reference: ends at the reference may hide a worse step between them
        return "worsens", dips
    if reference is not None and all(
        abs(by_eps[e]["mean"] - reference) <= spread[e] + 0.02 * abs(reference)
        for e in (ran[0], ran[-1])
    ):
        return "at-reference", dips
    better = any(
        _gain(cell, by_eps[a], by_eps[b]) > spread[a] + spread[b]
        for i, a in enumerate(ran)
        for b in ran[i + 1 :]
    )
    return ("improves" if better else "flat"), dips


def walk(cells: list[Cell]) -> list[dict[str, Any]]:
    rows = []
    for cell in cells:
        started = time.perf_counter()
        values: dict[float, list[float]] = {}
        extras: dict[float, dict[str, list[float]]] = {}
        own_refs: dict[float, list[float]] = {}
        refused: dict[str, str] = {}
        for eps in EPSILONS:
            for seed in SEEDS:
                try:
                    m = _run(cell.protocol, {**cell.options, "epsilon": eps}, seed)
                except ConfigError as e:  # the option's own limit: recorded, not walked
                    refused[str(eps)] = str(e)
                    break
                values.setdefault(eps, []).append(_value(cell, m))
                for name in cell.extra:
                    extras.setdefault(eps, {}).setdefault(name, []).append(_value(cell, m, name))
                if cell.reference_key:
                    own_refs.setdefault(eps, []).append(float(m[cell.reference_key]))
        reference = None
        ref_by_eps = None
        if cell.reference_run is not None:
            reference = _stats(
                [_value(cell, _run(cell.protocol, cell.reference_run, s)) for s in SEEDS]
            )
        elif cell.reference_key:
            # evaluation-only references may depend on ε (secure-sum's central Gaussian)
            ref_by_eps = {eps: _stats(v) for eps, v in own_refs.items()}
        by_eps = {eps: _stats(v) for eps, v in values.items()}
        flat_ref = reference["mean"] if reference else None
        if ref_by_eps is not None and cell.reference_key != "central_gaussian_mse_evaluation_only":
            flat_ref = float(np.mean([r["mean"] for r in ref_by_eps.values()]))
        v, dips = verdict(cell, by_eps, flat_ref)
        row = {
            "protocol": cell.protocol,
            "cell": cell.label,
            "options": cell.options,
            "metric": cell.metric,
            "higher_is_better": cell.higher_is_better,
            "by_epsilon": {str(e): {**by_eps[e], "values": values[e]} for e in by_eps},
            "refused": refused,
            "extra": {
                name: {str(e): _stats(extras[e][name]) for e in extras} for name in cell.extra
            },
            "reference": (
                {"options": cell.reference_run, **reference}
                if reference
                else (
                    {"key": cell.reference_key, **{str(e): r for e, r in ref_by_eps.items()}}
                    if ref_by_eps
                    else None
                )
            ),
            "verdict_reference": flat_ref,
            "verdict": v,
            "dips": dips,
            "flagged": v in ("flat", "worsens") and not cell.report_only,
            "report_only": cell.report_only,
            "note": cell.note,
            "seconds": time.perf_counter() - started,
        }
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def _fmt(x: float) -> str:
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    return f"{x:.3g}" if 1e-3 <= abs(x) < 1e4 else f"{x:.2e}"


def _line(row: dict[str, Any]) -> str:
    cols = " | ".join(
        f"{_fmt(row['by_epsilon'][str(e)]['mean'])} ± {_fmt(row['by_epsilon'][str(e)]['sd'])}"
        if str(e) in row["by_epsilon"]
        else "refused"
        for e in EPSILONS
    )
    ref = row["reference"]
    if ref is None:
        r = "—"
    elif "mean" in ref:
        r = f"{_fmt(ref['mean'])} ± {_fmt(ref['sd'])}"
    else:
        r = " / ".join(_fmt(ref[str(e)]["mean"]) for e in EPSILONS if str(e) in ref)
    mark = "**" if row["flagged"] else ""
    return (
        f"| {row['protocol']} | {row['cell']} | {row['metric']} | {cols} | {r} | "
        f"{mark}{row['verdict']}{mark}"
        + (f" (dips {', '.join(row['dips'])})" if row["dips"] else "")
        + " |"
    )


_HEADER = (
    "| protocol | cell | metric | ε = 0.5 | ε = 1 | ε = 4 | ε = 8 | non-private reference "
    "| verdict |\n|---|---|---|---|---|---|---|---|---|"
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="*", help="protocols to walk (default: all)")
    p.add_argument("--out", default="benchmarks/results/defaults_walk.json")
    p.add_argument("--table", action="store_true", help="print the table of --out, run nothing")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    if args.table:
        print(_HEADER)
        for row in json.loads(Path(args.out).read_text())["rows"]:
            print(_line(row))
        return 0
    cells = [c for c in CELLS if not args.only or c.protocol in args.only]
    print(_HEADER, flush=True)
    started = time.perf_counter()
    rows = walk(cells)
    record = {
        "name": "defaults walk: every protocol's defaults at ε = 0.5, 1, 4, 8 (issue 30 item 5)",
        "epsilons": list(EPSILONS),
        "seeds": list(SEEDS),
        "spread": "sample sd over the seeds",
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "seconds": time.perf_counter() - started,
        "rows": rows,
        "flagged": [f"{r['protocol']} {r['cell']}" for r in rows if r["flagged"]],
    }
    out = Path(args.out)
    if args.only and out.exists():  # merge: keep the other protocols' rows
        old = json.loads(out.read_text())
        keep = [r for r in old["rows"] if r["protocol"] not in args.only]
        record["rows"] = keep + rows
        record["flagged"] = [f"{r['protocol']} {r['cell']}" for r in record["rows"] if r["flagged"]]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{record['seconds']:.0f} s; flagged: {record['flagged']}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
