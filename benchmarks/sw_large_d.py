"""SW-EMS at large d: the dense d̃ x d transition matrix against its structured O(d) product
(rayfed.ldp.wave.WaveOperator), at d = d̃ = 4,096 (the old cap; both, and the code before the
change) and 2^16 (structured only: dense it would take 32 GiB). Writes JSON: time to build M, one
M·x plus one Mᵀ·y (one EMS iteration's products), the whole run (plan, reports, EMS), EMS's
iterations and W1.

    python benchmarks/sw_large_d.py                    # Beta(5,2), n = 10^6, ε = 1; ~2 minutes idle
    python benchmarks/sw_large_d.py --before DIR       # also d = 4,096 with the code in DIR

(The recorded run: ``git archive fe3af1f | tar -x -C DIR``, ``--before-label 'main at
fe3af1f'``.)

At d = 2^16 EMS is capped at 1,000 iterations (its likelihood is still creeping up there; the
10,000 of the default cap would take five minutes): the row reports the time per iteration.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import rayfed
from rayfed.ldp import square_wave as sw
from rayfed.ldp import wave

EPSILON = 1.0
USERS = 1_000_000
CASES = ((4096, "dense", None), (4096, "structured", None), (65_536, "structured", 1000))
RUN = (
    "import json, time, rayfed; t = time.perf_counter(); "
    "r = rayfed.run('square-wave', backend='local', out_dir=None, users={users}, "
    "epsilon={eps}, buckets=4096, seed=0); "
    "print(json.dumps([time.perf_counter() - t, r.metrics['iterations'], "
    "r.metrics['wasserstein']]))"
)


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


def before(checkout: str, label: str) -> dict:
    """d = 4,096 with another checkout's code (its default: the dense matrix), in a fresh
    process."""
    env = dict(os.environ, PYTHONPATH=str(Path(checkout).resolve()))
    code = RUN.format(users=USERS, eps=EPSILON) + "; import rayfed as r; print(r.__file__)"
    done = subprocess.run(  # from inside the checkout: `python -c` puts the cwd first on the path
        [sys.executable, "-c", code],
        env=env,
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
    )
    *_, line, where = done.stdout.strip().splitlines()
    if not where.startswith(str(Path(checkout).resolve())):
        raise RuntimeError(f"the --before run imported rayfed from {where}, not {checkout}")
    seconds, iterations, w1 = json.loads(line)
    return {
        "d": 4096,
        "transition": f"before ({label}: dense, three products per EMS iteration)",
        "run_seconds": seconds,
        "iterations": iterations,
        "wasserstein": w1,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", help="a checkout of the code before the change")
    p.add_argument("--before-label", default="the --before checkout", help="what it is")
    p.add_argument("--out", default="benchmarks/results/sw_large_d.json")
    args = p.parse_args(argv)
    rows = [before(args.before, args.before_label)] if args.before else []
    if rows:
        print(json.dumps(rows[0]), flush=True)
    for d, transition, cap in CASES:
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
            **({} if cap is None else {"max_iterations": cap}),
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
            "max_iterations": cap or sw.MAX_ITERATIONS,
            "wasserstein": result.metrics["wasserstein"],
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps({"epsilon": EPSILON, "n": USERS, "rows": rows}, indent=1) + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
