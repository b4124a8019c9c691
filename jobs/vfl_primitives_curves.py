"""DP VFL primitives: error vs ε and vs m for every primitive (JSON + plot).

Needs rayfed installed where it runs (cluster.yaml installs it on every node):

    python jobs/vfl_primitives_curves.py                 # synthetic data, 3 repetitions per point
    python jobs/vfl_primitives_curves.py --reps 10
    python jobs/vfl_primitives_curves.py --small         # fewer points (tests)
    python jobs/vfl_primitives_curves.py --comparisons-only --compare-reps 5

The paper has no experiments (spec shared/specs/vfl-primitives.md §4 proposes this evaluation).
The curves reproduce the paper's calibration: the tasks it calibrates for event-level or
ν-bounded neighbours (l1-, lp-, l2-moment, lowrank, regression) run with ``neighbours=paper`` —
NOT a user-level guarantee (``--neighbours user``: the protocol's default, declared bounds and
the noise calibrated to them); k-means / k-median are user-level either way.
Errors: ℓ1 |error|; ℓp (p = 2, M = 12 so the mechanics are visible, raw counts) and ℓ2 (debiased)
|relative error|; k-means / k-median cost / non-private cost; low rank ‖A - AVVᵀ‖_F / ‖A - A_k‖_F;
regression ‖Ax̃ - b‖² / OPT.

Three comparisons (record["comparisons"], second plot), each beside the theorem's prediction:

* sampling — k-means with pattern counting on a public sample at rate p (Thm B.2): cost ratio,
  grid-weight RMSE beside the predicted sd √(mean Σ_i [(1/p)Π(c + a) - Πa]) ≈ √(m/p)(4/ε_pc)^v,
  and the bits per server ≈ p·m·k;
* interaction — ℓp (Alg. 2) interactive vs the non-interactive variant (spec §2.5): RMSE of the
  light part beside its exact predicted sd (the variance law of §2.1 on the data), 60 seeds;
* baselines (spec §4.4) vs m — k-means: pattern counting, central DP with a trusted curator
  (Laplace histogram), exact counts of the same DP labels, the non-private VFL pipeline; low rank:
  the noisy sketch, input perturbation (same (ε, δ) calibration), the noiseless sketch.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import rayfed
from rayfed import jobs
from rayfed.protocols.vfl_primitives.config import NEIGHBOUR_TASKS

TASKS = {  # task -> (options, metric, transform, label)
    "l1-moment": ({}, "error", abs, "|error|"),
    "lp-moment": ({"bound": 12, "counts": "raw"}, "relative_error", abs, "|relative error|"),
    "l2-moment": ({}, "relative_error", abs, "|relative error| (debiased)"),
    "kmeans": ({}, "cost_ratio", float, "cost / non-private"),
    "kmedian": ({}, "cost_ratio", float, "cost / non-private"),
    "lowrank": ({"k": 3, "alpha": 0.5}, "ratio", float, "‖A−AVVᵀ‖ / ‖A−A_k‖"),
    "regression": ({"alpha": 0.2}, "loss_ratio", float, "loss / OPT"),
}


#: the neighbour relation of the runs (--neighbours; set in main)
NEIGHBOURS = {"neighbours": "paper"}


def relation(task: str) -> dict:
    """The ``neighbours`` option of a task that reads it (the paper's calibration by default)."""
    return NEIGHBOURS if task in NEIGHBOUR_TASKS else {}


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
                **relation(task),
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


def metrics_of(task: str, reps: int, backend: str, **options) -> list[dict]:
    return [
        rayfed.run(
            "vfl-primitives",
            task=task,
            seed=seed,
            backend=backend,
            out_dir=None,
            **options,
            **relation(task),
        ).metrics
        for seed in range(reps)
    ]


def summary(values) -> dict:
    values = np.asarray(values, dtype=float)
    se = float(values.std(ddof=1) / np.sqrt(values.size)) if values.size > 1 else None
    return {"mean": float(values.mean()), "se": se}


def rms(values) -> float:
    return float(np.sqrt(np.mean(np.square(values))))


def sampling_rows(args) -> list[dict]:
    """k-means at m = fixed_users, ε = 4: pattern counting on a public sample at rate p."""
    rows = []
    for rate in jobs.numbers(args.sample_rates):
        ms = metrics_of(
            "kmeans",
            args.compare_reps,
            args.backend,
            epsilon=4.0,
            users=args.fixed_users,
            sample_rate=rate,
        )
        rows.append(
            {
                "comparison": "sampling",
                "task": "kmeans",
                "epsilon": 4.0,
                "users": args.fixed_users,
                "sample_rate": rate,
                "cost_ratio": summary([m["cost_ratio"] for m in ms]),
                "weights_rmse": rms([m["weights_rmse"] for m in ms]),
                "weights_predicted_sd": rms([m["weights_predicted_sd"] for m in ms]),
                "bits_per_server": summary([m["pattern_bits_per_server"] for m in ms]),
                "bits_predicted": rate * args.fixed_users * ms[0]["k"],
            }
        )
    return rows


def interaction_rows(args) -> list[dict]:
    """ℓp (p = 2, M = 12, raw counts) at m = fixed_users: Alg. 2 vs its non-interactive variant."""
    rows = []
    for eps in jobs.numbers(args.epsilons):
        for mode in ("interactive", "non-interactive"):
            ms = metrics_of(
                "lp-moment",
                args.interaction_reps,
                args.backend,
                epsilon=eps,
                users=args.fixed_users,
                interaction=mode,
                **TASKS["lp-moment"][0],
            )
            gaps = [m["light_part"] - m["light_part_true"] for m in ms]
            rows.append(
                {
                    "comparison": "interaction",
                    "repetitions": len(ms),
                    "task": "lp-moment",
                    "variant": mode,
                    "epsilon": eps,
                    "users": args.fixed_users,
                    "light_part_rmse": rms(gaps),
                    "light_part_predicted_sd": rms([m["light_part_sd"] for m in ms]),
                    "bias_z": float(np.mean(gaps) / (np.std(gaps, ddof=1) / np.sqrt(len(gaps)))),
                    "relative_error": summary([abs(m["relative_error"]) for m in ms]),
                }
            )
    return rows


def baseline_rows(args) -> list[dict]:
    """Spec §4.4's baselines vs m at ε = 4: k-means (pattern counting, central DP, exact counts,
    non-private VFL) and low rank (noisy sketch, input perturbation, noiseless sketch)."""
    rows = []
    for m in jobs.numbers(args.kmeans_users, int):
        vfl = metrics_of("kmeans", args.compare_reps, args.backend, epsilon=4.0, users=m)
        central = metrics_of(
            "kmeans", args.compare_reps, args.backend, epsilon=4.0, users=m, baseline="central"
        )
        for variant, ms, key in (
            ("pattern counting", vfl, "cost_ratio"),
            ("central DP (trusted curator)", central, "cost_ratio"),
            ("exact counts", vfl, "cost_ratio_exact_counts"),
            ("non-private VFL", vfl, "cost_ratio_nonprivate_vfl"),
        ):
            row = {"comparison": "baselines", "task": "kmeans", "variant": variant, "users": m}
            row.update(epsilon=4.0, metric=key, **summary([x[key] for x in ms]))
            if variant in ("pattern counting", "central DP (trusted curator)"):
                row["weights_rmse"] = rms([x["weights_rmse"] for x in ms])
                row["weights_predicted_sd"] = rms([x["weights_predicted_sd"] for x in ms])
            rows.append(row)
    for m in jobs.numbers(args.lowrank_users, int):
        options = {**TASKS["lowrank"][0], "epsilon": 4.0, "users": m}
        sketch = metrics_of("lowrank", args.compare_reps, args.backend, **options)
        perturbed = metrics_of(
            "lowrank", args.compare_reps, args.backend, baseline="input-perturbation", **options
        )
        for variant, ms, key in (
            ("noisy sketch", sketch, "ratio"),
            ("input perturbation", perturbed, "ratio"),
            ("noiseless sketch", sketch, "ratio_noiseless_sketch"),
        ):
            row = {"comparison": "baselines", "task": "lowrank", "variant": variant, "users": m}
            row.update(epsilon=4.0, metric=key, **summary([x[key] for x in ms]))
            if key == "ratio":
                row["excess"] = summary([x["excess"] for x in ms])
                row["sigma"] = ms[0]["sigma"]
            rows.append(row)
    return rows


def body(args) -> dict:
    epsilons, users = jobs.numbers(args.epsilons), jobs.numbers(args.users, int)
    started = time.perf_counter()
    rows = []
    for task in () if args.comparisons_only else TASKS:
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
    comparisons = []
    for name, make in (
        ("sampling", sampling_rows),
        ("interaction", interaction_rows),
        ("baselines", baseline_rows),
    ):
        comparisons += make(args)
        print(f"{name:<11} done", file=sys.stderr, flush=True)
    out = jobs.out_dir(args)
    record = {
        "neighbours": args.neighbours,
        "repetitions": args.reps,
        "comparison_repetitions": args.compare_reps,
        "rows": rows,
        "comparisons": comparisons,
        "seconds": time.perf_counter() - started,
    }
    name = "vfl_primitives_comparisons" if args.comparisons_only else "vfl_primitives_curves"
    jobs.write_json(out / f"{name}.json", record)
    if rows:
        plot(rows, out / "vfl_primitives_curves.png")
    plot_comparisons(comparisons, out / "vfl_primitives_comparisons.png")
    return {"out": str(out.resolve()), "points": len(rows) + len(comparisons)}


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


def plot_comparisons(rows, path) -> None:
    plt = jobs.pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(17, 4))
    sampled = sorted(
        (r for r in rows if r["comparison"] == "sampling"), key=lambda r: r["sample_rate"]
    )
    ax = axes[0]
    rates = [r["sample_rate"] for r in sampled]
    ax.plot(rates, [r["weights_rmse"] for r in sampled], "o-", label="measured RMSE")
    ax.plot(rates, [r["weights_predicted_sd"] for r in sampled], "k--", label="predicted sd")
    ax.set(xscale="log", yscale="log", xlabel="sample rate p", ylabel="grid-weight error")
    ax.set_xticks(rates, [f"{x:g}" for x in rates])
    ax.xaxis.set_minor_locator(plt.NullLocator())
    ax.set_title("k-means: sampled pattern counting (Thm B.2)", fontsize=9)
    for col, (comparison, task, x_key, y_key, title) in enumerate(
        (
            ("interaction", "lp-moment", "epsilon", "light_part_rmse", "ℓp light part: Alg. 2"),
            ("baselines", "kmeans", "users", "mean", "k-means baselines (ε = 4)"),
            ("baselines", "lowrank", "users", "mean", "low rank baselines (ε = 4)"),
        ),
        start=1,
    ):
        ax = axes[col]
        chosen = [r for r in rows if r["comparison"] == comparison and r["task"] == task]
        variants = dict.fromkeys(r["variant"] for r in chosen)
        for style, variant in zip(("o-", "s--", "^:", "v-."), variants, strict=False):
            pts = sorted((r[x_key], r[y_key]) for r in chosen if r["variant"] == variant)
            ax.plot(*zip(*pts, strict=True), style, label=variant, alpha=0.8)
        if comparison == "interaction":
            pts = sorted(
                (r[x_key], r["light_part_predicted_sd"])
                for r in chosen
                if r["variant"] == "interactive"
            )
            ax.plot(*zip(*pts, strict=True), "k--", label="predicted sd")
        ax.set(xscale="log", yscale="log", xlabel="ε" if x_key == "epsilon" else "m (users)")
        xs = sorted({r[x_key] for r in chosen})
        ax.set_xticks(xs, [f"{x:g}" for x in xs], fontsize=7)
        ax.xaxis.set_minor_locator(plt.NullLocator())
        ax.set_ylabel({"light_part_rmse": "RMSE", "mean": "cost or error ratio"}[y_key], fontsize=8)
        ax.set_title(title, fontsize=9)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("DP VFL primitives: sampling, non-interactive Alg. 2, and the §4.4 baselines")
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
    p.add_argument("--sample-rates", default="1,0.5,0.25,0.1", help="p of the sampling comparison")
    p.add_argument(
        "--compare-reps", type=int, default=None, help="repetitions of the comparisons (--reps)"
    )
    p.add_argument(
        "--interaction-reps", type=int, default=60, help="repetitions of the ℓp comparison (cheap)"
    )
    p.add_argument(
        "--lowrank-users", default="5000,20000,80000,320000", help="m of the low-rank baselines"
    )
    p.add_argument("--kmeans-users", default=None, help="m of the k-means baselines (--users)")
    p.add_argument(
        "--comparisons-only", action="store_true", help="skip the error-vs-ε and -m curves"
    )
    p.add_argument(
        "--neighbours",
        choices=("paper", "user"),
        default="paper",
        help="the neighbour relation of l1/lp/l2-moment, lowrank, regression: the paper's "
        "(its calibration; NOT user-level) or user-level (the protocol's default)",
    )
    args = p.parse_args(argv)
    NEIGHBOURS["neighbours"] = args.neighbours
    if args.small:
        args.epsilons, args.users, args.reps, args.fixed_users = "1,4", "2000,8000", 2, 4000
        args.sample_rates, args.compare_reps, args.interaction_reps = "1,0.25", 1, 2
        args.lowrank_users = args.kmeans_users = "2000"
    if args.compare_reps is None:
        args.compare_reps = args.reps
    if args.kmeans_users is None:
        args.kmeans_users = args.users
    return jobs.run("vfl_primitives_curves", body, args)


if __name__ == "__main__":
    sys.exit(main())
