"""hfl-kmeans on the serverless ring with MPC-sampled central noise (``ring_noise=mpc``, thesis
§7.3.2) beside the server, the ring's local noise (F1) and split noise with h = 3 (F3): S1,
M = 5 clients, ε = 1, NMA — the WCSS over seeds (in-process), and the cost on Ray: driver round
trips, bytes per client and seconds per iteration. Writes JSON.

    python benchmarks/hfl_kmeans_mpc.py               # 20 seeds, a few minutes on 2 cores
    python benchmarks/hfl_kmeans_mpc.py --seeds 3 --grid-seeds 0 --out /tmp/mpc.json

``--grid-seeds`` also runs F2 over the reproduction job's serverless grid (S1 and Iris, ε = 1 and
4, NMA and AMN) with the job's seeds, for the docs' table.

The thesis has no numbers for its serverless sketches; the F1/F3 rows repeat the reproduction
job's serverless section (20 seeds there: server 107.1 ± 6.1, F1 137.8 ± 8.4, F3 h = 3
113.3 ± 6.0). Reads S1 from ../shared/data (tests and benchmarks may; the product does not).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd

import rayfed

DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"
DATA = DATA_DIR / "s1" / "s1.csv"
#: the reproduction job's serverless grid (docs table): dataset -> (file, columns, k)
GRID = {
    "s1": (DATA, ["x", "y"], 15),
    "iris": (
        DATA_DIR / "iris" / "iris.csv",
        ["sepal_length", "sepal_width", "petal_length", "petal_width"],
        3,
    ),
}
CLIENTS = 5
VARIANTS = {
    "server": {},
    "ring local (F1)": {"topology": "ring"},
    "ring split h=3 (F3)": {"topology": "ring", "ring_noise": "split", "honest_clients": 3},
    "ring mpc (F2)": {"topology": "ring", "ring_noise": "mpc"},
}


def base_options(epsilon: float, dataset: str = "s1") -> dict:
    path, columns, k = GRID[dataset]
    frame = pd.read_csv(path, usecols=columns)
    bounds = {c: [float(frame[c].min()), float(frame[c].max())] for c in columns}
    return {
        "data": {"path": str(path)},
        "bounds": bounds,
        "k": k,
        "clients": CLIENTS,
        "epsilon": epsilon,
        "masking": "pairwise",
    }


#: messages sent to every client at once (one row per receiver in the transcript)
BROADCASTS = {"mpc_opening", "ring_release"}


def sent_bytes(transcript: list[dict], t_max: int, clients: int) -> dict[str, float]:
    """Bytes each member sends per iteration (rounds 1..t_max), a broadcast counted once."""
    total: dict[str, float] = defaultdict(float)
    for row in transcript:
        if 1 <= row["round"] <= t_max:
            fanout = clients if row["name"] in BROADCASTS else 1
            total[row["sender"]] += row["bytes"] / fanout
    return {name: b / t_max for name, b in sorted(total.items())}


def cost(options: dict) -> dict:
    """One run on Ray after a warm-up run (the actors are reused; a fresh actor's first step
    imports the protocol's code, ~0.4 s): driver round trips, bytes and seconds per iteration."""
    rayfed.run("hfl-kmeans", seed=1, out_dir=None, **options)
    result = rayfed.run("hfl-kmeans", seed=0, out_dir=None, **options)
    t_max = result.metrics["t_max"]
    calls = [t for t in result.timings if 1 <= t["round"] <= t_max and t["phase"] != "(round)"]
    by_phase: dict[str, float] = defaultdict(float)
    for t in calls:
        by_phase[t["phase"]] += t["seconds"] / t_max
    sent = sent_bytes(result.transcript.to_pylist(), t_max, options["clients"])
    clients = [v for k, v in sent.items() if k.startswith("p")]
    return {
        "t_max": t_max,
        # remote calls the driver waits for, one after the other (a ring pass is M of them)
        "round_trips_per_iteration": len(calls) / t_max,
        "client_bytes_sent_per_iteration": float(np.mean(clients)),
        "dealer_bytes_sent_per_client_per_iteration": sent.get("dealer", 0.0) / len(clients),
        "ms_per_iteration": result.metrics["ms_per_iteration"],
        "ms_by_phase_per_iteration": {k: 1000 * v for k, v in sorted(by_phase.items())},
        "epsilon": result.privacy.epsilon,
        "delta": result.privacy.delta,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--epsilon", type=float, default=1.0)
    p.add_argument("--grid-seeds", type=int, default=20, help="0: skip the docs-table grid")
    p.add_argument("--out", default="benchmarks/results/hfl_kmeans_mpc.json")
    args = p.parse_args(argv)
    base = base_options(args.epsilon)
    started = time.perf_counter()
    rows = []
    for name, extra in VARIANTS.items():
        options = {**base, **extra}
        wcss = np.array(
            [
                rayfed.run("hfl-kmeans", seed=s, backend="local", out_dir=None, **options).metrics[
                    "wcss"
                ]
                for s in range(args.seeds)
            ]
        )
        row = {
            "variant": name,
            "options": extra,
            "seeds": args.seeds,
            "wcss_mean": float(wcss.mean()),
            "wcss_se": float(wcss.std(ddof=1) / math.sqrt(len(wcss))),
            "wcss": wcss.tolist(),
        }
        if name != "ring local (F1)":
            row["ray"] = cost(options)
        rows.append(row)
        ray = row.get("ray", {})
        print(
            f"{name:<20} WCSS {row['wcss_mean']:.1f} ± {row['wcss_se']:.1f}"
            + (
                f"; {ray['round_trips_per_iteration']:.0f} round trips, "
                f"{ray['client_bytes_sent_per_iteration'] / 1e3:.1f} kB/client, "
                f"{ray['ms_per_iteration']:.0f} ms per iteration"
                if ray
                else ""
            ),
            flush=True,
        )
    grid = []
    if args.grid_seeds:  # F2's cells of the docs' serverless table (the job's seeds 0..n-1)
        for dataset in GRID:
            for eps in (1.0, 4.0):
                for agg in ("nma", "amn"):
                    options = {**base_options(eps, dataset), **VARIANTS["ring mpc (F2)"]}
                    wcss = np.array(
                        [
                            rayfed.run(
                                "hfl-kmeans",
                                seed=s,
                                backend="local",
                                out_dir=None,
                                aggregation=agg,
                                **options,
                            ).metrics["wcss"]
                            for s in range(args.grid_seeds)
                        ]
                    )
                    se = float(wcss.std(ddof=1) / math.sqrt(len(wcss)))
                    grid.append(
                        {
                            "dataset": dataset,
                            "epsilon": eps,
                            "aggregation": agg,
                            "seeds": args.grid_seeds,
                            "wcss_mean": float(wcss.mean()),
                            "wcss_se": se,
                        }
                    )
                    print(f"grid {dataset} ε={eps:g} {agg}: {wcss.mean():.1f} ± {se:.1f}")
    record = {
        "dataset": "s1",
        "clients": CLIENTS,
        "epsilon": args.epsilon,
        "aggregation": "nma",
        "rows": rows,
        "grid": grid,
        "seconds": time.perf_counter() - started,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
