"""LDP bit-vector benchmark: n = 20,000 records end to end on the Ray path, written as JSON.

    python benchmarks/ldp_bitvector.py [--records 20000] [--out benchmarks/results/ldp_bitvector.json]

Two custodians hold 20,000 two-dimensional records (5 Gaussian blobs, written to a temporary CSV);
each encodes its values as s = 1000 bits per attribute with per-bit randomized response (ε = 2);
the collector builds the 20,000 x 20,000 distance matrix in row blocks (float32: 1.5 GiB) and runs
kCluster. Target (issue 9): within 8 GiB. Memory is the peak summed PSS of the driver and every
process it started (the embedded Ray included).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
from _memory import PeakMemory

import rayfed

TARGET_BYTES = 8 << 30


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=20_000)
    p.add_argument("--out", default="benchmarks/results/ldp_bitvector.json")
    args = p.parse_args(argv)
    gen = np.random.default_rng(0)
    centers = gen.uniform(5, 45, (5, 2))
    label = gen.integers(0, 5, args.records)
    x = np.clip(centers[label] + gen.normal(0, 2.0, (args.records, 2)), 0, 50)
    rayfed.ensure_ray()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "blobs.csv"
        pacsv.write_csv(pa.table({"x": x[:, 0], "y": x[:, 1], "label": label}), path)
        with PeakMemory() as memory:
            started = time.perf_counter()
            result = rayfed.run(
                "ldp-bitvector",
                data={"path": str(path)},
                bounds=[0, 50],
                label="label",
                k=5,
                epsilon=2.0,
                out_dir=None,
            )
            seconds = time.perf_counter() - started
    record = {
        "name": f"DPBV + kCluster, {args.records:,} records x 2 attributes, s=1000, ε=2, Ray path",
        "records": args.records,
        "cpus": os.cpu_count(),  # of this machine: the benchmark runs an embedded local Ray
        "seconds": seconds,
        "phase_seconds": result.metrics["phase_seconds"],
        "peak_bytes": memory.peak,
        "within_target": memory.peak <= TARGET_BYTES,
        "nmi": result.metrics["nmi"],
        "bytes_moved": result.transcript_totals["bytes"],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(
        f"{record['name']}: {seconds:.1f} s, peak {memory.peak / 2**30:.2f} GiB, NMI "
        f"{record['nmi']:.3f}; target {'met' if record['within_target'] else 'MISSED'}",
        file=sys.stderr,
    )
    rayfed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
