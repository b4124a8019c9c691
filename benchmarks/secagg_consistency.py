"""The cost of secure-sum's consistency round with authenticated keys (issue 18): phase seconds
with and without it in ``secure`` mode (real X25519, AES-GCM, Shamir and Ed25519). Since issue 26
the round comes with ``threat_model=malicious``, which also raises k and t (its cost:
benchmarks/secagg_threat.py), so this no longer isolates the consistency round's own cost; the
recorded JSON is from before. Writes JSON.

    python benchmarks/secagg_consistency.py          # n = 2,000, d = 100, 3 runs each; ~1 minute
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

import rayfed


def main(out: str = "benchmarks/results/secagg_consistency.json", runs: int = 3) -> int:
    rows = []
    for consistency in (False, True):
        phases = [
            rayfed.run(
                "secure-sum", backend="local", out_dir=None, users=2000, dim=100, mode="secure",
                threat_model="malicious" if consistency else "semi-honest", seed=s,
            ).metrics["phase_seconds"]
            for s in range(runs)
        ]  # fmt: skip
        mean = {k: float(np.mean([p.get(k, 0.0) for p in phases])) for k in phases[0]}
        rows.append({"consistency": consistency, "runs": runs, "phase_seconds": mean,
                     "round_seconds": float(sum(mean.values()))})  # fmt: skip
        print(f"consistency={consistency}: {rows[-1]['round_seconds']:.2f} s", mean, flush=True)
    Path(out).write_text(json.dumps({"users": 2000, "dim": 100, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
