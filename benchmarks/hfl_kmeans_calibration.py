"""hfl-kmeans: the price of calibrating the size-constrained assignment to what one point really
moves (its augmenting path re-routes up to k - 1 other points). WCSS at equal true ε of the
constrained assignment with the corrected noise (the default), with the thesis's noise
(``sensitivity=thesis``: its true ε, from the ledger, beside it) and of the unconstrained
assignment (no displacement: its Δ follows from the domain), NMA and AMN, on S1 (k = 15) and
Iris (k = 3) at ε = 1 and 4, M = 2, in-process. Writes JSON.

    python benchmarks/hfl_kmeans_calibration.py            # 10 seeds, ~3 minutes on 2 cores
    python benchmarks/hfl_kmeans_calibration.py --seeds 3 --out /tmp/cal.json

Reads the datasets from ../shared/data (tests and benchmarks may; the product does not).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

import rayfed

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
SETS = {
    "s1": (DATA / "s1" / "s1.csv", ["x", "y"], 15),
    "iris": (
        DATA / "iris" / "iris.csv",
        ["sepal_length", "sepal_width", "petal_length", "petal_width"],
        3,
    ),
}
METHODS = {
    "constrained corrected": {},
    "constrained thesis": {"sensitivity": "thesis"},
    "unconstrained": {"assignment": "unconstrained"},
}


def options(name: str) -> dict:
    path, cols, k = SETS[name]
    frame = pd.read_csv(path, usecols=cols)
    bounds = {c: [float(frame[c].min()), float(frame[c].max())] for c in cols}
    return {"data": {"path": str(path)}, "bounds": bounds, "k": k}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument(
        "--out",
        default=str(Path(__file__).parent / "results" / "hfl_kmeans_calibration.json"),
    )
    args = parser.parse_args()
    rows = []
    for name in SETS:
        base = options(name)
        for aggregation in ("nma", "amn"):
            for epsilon in (1.0, 4.0):
                for method, extra in METHODS.items():
                    started = time.perf_counter()
                    runs = [
                        rayfed.run(
                            "hfl-kmeans",
                            backend="local",
                            out_dir=None,
                            seed=s,
                            aggregation=aggregation,
                            epsilon=epsilon,
                            **base,
                            **extra,
                        )
                        for s in range(args.seeds)
                    ]
                    wcss = np.array([r.metrics["wcss"] for r in runs])
                    row = {
                        "dataset": name,
                        "aggregation": aggregation,
                        "epsilon": epsilon,
                        "method": method,
                        "runs": args.seeds,
                        "wcss": float(wcss.mean()),
                        "wcss_se": float(wcss.std(ddof=1) / math.sqrt(len(wcss))),
                        "true_epsilon": runs[0].privacy.epsilon,
                        "seconds": time.perf_counter() - started,
                    }
                    rows.append(row)
                    print(
                        f"{name:5} {aggregation} ε={epsilon:g} {method:22} WCSS "
                        f"{row['wcss']:9.2f} ± {row['wcss_se']:.2f}  true ε "
                        f"{row['true_epsilon']:.3g}",
                        flush=True,
                    )
    Path(args.out).write_text(json.dumps({"seeds": args.seeds, "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
