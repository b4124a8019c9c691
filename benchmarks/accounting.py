"""Privacy-accounting benchmark: the share of a run's time spent in the ledger and in noise
calibration, written as JSON. Target: accounting <= 10 % of the run.

    python benchmarks/accounting.py [--out benchmarks/results/accounting.json]

The run is the one profiled in issue 17: ``federated-mf setting=vfl epsilon=4 parties=5
iterations=100`` on MovieLens-100K from ../shared/data (synthetic ratings when absent), on the
in-process backend (where accounting is the largest share: no actor start-up to hide it) and on
embedded Ray. Accounting time is measured by timing every ledger charge (the coordinator's
``charge_all``, one call per round) and the noise calibration (``gaussian_noise_multiplier``, a
one-off search per distinct configuration; its result and the RDP curves it computes are cached
per process, so both caches are cleared before each run).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path

import rayfed
from rayfed.privacy import calibration
from rayfed.privacy.ledger import MemoRdpAccountant, PrivacyLedger
from rayfed.protocols.federated_mf.partitioned import plan as partitioned_plan

ML100K = Path(__file__).resolve().parents[2] / "shared" / "data" / "movielens-100k" / "ratings.csv"
TARGET_SHARE = 0.10
SPENT = {"charge": 0.0, "calibration": 0.0}


def timed(name: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[name] += time.perf_counter() - started

    return wrapper


def instrument() -> None:
    """Time the ledger's charges and the calibration search where the run calls them (the local
    backend runs the coordinator in this process; on Ray only the calibration is timed here)."""
    PrivacyLedger.charge_all = timed("charge", PrivacyLedger.charge_all)
    search = timed("calibration", calibration.gaussian_noise_multiplier)
    calibration.gaussian_noise_multiplier = partitioned_plan.gaussian_noise_multiplier = search


def measure(backend: str) -> dict:
    options = dict(setting="vfl", epsilon=4.0, parties=5, iterations=100, backend=backend)
    if ML100K.exists():
        options["data"] = {"path": str(ML100K)}
    SPENT.update(charge=0.0, calibration=0.0)
    calibration.gaussian_noise_multiplier.__wrapped__.cache_clear()
    MemoRdpAccountant._curves.clear()  # RDP curves are memoised per process: start cold
    started = time.perf_counter()
    result = rayfed.run("federated-mf", out_dir=None, **options)
    seconds = time.perf_counter() - started
    charge = SPENT["charge"] if backend == "local" else None  # in the coordinator actor on Ray
    accounting = SPENT["calibration"] + (charge or 0.0)
    return {
        "name": f"federated-mf VFL, 5 parties, 100 iterations, ε=4, {backend} backend",
        "backend": backend,
        "data": "ML-100K" if ML100K.exists() else "synthetic",
        "seconds": seconds,
        "charge_seconds": charge,
        "charges": len(result.privacy.entries),
        "calibration_seconds": SPENT["calibration"],
        "accounting_share": accounting / seconds,
        "within_target": accounting / seconds <= TARGET_SHARE,
        "test_mse": result.metrics["test_mse"],
        "epsilon": result.privacy.epsilon,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/results/accounting.json")
    args = p.parse_args(argv)
    instrument()
    records = [measure("local"), measure("ray")]
    rayfed.shutdown()
    for r in records:
        charge = "n/a" if r["charge_seconds"] is None else f"{r['charge_seconds']:.2f} s"
        print(
            f"{r['name']}: {r['seconds']:.1f} s; charges {charge} ({r['charges']}), "
            f"calibration {r['calibration_seconds']:.2f} s; accounting share "
            f"{r['accounting_share']:.1%} (target <= {TARGET_SHARE:.0%})",
            file=sys.stderr,
        )
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    Path(args.out).write_text(json.dumps({"target_share": TARGET_SHARE, "runs": records}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
