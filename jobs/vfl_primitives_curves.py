"""DP VFL primitives: error vs ε and vs m for every primitive (JSON + plot).

Self-contained (``ray submit`` uploads only this file):

    python jobs/vfl_primitives_curves.py                 # synthetic data, 3 repetitions per point
    python jobs/vfl_primitives_curves.py --reps 10
    python jobs/vfl_primitives_curves.py --small         # fewer points (tests)

The paper has no experiments (spec shared/specs/vfl-primitives.md §4 proposes this evaluation).
Errors: ℓ1 |error|; ℓp (p = 2, M = 12 so the mechanics are visible, raw counts) and ℓ2 (debiased)
|relative error|; k-means / k-median cost / non-private cost; low rank ‖A - AVVᵀ‖_F / ‖A - A_k‖_F;
regression ‖Ax̃ - b‖² / OPT.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

import rayfed

TASKS = {  # task -> (options, metric, transform, label)
    "l1-moment": ({}, "error", abs, "|error|"),
    "lp-moment": ({"bound": 12, "counts": "raw"}, "relative_error", abs, "|relative error|"),
    "l2-moment": ({}, "relative_error", abs, "|relative error| (debiased)"),
    "kmeans": ({}, "cost_ratio", float, "cost / non-private"),
    "kmedian": ({}, "cost_ratio", float, "cost / non-private"),
    "lowrank": ({"k": 3, "alpha": 0.5}, "ratio", float, "‖A−AVVᵀ‖ / ‖A−A_k‖"),
    "regression": ({"alpha": 0.2}, "loss_ratio", float, "loss / OPT"),
}


def point(task: str, epsilon: float, users: int, reps: int, backend: str) -> dict:
    options, metric, transform, _ = TASKS[task]
    values = [
        transform(
            rayfed.run(
                "vfl-primitives",
                task=task,
                epsilon=epsilon,
                users=users,
                seed=seed,
                backend=backend,
                out_dir=None,
                **options,
            ).metrics[metric]
        )
        for seed in range(reps)
    ]
    return {
        "task": task,
        "epsilon": epsilon,
        "users": users,
        "metric": metric,
        "mean": float(np.mean(values)),
        "se": float(np.std(values, ddof=1) / np.sqrt(len(values))) if len(values) > 1 else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epsilons", default="0.5,1,2,4")
    p.add_argument("--users", default="5000,20000,80000")
    p.add_argument("--fixed-users", type=int, default=20_000, help="m of the error-vs-ε curves")
    p.add_argument("--fixed-epsilon", type=float, default=1.0, help="ε of the error-vs-m curves")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--backend", default="local", choices=["ray", "local"])
    p.add_argument("--small", action="store_true", help="two ε, two m, 2 repetitions")
    p.add_argument("--out", default="runs/vfl_primitives_curves")
    args = p.parse_args(argv)
    if args.small:
        args.epsilons, args.users, args.reps, args.fixed_users = "1,4", "2000,8000", 2, 4000
    epsilons = [float(e) for e in args.epsilons.split(",")]
    users = [int(m) for m in args.users.split(",")]
    started = time.perf_counter()
    rows = []
    for task in TASKS:
        for eps in epsilons:
            rows.append(
                {"axis": "epsilon", **point(task, eps, args.fixed_users, args.reps, args.backend)}
            )
        for m in users:
            rows.append(
                {"axis": "users", **point(task, args.fixed_epsilon, m, args.reps, args.backend)}
            )
        shown = [f"{r['mean']:.3g}" for r in rows if r["task"] == task]
        print(f"{task:<11} {' '.join(shown)}", file=sys.stderr, flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"repetitions": args.reps, "rows": rows, "seconds": time.perf_counter() - started}
    (out / "vfl_primitives_curves.json").write_text(json.dumps(record, indent=2) + "\n")
    plot(rows, out / "vfl_primitives_curves.png")
    print(f"RESULT_JSON {json.dumps({'out': str(out.resolve()), 'points': len(rows)})}")
    return 0


def plot(rows, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(TASKS), figsize=(3.3 * len(TASKS), 6.4))
    for col, (task, (_, _, _, label)) in enumerate(TASKS.items()):
        for row, axis in enumerate(("epsilon", "users")):
            ax = axes[row, col]
            pts = sorted(
                (r[axis], r["mean"], r["se"] or 0.0)
                for r in rows
                if r["task"] == task and r["axis"] == axis
            )
            x, y, se = zip(*pts, strict=True)
            ax.errorbar(x, y, yerr=se, marker="o", capsize=3)
            ax.set(
                xscale="log",
                yscale="log",
                xlabel="ε" if axis == "epsilon" else "m (users)",
                title=task if row == 0 else "",
            )
            ax.set_xticks(x, [f"{v:g}" for v in x])
            ax.xaxis.set_minor_locator(plt.NullLocator())
            ax.set_ylabel(label, fontsize=8)
            ax.grid(alpha=0.3)
    fig.suptitle("DP VFL primitives: error vs ε (top, m fixed) and vs m (bottom, ε fixed)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
