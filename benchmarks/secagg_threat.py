"""What the threat model costs (issue 26): per n, the finder's k, t and both failure bounds under
``threat_model=semi-honest`` and ``malicious``, and the wall time of one secure-sum round in
``simulation`` mode (the same X25519, AES-GCM, Shamir and Ed25519 work as ``secure``, seeded),
d = 10, no dropout, in process (``backend=local``). Writes JSON.

    python benchmarks/secagg_threat.py                      # n = 200, 1000, 5000; ~10 minutes
    python benchmarks/secagg_threat.py --users 200 1000     # a quicker subset
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import rayfed


def _log2(x: float) -> float | None:
    return None if x == -math.inf else round(x, 2)  # None: the failure cannot occur


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--users", type=int, nargs="+", default=[200, 1000, 5000])
    p.add_argument("--dim", type=int, default=10)
    p.add_argument("--out", default="benchmarks/results/secagg_threat.json")
    args = p.parse_args(argv)
    rows, load = [], [round(x, 2) for x in os.getloadavg()]
    for n in args.users:
        for model in ("semi-honest", "malicious"):
            start = time.perf_counter()
            result = rayfed.run(
                "secure-sum", backend="local", out_dir=None, users=n, dim=args.dim,
                threat_model=model, cohorts=2, seed=1,
            )  # fmt: skip
            seconds = time.perf_counter() - start
            m = result.metrics  # the run's own parameters, not a recomputation
            assert m["threat_model"] == model
            rows.append(
                {
                    "users": n,
                    "threat_model": model,
                    "degree": m["degree"],
                    "threshold": m["threshold"],
                    "min_survivors": m["min_survivors"],
                    "complete": m["complete_graph"],
                    "log2_security_failure": _log2(m["log2_security_failure"]),
                    "log2_correctness_failure": _log2(m["log2_correctness_failure"]),
                    "exact": result.metrics["exact"],
                    "round_seconds": round(seconds, 2),
                    "phase_seconds": {
                        k: round(v, 3) for k, v in result.metrics["phase_seconds"].items()
                    },
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    machine = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        # the 1/5/15-minute load average before and after: the machine is shared
        "load_before": load,
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    cfg = result.config["protocol"]  # the options every row ran with (secure-sum's defaults)
    out = {"dim": args.dim, "mode": cfg["mode"], "tolerated_dropout": cfg["tolerated_dropout"],
           "corrupt_fraction": cfg["corrupt_fraction"], "sigma": cfg["sigma"], "eta": cfg["eta"],
           "machine": machine, "rows": rows}  # fmt: skip
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
