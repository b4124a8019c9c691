"""Scale targets: each row holds the target beside the measured number. Writes JSON.

    python benchmarks/scale.py                    # every target (about 45 minutes on 2 cores)
    python benchmarks/scale.py --only overhead    # one: secagg-100k, dealer-1m, lfl-100k, overhead,
                                                  # main-job, stream-10m

Rows merge into ``benchmarks/results/scale.json`` by name, so the targets can be run one at a time.

* ``secagg-100k`` — SecAgg+ with real crypto (X25519, AES-GCM, Shamir, keys from the OS),
  n = 10^5, d = 1,000, the finder's k and t, 30 % dropout after the masked input: one round.
* ``dealer-1m``   — dealer mode, n = 10^6, d = 1,000, the same dropout: one round.
* ``lfl-100k``    — LFL federated-mf, 10^5 synthetic users, dealer secure aggregation, 10
  iterations.
* ``stream-10m``  — secure-sum through ``rayfed.run``, dealer mode, n = 10^7, d = 100, 2 cohorts,
  30 % dropout at unmask, one round: cohorts and the reference generate their users in chunks,
  so peak memory stays ≤ 16 GiB (n > 1,048,581 needs the wider Shamir field, or its check lifted).
* ``main-job``    — the README's ``rayfed run federated-mf`` in a fresh process: ≤ 60 s.
* ``overhead``    — secure-sum, secure mode, n = 1,000, d = 1,000, k = 10, t = 7, repeated in one
  process: the run's time outside its phases, the round against the 2-core primitive bound, and
  the advertise time per key (n = 1,000 and n = 10,000). The bound is the per-user protocol's
  work (two X25519 agreements and two mask expansions per pair); the simulator does a same-cohort
  pair once, so it can come closer to the bound than real users could.

Memory is the peak of the summed proportional set size of the driver and every process it
started (``_memory.PeakMemory``); the secure-aggregation rows also hold the per-phase peaks the
actors report themselves (``secagg.run_one``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _memory import PeakMemory
from secagg import measure_primitives, run_one, with_bounds

import rayfed
from rayfed.secagg import FixedPoint

GIB = 2**30
OVERHEAD_RUN = dict(
    users=1000, dim=1000, mode="secure", degree=10, threshold=7, allow_weak_params=True
)


def secagg_100k(prim: dict) -> dict:
    record = with_bounds(run_one("secagg+ n=100k d=1k", 100_000, 1_000, "secagg+", 0.3), prim)
    return _row(record, seconds=1200, peak_gib=16)


def dealer_1m(prim: dict) -> dict:
    record = with_bounds(run_one("dealer n=1M d=1k", 1_000_000, 1_000, "dealer", 0.3), prim)
    return _row(record, seconds=300, peak_gib=24)


def _row(record: dict, *, seconds: float, peak_gib: float) -> dict:
    measured = {"seconds": record["wall_seconds"], "peak_gib": record["peak_bytes"] / GIB}
    target = {"seconds": seconds, "peak_gib": peak_gib}
    return {
        "name": record["name"],
        "target": target,
        "measured": measured,
        "met": all(measured[k] <= target[k] for k in target) and record["exact"],
        "detail": record,
    }


STREAM_RUN = dict(mode="dealer", dim=100, dropout=0.3, rounds=1, cohorts=2, deadline_s=3600.0)


def stream(users: int) -> dict:
    """secure-sum through ``rayfed.run`` (plan, cohorts, driver and its exact reference), dealer
    mode, d = 100, 2 cohorts, one round, 30 % of the users lost after their masked input."""
    options = dict(STREAM_RUN, users=users)
    with PeakMemory() as memory:
        started = time.perf_counter()
        result = rayfed.run("secure-sum", out_dir=None, **options)
        seconds = time.perf_counter() - started
    return {
        "options": options,
        "seconds": seconds,
        "peak_gib": memory.peak / GIB,
        "exact": bool(result.metrics["exact"]),
        "survivors": result.metrics["rounds"][0]["survivors"],
        "phase_seconds": result.metrics["phase_seconds"],
    }


def stream_10m(prim: dict) -> dict:
    """n = 10^7 users that stream: cohorts generate, mask and sum their users in chunks."""
    record = stream(10_000_000)
    measured = {"seconds": record["seconds"], "peak_gib": record["peak_gib"]}
    return {
        "name": "stream n=10M d=100 dealer, 2 cohorts, 30% dropout after masked input",
        "target": {"peak_gib": 16},
        "measured": measured,
        "met": record["peak_gib"] <= 16 and record["exact"],
        "detail": record,
    }


def lfl_100k(prim: dict) -> dict:
    options = dict(users=100_000, items=200, secagg_mode="dealer", iterations=10)
    with PeakMemory() as memory:
        started = time.perf_counter()
        result = rayfed.run("federated-mf", out_dir=None, **options)
        seconds = time.perf_counter() - started
    measured = {"seconds": seconds, "peak_gib": memory.peak / GIB}
    return {
        "name": "LFL federated-mf 100k synthetic users, dealer SA, 10 iterations",
        "target": {"seconds": 600},
        "measured": measured,
        "met": seconds <= 600,
        "detail": {
            "options": options,
            "test_mse": result.metrics["test_mse"],
            "epsilon": result.privacy.epsilon,
            "secagg_degree": result.metrics["secagg_degree"],
            "phase_seconds": result.metrics["phase_seconds"],
            "bytes_moved": result.transcript_totals["bytes"],
        },
    }


def _phases(result) -> dict[str, float]:
    return {k: float(v) for k, v in result.metrics["phase_seconds"].items()}


def overhead(prim: dict, reps: int = 5) -> dict:
    """The same small secure round ``reps`` times after one warm-up run (Ray already up)."""
    rayfed.run("secure-sum", out_dir=None, **OVERHEAD_RUN)
    runs = []
    for seed in range(reps):
        started = time.perf_counter()
        result = rayfed.run("secure-sum", out_dir=None, seed=seed, **OVERHEAD_RUN)
        wall = time.perf_counter() - started
        phases = _phases(result)
        runs.append({"wall": wall, "phases": phases, "outside": wall - sum(phases.values())})
    n, k, d = OVERHEAD_RUN["users"], OVERHEAD_RUN["degree"], OVERHEAD_RUN["dim"]
    # 2 X25519 agreements per user and neighbour; keystream of n self masks and n*k pair masks
    words = FixedPoint.choose(n, 1.0, 16).dtype.itemsize
    bound_serial = (
        2 * n * k * prim["x25519_exchange_s"] + n * (k + 1) * d * words / prim["prg_bytes_per_s"]
    )
    bound = bound_serial / 2  # two cores
    client = ("advertise", "share_keys", "masked_input", "unmask")
    round_s = float(np.median([sum(r["phases"].get(p, 0) for p in client) for r in runs]))
    outside = float(np.median([r["outside"] for r in runs]))
    advertise = {}
    for users in (1_000, 10_000):
        result = rayfed.run("secure-sum", out_dir=None, **{**OVERHEAD_RUN, "users": users})
        advertise[users] = _phases(result)["advertise"]
    measured = {
        "outside_phases_seconds": outside,
        "round_seconds": round_s,
        "round_over_bound": round_s / bound,
        "advertise_seconds_per_key": {u: s / u for u, s in advertise.items()},
    }
    return {
        "name": "secure-sum n=1k d=1k k=10 t=7 secure: per-run overhead and round vs bound",
        "target": {"outside_phases_seconds": 1.0, "round_over_bound": 2.0},
        "measured": measured,
        "met": outside <= 1.0 and round_s / bound <= 2.0,
        "detail": {
            "options": OVERHEAD_RUN,
            "runs": runs,
            "primitive_bound_2_cores_seconds": bound,
            "advertise_seconds": advertise,
        },
    }


def main_job(prim: dict) -> dict:
    """The README's main job as a newcomer runs it: ``rayfed run federated-mf`` in a fresh process
    (Ray's start included), its defaults untouched."""
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        done = subprocess.run(
            [str(Path(sys.executable).parent / "rayfed"), "run", "federated-mf", "--out", out],
            capture_output=True,
            text=True,
            check=True,
        )
        seconds = time.perf_counter() - started
        (path,) = Path(out).glob("*/manifest.json")
        manifest = json.loads(path.read_text())
    return {
        "name": "README main job: rayfed run federated-mf (a fresh process)",
        "target": {"seconds": 60},
        "measured": {"seconds": seconds, "run_seconds": manifest["seconds"]},
        "met": seconds <= 60,
        "detail": {"summary": done.stdout, "phase_seconds": manifest["metrics"]["phase_seconds"]},
    }


TARGETS = {
    "main-job": main_job,
    "overhead": overhead,
    "secagg-100k": secagg_100k,
    "dealer-1m": dealer_1m,
    "lfl-100k": lfl_100k,
    "stream-10m": stream_10m,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/results/scale.json")
    p.add_argument("--only", choices=sorted(TARGETS), action="append")
    args = p.parse_args(argv)
    out = Path(args.out)
    previous = json.loads(out.read_text()) if out.exists() else {"results": []}
    rows = {r["name"]: r for r in previous["results"]}
    rayfed.ensure_ray()
    prim = measure_primitives()
    for key in args.only or list(TARGETS):
        row = TARGETS[key](prim)
        rows[row["name"]] = row
        print(f"{key}: measured {row['measured']} target {row['target']} met={row['met']}")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(
            json.dumps(
                {
                    "machine": {
                        "cpus": os.cpu_count(),
                        "python": platform.python_version(),
                        **prim,
                    },
                    "versions": {"rayfed": rayfed.__version__},
                    "results": list(rows.values()),
                },
                indent=2,
                default=float,
            )
            + "\n"
        )
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
