"""vfl-kmeans: the price of charging the parties' FM sketches for what they jointly reveal (they
share the hash keys; issue 25). Normalised loss and intersection error of DPFMPS-2PEst with the
sketches calibrated jointly (the default), with the paper's Lemma 1 noise
(``sketch_calibration=lemma1``: its true ε from the ledger beside it), and IND-LAP, on the
synthetic mixed Gaussian (n = 20,000, m = 8, k = 5) at S = 2, 4 and ε = 1, 4, in-process. Writes
JSON.

    python benchmarks/vfl_kmeans_calibration.py              # 5 seeds, ~5 minutes on 2 cores
    python benchmarks/vfl_kmeans_calibration.py --seeds 2 --out /tmp/cal.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import rayfed

VARIANTS = {
    "dpfmps-2pest": ("dpfmps-2pest", {}),
    "dpfmps-2pest lemma1": ("dpfmps-2pest", {"sketch_calibration": "lemma1"}),
    "ind-lap": ("ind-lap", {}),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument(
        "--out", default=str(Path(__file__).parent / "results" / "vfl_kmeans_calibration.json")
    )
    args = p.parse_args()
    rows = []
    for parties in (2, 4):
        for eps in (1.0, 4.0):
            for name, (method, options) in VARIANTS.items():
                started = time.perf_counter()
                runs = [
                    rayfed.run(
                        "vfl-kmeans",
                        method=method,
                        epsilon=eps,
                        parties=parties,
                        seed=seed,
                        backend="local",
                        out_dir=None,
                        **options,
                    )
                    for seed in range(args.seeds)
                ]
                loss = np.array([r.metrics["loss"] for r in runs])
                error = np.array([r.metrics["intersection_error"] for r in runs])
                row = {
                    "parties": parties,
                    "epsilon": eps,
                    "variant": name,
                    "loss": float(loss.mean()),
                    "loss_se": float(loss.std(ddof=1) / np.sqrt(loss.size)),
                    "intersection_error": float(error.mean()),
                    "k_prime": sorted({r.metrics["k_prime"] for r in runs}),
                    "epsilon_spent": runs[0].privacy.epsilon,
                    "phantoms": runs[0].metrics.get("sketch_phantoms"),
                    "seconds": time.perf_counter() - started,
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    Path(args.out).write_text(json.dumps({"seeds": args.seeds, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
