"""Federated-MF benchmark: the issue's two LFL timing targets, written as JSON.

    python benchmarks/federated_mf.py [--out benchmarks/results/federated_mf.json]

1. LFL with real secure aggregation (``simulation`` mode: X25519, Shamir, AES; seeded keys) on
   MovieLens-100K from ../shared/data (943 users, 1,682 items, p = 10), 10 iterations, on the Ray
   path (embedded local Ray, one cohort per CPU). Target: <= 5 minutes.
2. LFL on 20,000 synthetic users (200 items, p = 10) with dealer-mode secure aggregation, 10
   iterations. Target: <= 5 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import rayfed

ML100K = Path(__file__).resolve().parents[2] / "shared" / "data" / "movielens-100k" / "ratings.csv"
TARGET_S = 300.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/results/federated_mf.json")
    args = p.parse_args(argv)
    rayfed.ensure_ray()
    configs = [
        (
            "LFL ML-100K real SA (simulation), 10 iterations, ε=4",
            dict(data={"path": str(ML100K)}, epsilon=4.0, secagg_mode="simulation", iterations=10),
        ),
        (
            "LFL 20,000 synthetic users, dealer SA, 10 iterations, ε=1",
            dict(users=20_000, items=200, secagg_mode="dealer", iterations=10),
        ),
    ]
    records = []
    for name, options in configs:
        started = time.perf_counter()
        result = rayfed.run("federated-mf", out_dir=None, **options)
        seconds = time.perf_counter() - started
        records.append(
            {
                "name": name,
                "seconds": seconds,
                "within_target": seconds <= TARGET_S,
                "test_mse": result.metrics["test_mse"],
                "epsilon": result.privacy.epsilon,
                "delta": result.privacy.delta,
                "users": result.metrics["users"],
                "items": result.metrics["items"],
                "secagg_degree": result.metrics["secagg_degree"],
                "bytes_moved": result.transcript_totals["bytes"],
                "phase_seconds": result.metrics["phase_seconds"],
            }
        )
        print(f"{name}: {seconds:.1f} s, test MSE {records[-1]['test_mse']:.4f}", file=sys.stderr)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps(
            {"cpus": os.cpu_count(), "target_seconds": TARGET_S, "results": records}, indent=2
        )
        + "\n"
    )
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
