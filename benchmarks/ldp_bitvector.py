"""LDP bit-vector benchmark: n = 20,000 records end to end on the Ray path, written as JSON.

    python benchmarks/ldp_bitvector.py [--records 20000] [--out benchmarks/results/ldp_bitvector.json]
    python benchmarks/ldp_bitvector.py --consistence [--sizes 200 1000 5000 20000]

Two custodians hold 20,000 two-dimensional records (5 Gaussian blobs, written to a temporary CSV);
each encodes its values as s = 1000 bits per attribute with per-bit randomized response (ε = 2);
the collector builds the 20,000 x 20,000 distance matrix in row blocks (float32: 1.5 GiB) and runs
kCluster. Target (issue 9): within 8 GiB. Memory is the peak summed PSS of the driver and every
process it started (the embedded Ray included).

``--consistence`` times Algorithm 1 (distance consistence, spec §2.4) alone, in this process, on
DPBV distance matrices as the collector builds them for one attribute in the spec's Fig. 5
setting: n values uniform on [0, 25], t = 3, s = 1000, ε = 2, radius 0.5·2t = 3. Per n: seconds,
passes, peak memory (and above the input matrix), ERR_avg (mean |d̂ - d| over all pairs) raw and
chained, beside the spec's reference simulation (raw 3.5, first j 0.57 at ε = 2, s = 1000);
at n <= 1,000 also the row-by-row implementation it replaced (timed, and compared bit for bit).
Writes ``benchmarks/results/ldp_bitvector_consistence.json``.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from reference_consistence import consistence_rowwise  # noqa: E402 (the old loop, timed)

import rayfed
from rayfed.ldp import bitvector as bv
from rayfed.privacy import NoiseSource, binary_randomized_response

TARGET_BYTES = 8 << 30
FIG5 = {"low": 0.0, "high": 25.0, "t": 3.0, "bits": 1000, "epsilon": 2.0, "radius": 3.0}
SPEC_ERR = {"raw": 3.5, "first_j": 0.57}  # spec §2.4 [ref-sim], ε = 2, s = 1000
ROWWISE_MAX = 1000  # the replaced implementation is O(n³) in Python-level rows: time it up to here


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=20_000)
    p.add_argument("--out", default=None)
    p.add_argument("--consistence", action="store_true", help="time Algorithm 1 alone")
    p.add_argument("--sizes", type=int, nargs="+", default=[200, 1000, 5000, 20_000])
    args = p.parse_args(argv)
    if args.consistence:
        return consistence(
            args.sizes, args.out or "benchmarks/results/ldp_bitvector_consistence.json"
        )
    args.out = args.out or "benchmarks/results/ldp_bitvector.json"
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


# --- Algorithm 1 alone --------------------------------------------------------------------------
def consistence(sizes: list[int], out_path: str) -> int:
    rows = [_consistence_point(n) for n in sizes]
    record = {
        "name": "Algorithm 1 (distance consistence) on one DPBV attribute, Fig. 5 setting",
        "setting": FIG5,
        "spec_err_avg": SPEC_ERR,
        "cpus": os.cpu_count(),
        "block_rows": bv.CONSISTENCE_ROWS,
        "chunks": [bv.FIRST_CHUNK, bv.LAST_CHUNK],
        "points": rows,
    }
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    return 0


def _consistence_point(n: int) -> dict:
    """Build one attribute's DPBV matrix as the collector does, then chain it, timed."""
    gen = np.random.default_rng(n)
    low, high, t, s, eps = (FIG5[k] for k in ("low", "high", "t", "bits", "epsilon"))
    x = gen.uniform(low, high, n)
    r = bv.anchors(gen, 1, s, low, high, t)[0]
    noise = NoiseSource.seeded(n, "ldp-bitvector-consistence")
    keep = bv.keep_probability(eps)
    codes = binary_randomized_response(noise, bv.encode(x, r, t), keep_probability=keep)[0]
    d = np.empty((n, n), dtype=np.float32)
    for a in range(0, n, bv.ROW_BLOCK):
        d[a : a + bv.ROW_BLOCK] = bv.debias(
            bv.hamming(codes[a : a + bv.ROW_BLOCK], codes), s, bv.anchor_range(low, high, t), eps
        )
    del codes
    raw_err = _err_avg(d, x)
    rowwise = None
    if n <= ROWWISE_MAX:
        started = time.perf_counter()
        rowwise = consistence_rowwise(d, FIG5["radius"])
        rowwise_seconds = time.perf_counter() - started
    with PeakMemory() as memory:
        time.sleep(0.2)  # a baseline sample with the input matrix in memory
        before = memory.peak
        started = time.perf_counter()
        passes = bv.consistence_in_place(d, FIG5["radius"])
        seconds = time.perf_counter() - started
    point = {
        "records": n,
        "seconds": seconds,
        "passes": passes,
        "peak_bytes": memory.peak,
        "peak_above_input_bytes": memory.peak - before,
        "input_bytes": d.nbytes,
        "err_avg_raw": raw_err,
        "err_avg_chained": _err_avg(d, x),
    }
    if rowwise is not None:
        point["rowwise_seconds"] = rowwise_seconds
        point["identical_to_rowwise"] = bool(np.array_equal(rowwise, d))
    print(json.dumps(point), file=sys.stderr, flush=True)
    return point


def _err_avg(d: np.ndarray, x: np.ndarray) -> float:
    """ERR_avg (Eq. 24) over all pairs i != k, in row blocks."""
    n, total = len(x), 0.0
    for a in range(0, n, bv.ROW_BLOCK):
        rows = np.arange(a, min(n, a + bv.ROW_BLOCK))
        err = np.abs(d[rows] - np.abs(x[rows, None] - x[None, :]))
        err[rows - a, rows] = 0.0  # the diagonal is not a pair
        total += float(err.sum(dtype=np.float64))
    return total / (n * (n - 1))


if __name__ == "__main__":
    sys.exit(main())
