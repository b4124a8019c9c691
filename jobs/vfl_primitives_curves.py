"""DP VFL primitives: error vs ε and vs m for every primitive (JSON + plot).

Needs rayfed installed where it runs (cluster.yaml installs it on every node):

    python jobs/vfl_primitives_curves.py                 # synthetic data, 3 repetitions per point
    python jobs/vfl_primitives_curves.py --reps 10
    python jobs/vfl_primitives_curves.py --small         # fewer points (tests)

The paper has no experiments (spec shared/specs/vfl-primitives.md §4 proposes this evaluation).
Errors: ℓ1 |error|; ℓp (p = 2, M = 12 so the mechanics are visible, raw counts) and ℓ2 (debiased)
|relative error|; k-means / k-median cost / non-private cost; low rank ‖A - AVVᵀ‖_F / ‖A - A_k‖_F;
regression ‖Ax̃ - b‖² / OPT.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import rayfed
from rayfed import jobs

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


def body(args) -> dict:
    epsilons, users = jobs.numbers(args.epsilons), jobs.numbers(args.users, int)
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
    out = jobs.out_dir(args)
    record = {"repetitions": args.reps, "rows": rows, "seconds": time.perf_counter() - started}
    jobs.write_json(out / "vfl_primitives_curves.json", record)
    plot(rows, out / "vfl_primitives_curves.png")
    return {"out": str(out.resolve()), "points": len(rows)}


def plot(rows, path) -> None:
    plt = jobs.pyplot()
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
    jobs.save(fig, path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    p = jobs.parser(
        __doc__,
        small="two ε, two m, 2 repetitions",
        out="runs/vfl_primitives_curves",
        backend="local",
    )
    p.add_argument("--epsilons", default="0.5,1,2,4")
    p.add_argument("--users", default="5000,20000,80000")
    p.add_argument("--fixed-users", type=int, default=20_000, help="m of the error-vs-ε curves")
    p.add_argument("--fixed-epsilon", type=float, default=1.0, help="ε of the error-vs-m curves")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    if args.small:
        args.epsilons, args.users, args.reps, args.fixed_users = "1,4", "2000,8000", 2, 4000
    return jobs.run("vfl_primitives_curves", body, args)


if __name__ == "__main__":
    sys.exit(main())
