"""Run the pattern-count protocol (VFL, randomized response per party) on a Ray cluster.

Needs rayfed installed where it runs (cluster.yaml installs it on every node); the common flags,
the Ray connection and the exit codes come from ``rayfed.jobs``.

    ray submit cluster.yaml jobs/pattern_count.py -- --users 1000000
    ray job submit --working-dir . -- python jobs/pattern_count.py --small
    python jobs/pattern_count.py --small            # local: a running cluster, else embedded Ray

Prints the run's summary, then one last line ``RESULT_JSON {...}`` for scripts to parse.
Exit code: 0 on success, 2 on a configuration error, 1 on any other failure.
"""

from __future__ import annotations

import os

import rayfed
from rayfed import jobs

SMALL_USERS = 5000


def body(args) -> dict:
    options = {"seed": args.seed, "epsilon": args.epsilon, "out_dir": args.out}
    options.update(
        {k: v for k, v in (("users", args.users), ("parties", args.parties)) if v is not None}
    )
    result = rayfed.run("pattern-count", address=args.address, **options)
    print(result.summary())
    metrics = result.metrics
    return {
        "protocol": result.protocol,
        "run_id": result.run_id,
        "epsilon": result.privacy.epsilon,
        "delta": result.privacy.delta,
        "metrics": {
            k: metrics.get(k) for k in ("users", "max_abs_error", "rmse", "mean_predicted_sd")
        },
        "run_dir": os.path.abspath(result.run_dir) if result.run_dir else None,
        "address": args.address or "embedded",
        "ray": {"CPU": args.resources.get("CPU"), "nodes": _node_count()},
    }


def _node_count() -> int:
    import ray

    return sum(1 for node in ray.nodes() if node.get("Alive"))


def main(argv: list[str] | None = None) -> int:
    p = jobs.parser(__doc__, small=f"a quick run with {SMALL_USERS} users", seed=True)
    p.add_argument("--users", type=int, help="number of users m (default: the protocol's)")
    p.add_argument("--parties", type=int, help="number of parties v (default: the protocol's)")
    p.add_argument("--epsilon", type=float, default=1.0, help="privacy budget per party")
    args = p.parse_args(argv)
    if args.small and args.users is None:
        args.users = SMALL_USERS
    return jobs.run("pattern_count", body, args)


if __name__ == "__main__":
    raise SystemExit(main())
