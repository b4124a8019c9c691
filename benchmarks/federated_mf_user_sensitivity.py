"""What the tight per-user Δ buys federated-mf on ML-100K: VFL and HFL per user at ε = 0.5, 1
and 4, the test MSE with the thesis's θ·Δ (``user_sensitivity=thesis``) and with the tight bound
(a user's θ ratings on distinct items: √(θ²+θ)·2R^{3/2} joint, √θ·2R^{3/2} for V; the default),
at the same z and seeds — and, as the floor a model must beat, the test MSE of predicting the
training mean.

    python benchmarks/federated_mf_user_sensitivity.py [--seeds 0,1] [--out benchmarks/results/federated_mf_user_sensitivity.json]

The runs are benchmarks/federated_mf_tight.py's per-user rows (5 parties, (T, T') = (100, 10),
η = 0.01, δ = 1/|ratings|, θ = 5 (VFL) / 10 (HFL), vfl_lr 0.05, the tightest accountant): its
"after" column is the thesis column here, bit for bit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from federated_mf_tight import EPSILONS, options

import rayfed
from rayfed.config import DataConfig
from rayfed.protocols import get_protocol
from rayfed.protocols.federated_mf.config import FederatedMFConfig

SETTINGS = ("vfl", "hfl")
RULES = ("thesis", "tight")


def mean_predictor_mse(seed: int) -> float:
    """Test MSE of predicting every test rating by the training mean, on the runs' own split."""
    opts = options("vfl", "user", 1.0, "tightest", seed)
    kept = {k: v for k, v in opts.items() if k not in ("backend", "out_dir", "seed", "data")}
    cfg = FederatedMFConfig(**kept, data=DataConfig(**opts["data"]))
    ev = get_protocol("federated-mf").plan(cfg, seed).evaluation
    return float(np.mean((ev["test"].rating - ev["train"].rating.mean()) ** 2))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--out", default="benchmarks/results/federated_mf_user_sensitivity.json")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    started = time.perf_counter()
    floor = [mean_predictor_mse(s) for s in seeds]
    rows = []
    for setting in SETTINGS:
        for epsilon in EPSILONS:
            row = {"setting": setting, "epsilon": epsilon}
            for rule in RULES:
                runs = []
                for seed in seeds:
                    opts = options(setting, "user", epsilon, "tightest", seed)
                    result = rayfed.run("federated-mf", **opts, user_sensitivity=rule)
                    runs.append(
                        {
                            "seed": seed,
                            "noise_multiplier": result.metrics["noise_multiplier"],
                            "test_mse": result.metrics["test_mse"],
                            "train_mse": result.metrics["train_mse"],
                            "epsilon": result.privacy.epsilon,
                        }
                    )
                row[rule] = {
                    "test_mse_mean": statistics.fmean(r["test_mse"] for r in runs),
                    "runs": runs,
                }
            row["mse_gain"] = row["thesis"]["test_mse_mean"] - row["tight"]["test_mse_mean"]
            rows.append(row)
            print(
                f"{setting} per-user ε={epsilon:<3g} test MSE {row['thesis']['test_mse_mean']:.4f}"
                f" -> {row['tight']['test_mse_mean']:.4f}",
                file=sys.stderr,
            )
    record = {
        "data": "ML-100K (943 users, 1,682 items, 100,000 ratings), 5 parties",
        "settings": "per user, (T, T') = (100, 10), η = 0.01, δ = 1/|ratings|, θ = 5 (VFL) / "
        "10 (HFL), vfl_lr 0.05, accountant tightest",
        "thesis": "user_sensitivity=thesis: θ times one rating's Δ",
        "tight": "user_sensitivity=tight (default): θ ratings on distinct items",
        "seeds": seeds,
        "mean_predictor_test_mse": floor,
        "wall_s": round(time.perf_counter() - started, 1),
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
