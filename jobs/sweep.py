"""Sweep one protocol over a grid of options and seeds; one run directory per point, a JSON table,
a plot of a metric against the first grid option, and a comparison report of all the runs.

Needs rayfed installed where it runs (cluster.yaml installs it on every node):

    python jobs/sweep.py --protocol hfl-kmeans --grid epsilon=0.5,1,2,4 --grid aggregation=nma,amn \\
        --seeds 5 --metric wcss
    ray job submit --working-dir . -- python jobs/sweep.py --protocol square-wave \\
        --grid epsilon=0.5,1,2 --set users=1000000 --metric wasserstein --out /tmp/sweep
    python jobs/sweep.py --small          # hfl-kmeans, ε = 1, 4, 2 seeds, in-process (tests)

Each grid point runs ``--seeds`` times (seeds 0..n-1); ``--set key=value`` fixes other options and
``--fail SPEC`` injects a fault into every run. Writes ``sweep.json`` (options, scalar metrics, ε
spent and seconds per run), ``sweep.png`` (mean ± standard error of ``--metric`` per grid point) and
``compare/compare.html``; the last line is ``RESULT_JSON {...}``.
"""

from __future__ import annotations

import itertools
import math
import time
from pathlib import Path

import rayfed
from rayfed import jobs
from rayfed.report import compare


def value(text: str):
    """A grid value: int, float, true/false, else the string."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def grid_points(grid: list[str]) -> list[dict]:
    axes = []
    for spec in grid:
        key, _, values = spec.partition("=")
        if not key or not values:
            raise SystemExit(f"--grid {spec!r}: expected key=v1,v2,...")
        axes.append([(key, value(v)) for v in values.split(",")])
    return [dict(point) for point in itertools.product(*axes)] or [{}]


def plot(rows: list[dict], axis: str | None, metric: str, out: Path) -> str | None:
    plt = jobs.pyplot()
    if axis is None:
        return None
    series: dict[str, dict] = {}
    for row in rows:
        if not isinstance(row["metrics"].get(metric), (int, float)):
            continue
        rest = ", ".join(f"{k}={v}" for k, v in row["point"].items() if k != axis) or metric
        series.setdefault(rest, {}).setdefault(row["point"][axis], []).append(
            row["metrics"][metric]
        )
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, points in series.items():
        xs = sorted(points, key=lambda x: (isinstance(x, str), x))
        means = [sum(points[x]) / len(points[x]) for x in xs]
        errs = [
            math.sqrt(sum((v - m) ** 2 for v in points[x]) / max(1, len(points[x]) - 1))
            / math.sqrt(len(points[x]))
            for x, m in zip(xs, means, strict=True)
        ]
        ax.errorbar([str(x) for x in xs], means, yerr=errs, marker="o", capsize=3, label=label)
    ax.set_xlabel(axis)
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return jobs.save(fig, out / "sweep.png", dpi=110)


def body(args) -> dict:
    out = jobs.out_dir(args)
    started = time.perf_counter()
    address = args.address if args.backend == "ray" else None
    rows = []
    for point in grid_points(args.grid):
        for seed in range(args.seeds):
            options = {**point, "seed": seed, "backend": args.backend}
            options.update(out_dir=str(out / "runs"), address=address, fail=args.fail)
            try:
                result = rayfed.run(args.protocol, sets=args.set, **options)
            except rayfed.RayfedError as err:  # one failed point does not end the sweep
                error = f"{type(err).__name__}: {err}"
                rows.append({"point": point, "seed": seed, "status": "failed", "error": error})
                print(f"{point} seed {seed}: {error}", flush=True)
                continue
            scalars = {k: v for k, v in result.metrics.items() if isinstance(v, (int, float, str))}
            rows.append(
                {
                    "point": point,
                    "seed": seed,
                    "status": "complete",
                    "run_dir": result.run_dir,
                    "epsilon_spent": result.privacy.epsilon,
                    "seconds": result.seconds,
                    "metrics": scalars,
                }
            )
            print(f"{point} seed {seed}: {result.headline}", flush=True)
    done = [r for r in rows if r["status"] == "complete"]
    metric = args.metric or next(
        (k for k, v in (done[0]["metrics"] if done else {}).items() if isinstance(v, float)), None
    )
    axis = next(iter(grid_points(args.grid)[0]), None)
    record = {
        "protocol": args.protocol,
        "grid": args.grid,
        "fixed": args.set,
        "seeds": args.seeds,
        "rows": rows,
        "seconds": time.perf_counter() - started,
        "plot": plot(done, axis, metric, out) if metric else None,
        "compare": [str(p) for p in compare([r["run_dir"] for r in done], out / "compare")]
        if len(done) > 1
        else [],
    }
    jobs.write_json(out / "sweep.json", record, default=str)
    return {"out": str(out.resolve()), "runs": len(rows), "failed": len(rows) - len(done)}


def main(argv: list[str] | None = None) -> int:
    p = jobs.parser(
        __doc__, small="hfl-kmeans, ε = 1, 4, 2 seeds, local", out="runs/sweep", backend="ray"
    )
    p.add_argument("--protocol", default="hfl-kmeans")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--metric", help="scalar metric to plot (default: the first numeric one)")
    p.add_argument("--fail", action="append", metavar="SPEC", help="fault injected in every run")
    args = p.parse_args(argv)
    if args.small:
        args.protocol, args.grid, args.seeds, args.backend = (
            "hfl-kmeans",
            ["epsilon=1,4"],
            2,
            "local",
        )
        args.set = ["users=1000", "k=3"]
        args.metric = args.metric or "wcss"
    return jobs.run("sweep", body, args)


if __name__ == "__main__":
    raise SystemExit(main())
