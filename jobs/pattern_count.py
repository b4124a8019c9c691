"""Run the pattern-count protocol (VFL, randomized response per party) on a Ray cluster.

Self-contained: `ray submit` uploads only this file, so it imports nothing from jobs/.

    ray submit cluster.yaml jobs/pattern_count.py -- --users 1000000
    ray job submit --working-dir . -- python jobs/pattern_count.py --small
    python jobs/pattern_count.py --small            # local: a running cluster, else embedded Ray

Prints the run's summary, then one last line ``RESULT_JSON {...}`` for scripts to parse.
Exit code: 0 on success, 2 on a configuration error, 1 on any other failure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

import rayfed

SMALL_USERS = 5000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", action="store_true", help=f"a quick run with {SMALL_USERS} users")
    p.add_argument("--users", type=int, help="number of users m (default: the protocol's)")
    p.add_argument("--parties", type=int, help="number of parties v (default: the protocol's)")
    p.add_argument("--epsilon", type=float, default=1.0, help="privacy budget per party")
    p.add_argument("--seed", type=int, default=0, help="root seed of the run")
    p.add_argument("--out", default="runs", help="directory for run directories")
    p.add_argument(
        "--address",
        help="Ray address (default: RAY_ADDRESS, else 'auto', falling back to an embedded local Ray)",
    )
    args = p.parse_args(argv)
    if args.small and args.users is None:
        args.users = SMALL_USERS
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    options = {"seed": args.seed, "epsilon": args.epsilon, "out_dir": args.out}
    options.update(
        {k: v for k, v in (("users", args.users), ("parties", args.parties)) if v is not None}
    )
    try:
        address, resources = rayfed.connect(args.address, "pattern_count")
        result = rayfed.run("pattern-count", address=address, **options)
        nodes = _node_count()
    except Exception as err:
        if not isinstance(err, rayfed.RayfedError):
            traceback.print_exc(file=sys.stderr)
        print(f"pattern_count: {type(err).__name__}: {err}", file=sys.stderr)
        return 2 if isinstance(err, rayfed.ConfigError) else 1
    finally:
        rayfed.shutdown()
    print(result.summary())
    metrics = result.metrics
    record = {
        "protocol": result.protocol,
        "run_id": result.run_id,
        "epsilon": result.privacy.epsilon,
        "delta": result.privacy.delta,
        "metrics": {
            k: metrics.get(k) for k in ("users", "max_abs_error", "rmse", "mean_predicted_sd")
        },
        "run_dir": os.path.abspath(result.run_dir) if result.run_dir else None,
        "address": address or "embedded",
        "ray": {"CPU": resources.get("CPU"), "nodes": nodes},
    }
    print("RESULT_JSON " + json.dumps(record, sort_keys=True), flush=True)
    return 0


def _node_count() -> int:
    import ray

    return sum(1 for node in ray.nodes() if node.get("Alive"))


if __name__ == "__main__":
    sys.exit(main())
