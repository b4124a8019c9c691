"""Hierarchical aggregation (issue 29 item 4): one secure-sum round, ``dealer`` mode, flat against
``hierarchy=revealed`` and ``hierarchy=secure`` with G groups, in process (``backend=local``),
30 % tolerated dropout, 10 % lost at unmask; ``--repeat`` passes over the three (the first pass
pays the process's warm-up: compare the later ones). Wall time of ``rayfed.run`` and its phases; every
run's exactness check. Writes JSON.

    python benchmarks/hierarchy.py                          # n = 10^5, d = 100, G = 10
    python benchmarks/hierarchy.py --users 20000 --groups 4 # a quicker one
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import rayfed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--users", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=100)
    p.add_argument("--groups", type=int, default=10)
    p.add_argument(
        "--cohorts",
        type=int,
        default=None,
        help="default groups + 2: secure needs a cohort per aggregator holding none of its users",
    )
    p.add_argument(
        "--repeat", type=int, default=2, help="passes over the three (the first warms up)"
    )
    p.add_argument("--out", default="benchmarks/results/hierarchy.json")
    args = p.parse_args(argv)
    if args.cohorts is None:
        args.cohorts = args.groups + 2
    rows, load = [], [round(x, 2) for x in os.getloadavg()]
    passes = [v for _ in range(args.repeat) for v in ("none", "revealed", "secure")]
    for i, variant in enumerate(passes):
        extra = {} if variant == "none" else {"hierarchy": variant, "groups": args.groups}
        start = time.perf_counter()
        result = rayfed.run(
            "secure-sum", backend="local", out_dir=None, users=args.users, dim=args.dim,
            mode="dealer", dropout=0.1, cohorts=args.cohorts, seed=1, **extra,
        )  # fmt: skip
        seconds = time.perf_counter() - start
        m = result.metrics
        rows.append(
            {
                "pass": i // 3,
                "hierarchy": variant,
                "groups": args.groups if extra else 1,
                "exact": m["exact"],
                "degree": m["degree"],  # the largest group's in a hierarchy
                "threshold": m["threshold"],
                "survivors": m["rounds"][0]["survivors"],
                "server_learned": m.get("hierarchy", {}).get("server_learned"),
                "run_seconds": round(seconds, 2),
                "phase_seconds": {k: round(v, 3) for k, v in m["phase_seconds"].items()},
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    machine = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_before": load,  # the 1/5/15-minute load average: the machine is shared
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    out = {"users": args.users, "dim": args.dim, "mode": "dealer", "cohorts": args.cohorts,
           "machine": machine, "rows": rows}  # fmt: skip
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
