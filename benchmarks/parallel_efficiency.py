"""Parallel efficiency of one secure-sum round: one configuration per fresh process, pinned by the
caller to K cores, Ray started with num_cpus = K. Prints one JSON line.

    taskset -c 0-$((K-1)) python benchmarks/parallel_efficiency.py --cpus K

The run is the issue's: secure-sum, mode=secure (real X25519, AES-GCM, Shamir, keys from the OS),
n = 20,000, d = 1,000, 16 cohorts, 20 % of the users lost after their masked input (i.i.d., below
the tolerated 30 %: at exactly the tolerated rate a round aborts about half the time). On the
16-core machine (benchmarks/README.md, "scale-out"), with ``.device-bundle/`` carried along:

    bash .device-bundle/run.sh bash -c 'for k in 2 4 8 16; do taskset -c 0-$((k-1)) python3 \\
        benchmarks/parallel_efficiency.py --cpus $k; done' | tee benchmarks/results/parallel_efficiency.jsonl

then ``python benchmarks/scale.py --only parallel-efficiency`` reads those lines into scale.json:
efficiency E_K = (T_2 · 2) / (T_K · K), T the round's seconds (its phases, the actors' start left
out; the run's wall time beside it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # secagg.py beside this file

from secagg import busy_split  # noqa: E402

import rayfed  # noqa: E402

RUN = dict(users=20_000, dim=1_000, cohorts=16, dropout=0.2)


def efficiency(times: dict[int, float], base: int = 2) -> dict[int, float]:
    """E_K = (T_base · base) / (T_K · K): 1 when K cores are K/base times as fast."""
    if base not in times:
        raise ValueError(f"no run at {base} cores to compare with (have {sorted(times)})")
    return {k: times[base] * base / (t * k) for k, t in sorted(times.items())}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpus", type=int, required=True, help="K: Ray's num_cpus (pin with taskset)")
    p.add_argument("--users", type=int, default=RUN["users"])
    p.add_argument("--dim", type=int, default=RUN["dim"])
    p.add_argument("--cohorts", type=int, default=RUN["cohorts"])
    p.add_argument("--dropout", type=float, default=RUN["dropout"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a secure-sum option, passed through (e.g. server_shards=4 once it exists)",
    )
    args = p.parse_args(argv)
    pinned = len(os.sched_getaffinity(0))
    if pinned != args.cpus:
        p.error(
            f"this process may run on {pinned} cores, not --cpus {args.cpus}: pin it, "
            f"taskset -c 0-{args.cpus - 1} python {' '.join(sys.argv)}"
        )
    rayfed.ensure_ray(num_cpus=args.cpus)
    options = dict(users=args.users, dim=args.dim, cohorts=args.cohorts, dropout=args.dropout)
    started = time.perf_counter()
    result = rayfed.run(
        "secure-sum", out_dir=None, sets=args.set, mode="secure", seed=args.seed, **options
    )
    wall = time.perf_counter() - started
    split = busy_split(result.timings)
    print(
        json.dumps(
            {
                "cpus": args.cpus,
                "pinned_cores": pinned,
                **options,
                "sets": args.set,
                "mode": "secure",
                "exact": bool(result.metrics["exact"]),
                "degree": result.metrics["degree"],
                "threshold": result.metrics["threshold"],
                "wall_seconds": wall,
                "round_seconds": split["round_seconds"],
                "server_seconds": split["server_seconds"],
                "phase_seconds_by_role": split["phase_seconds_by_role"],
                "machine": {"cpu_count": os.cpu_count(), "cpu": _cpu_model()},
                "versions": {"rayfed": rayfed.__version__, "python": platform.python_version()},
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
