"""Square Wave benchmark: 10^6 users end to end on the Ray path, written as JSON.

    python benchmarks/square_wave.py [--users 1000000] [--out benchmarks/results/square_wave.json]

One run of ``rayfed run square-wave`` (SW-EMS, ε = 1, d = 256, Beta(5, 2)) on an embedded local Ray
with one cohort per CPU: plan (data, dealing users to cohorts), actors, every user's perturbation
in the cohorts, aggregation and EMS on the coordinator. Target (issue 7): <= 30 s and <= 4 GiB on
2 cores. Ray's own start is timed separately; memory is the peak of the summed proportional set
size (PSS) of the driver and every process it started (the embedded Ray's raylet, GCS and
workers), sampled every 50 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from _memory import PeakMemory

import rayfed

TARGET_S, TARGET_BYTES = 30.0, 4 << 30


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--users", type=int, default=1_000_000)
    p.add_argument("--buckets", type=int, default=256)
    p.add_argument("--out", default="benchmarks/results/square_wave.json")
    args = p.parse_args(argv)
    started = time.perf_counter()
    rayfed.ensure_ray()
    ray_start = time.perf_counter() - started
    with PeakMemory() as memory:
        started = time.perf_counter()
        result = rayfed.run(
            "square-wave", users=args.users, buckets=args.buckets, out_dir=None, progress=False
        )
        seconds = time.perf_counter() - started
    record = {
        "name": f"SW-EMS, {args.users:,} users, d={args.buckets}, ε=1, Ray path",
        "users": args.users,
        "cpus": os.cpu_count(),  # of this machine: the benchmark runs an embedded local Ray
        "cohorts": len(
            [c for c in result.transcript_totals["bytes_by_sender"] if c != "coordinator"]
        ),
        "ray_start_seconds": ray_start,
        "seconds": seconds,
        "phase_seconds": result.metrics["phase_seconds"],
        "peak_bytes": memory.peak,
        "within_target": seconds <= TARGET_S and memory.peak <= TARGET_BYTES,
        "ems_iterations": result.metrics["iterations"],
        "wasserstein": result.metrics["wasserstein"],
        "bytes_moved": result.transcript_totals["bytes"],
        "epsilon": result.privacy.epsilon,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(
        f"{record['name']}: {seconds:.1f} s (Ray start {ray_start:.1f} s), peak "
        f"{memory.peak / 2**30:.2f} GiB, W1 {record['wasserstein']:.2e}; target "
        f"{'met' if record['within_target'] else 'MISSED'}",
        file=sys.stderr,
    )
    rayfed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
