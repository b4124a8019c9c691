"""A null control for GD-DR on ML-100K (spec E8, review of issue 18): the same runs with every
user's projected-gradient entry replaced by 0, so each one-bit report is a fair coin that
carries no data. If the real and the null runs score alike, GD-DR's reports carry no usable
signal at this n and ε, and its test MSE says nothing about the method.

    python benchmarks/federated_mf_gddr_null.py [--out benchmarks/results/federated_mf_gddr_null.json]

Per ε, seed 0, T = 10, ω = 0, the exact clip (c = 2R^(3/2)/√k) and each γ of ``--lrs``: test and
training MSE of GD-DR and of its null control; Stage 1 only for reference. In-process (the
patched function runs in the cohort actors only on the local backend).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

import rayfed
import rayfed.mf.gddr as gddr

ML100K = Path(__file__).resolve().parents[2] / "shared" / "data" / "movielens-100k" / "ratings.csv"


def run(method: str, epsilon: float, **extra) -> dict:
    result = rayfed.run(
        "federated-mf",
        setting="lfl",
        method=method,
        epsilon=epsilon,
        iterations=10,
        data={"path": str(ML100K)},
        seed=0,
        backend="local",
        out_dir=None,
        **extra,
    )
    return {"test_mse": result.metrics["test_mse"], "train_mse": result.metrics.get("train_mse")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/results/federated_mf_gddr_null.json")
    p.add_argument("--epsilons", default="1,4")
    p.add_argument("--lrs", default="0.003,0.01,0.03")
    args = p.parse_args(argv)
    started, rows = time.perf_counter(), []
    real = gddr.projected_entries
    for eps in (float(e) for e in args.epsilons.split(",")):
        for lr in (float(x) for x in args.lrs.split(",")):
            row = {"epsilon": eps, "lr": lr, "gd-dr": run("gd-dr", eps, lr=lr, omega=0.0)}
            gddr.projected_entries = lambda *a, **k: np.zeros_like(real(*a, **k))
            try:
                row["null"] = run("gd-dr", eps, lr=lr, omega=0.0)
            finally:
                gddr.projected_entries = real
            rows.append(row)
            print(row, file=sys.stderr)
    record = {
        "data": "ML-100K (943 users), T = 10, seed 0, omega = 0, exact clip",
        "null": "every projected entry replaced by 0: the one-bit reports are fair coins",
        "stage1": run("stage1", 1.0),
        "rows": rows,
        "seconds": time.perf_counter() - started,
    }
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
