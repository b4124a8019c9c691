"""SW-EMS at large d: the dense d̃ x d transition matrix against its structured O(d) product
(rayfed.ldp.wave.WaveOperator), at d = d̃ = 4,096 (the old cap; both) and 2^16 (structured only:
dense it would take 32 GiB). Writes JSON: time to build M, one M·x plus one Mᵀ·y, the whole run
(plan, reports, EMS), EMS's iterations and W1.

    python benchmarks/sw_large_d.py          # Beta(5,2), n = 10^6, ε = 1; ~2 minutes
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

import rayfed
from rayfed.ldp import square_wave as sw
from rayfed.ldp import wave

EPSILON = 1.0
USERS = 1_000_000
CASES = ((4096, "dense"), (4096, "structured"), (65_536, "structured"))


def product_seconds(d: int, transition: str) -> tuple[float, float, int]:
    """(seconds to build M, seconds of one M·x and one Mᵀ·y, bytes M holds)."""
    b = sw.band_half_width(EPSILON)
    started = time.perf_counter()
    if transition == "dense":
        m = wave.transition_matrix(EPSILON, b, 1.0, d, d)
        held = m.nbytes
    else:
        m = wave.WaveOperator(EPSILON, b, 1.0, d, d)
        held = 0  # only the grid's size; each product allocates a few O(d) vectors
    built = time.perf_counter() - started
    x = np.full(d, 1.0 / d)
    started = time.perf_counter()
    for _ in range(5):
        m.T @ (m @ x)
    return built, (time.perf_counter() - started) / 5, held


def main(out: str = "benchmarks/results/sw_large_d.json") -> int:
    rows = []
    for d, transition in CASES:
        built, product, held = product_seconds(d, transition)
        started = time.perf_counter()
        result = rayfed.run(
            "square-wave",
            backend="local",
            out_dir=None,
            users=USERS,
            epsilon=EPSILON,
            buckets=d,
            transition=transition,
            seed=0,
        )
        seconds = time.perf_counter() - started
        row = {
            "d": d,
            "transition": transition,
            "build_seconds": built,
            "product_seconds": product,
            "matrix_bytes": held,
            "run_seconds": seconds,
            "iterations": result.metrics["iterations"],
            "wasserstein": result.metrics["wasserstein"],
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(
        json.dumps({"epsilon": EPSILON, "n": USERS, "rows": rows}, indent=1) + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
