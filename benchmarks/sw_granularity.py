"""Bucket granularity: SW-EMS W1 at d = d̃ ∈ {256, 512, 1024, 2048} (spec Q10, the thesis's
Fig. 3.7: Beta(5,2) is best at d = 256, its three real datasets — Taxi, Income, Retirement — at
d = 1024 "in most cases"). Writes JSON.

    python benchmarks/sw_granularity.py 8        # 8 seeds (the record), ε = 0.5, 1, 2, 4; ~8 minutes

The thesis's datasets are not public in the form it used; three real numerical columns stand in
(shared/data): nycflights13 ``air_time`` (327,346 flights, [0, 700] minutes), nycflights13
``distance`` (336,776 flights, [0, 5,000] miles: 214 distinct values, spiky as Income is) and
Adult ``fnlwgt`` (48,842 persons, [0, 1.5·10^6], heavy-tailed), beside Beta(5,2) with
n = 10^5. W1 is in continuous units at each d (the spec's sum over buckets ÷ d), so the d's
compare directly.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import rayfed

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
BUCKETS = (256, 512, 1024, 2048)
EPSILONS = (0.5, 1.0, 2.0, 4.0)


def datasets(folder: Path) -> list[tuple[str, dict]]:
    """(name, run options) of Beta(5,2) and the real columns found under shared/data."""
    sets = [("Beta(5,2)", {"users": 100_000})]
    flights = DATA / "nycflights13"
    if (flights / "flights.csv.zip").exists():
        import pandas as pd

        frame = pd.read_csv(flights / "flights.csv.zip", usecols=["air_time", "distance"])
        for column, bounds in (("air_time", [0, 700]), ("distance", [0, 5000])):
            values = frame[column].dropna().to_numpy(np.float64)
            path = folder / f"{column}.parquet"
            pq.write_table(pa.table({column: values}), path)
            sets.append((f"nycflights13 {column}", _file(path, column, bounds)))
    adult = DATA / "adult" / "adult.txt"
    if adult.exists():
        path = folder / "fnlwgt.parquet"
        pq.write_table(pa.table({"fnlwgt": np.loadtxt(adult, usecols=1)}), path)
        sets.append(("Adult fnlwgt", _file(path, "fnlwgt", [0, 1_500_000])))
    return sets


def _file(path: Path, column: str, bounds: list[float]) -> dict:
    return {"data": {"path": str(path)}, "column": column, "bounds": bounds}


def w1(options: dict, eps: float, d: int, seeds: int) -> tuple[float, float]:
    """Mean and standard error of W1 x 1e-3 over ``seeds`` runs."""
    w = np.array(
        [
            rayfed.run(
                "square-wave",
                backend="local",
                out_dir=None,
                epsilon=eps,
                buckets=d,
                seed=s,
                **options,
            ).metrics["wasserstein"]
            for s in range(seeds)
        ]
    )
    return 1e3 * float(w.mean()), 1e3 * float(w.std(ddof=1) / np.sqrt(seeds))


def main(out: str = "benchmarks/results/sw_granularity.json", seeds: int = 3) -> int:
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name, options in datasets(Path(folder)):
            for eps in EPSILONS:
                curve = {d: w1(options, eps, d, seeds) for d in BUCKETS}
                best = min(curve, key=lambda d: curve[d][0])
                rows.append(
                    {
                        "dataset": name,
                        "epsilon": eps,
                        "w1": {str(d): {"mean": m, "se": se} for d, (m, se) in curve.items()},
                        "best_d": best,
                    }
                )
                print(
                    f"{name} ε={eps}: "
                    + ", ".join(f"d={d} {m:.2f}±{se:.2f}" for d, (m, se) in curve.items()),
                    flush=True,
                )
    summary = {}
    for name in dict.fromkeys(r["dataset"] for r in rows):
        bests = [r["best_d"] for r in rows if r["dataset"] == name]
        summary[name] = {str(d): bests.count(d) for d in BUCKETS}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(
        json.dumps(
            {
                "seeds": seeds,
                "epsilons": EPSILONS,
                "buckets": BUCKETS,
                "best_d_counts": summary,
                "thesis": "Beta(5,2) best at d = 256; Taxi, Income, Retirement at 1024 in most cases",
                "rows": rows,
            },
            indent=1,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(seeds=int(sys.argv[1]) if len(sys.argv) > 1 else 3))
