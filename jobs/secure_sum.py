"""Run secure aggregation (SecAgg / SecAgg+, protocol ``secure-sum``) on a Ray cluster, then write
its report (plots and a one-page HTML summary) into the run directory.

Needs rayfed installed where it runs (cluster.yaml installs it on every node); the common flags,
the Ray connection and the exit codes come from ``rayfed.jobs``.

    ray submit cluster.yaml jobs/secure_sum.py -- --users 100000 --dropout 0.1
    ray job submit --working-dir . -- python jobs/secure_sum.py --small --cohorts 8 \
        --fail cohort=1@phase=masked_input   # one cohort of 8 dies: its users drop out
    python jobs/secure_sum.py --small            # local: a running cluster, else embedded Ray
    python jobs/secure_sum.py --small --mode secure --threat-model malicious   # + consistency, t > (k+c)/2

Prints the run's summary, then one last line ``RESULT_JSON {...}``. Exit code: 0 on success, 2 on a
configuration error, 1 on any other failure (BelowThreshold when too many users drop).
"""

from __future__ import annotations

import rayfed
from rayfed import jobs
from rayfed.report import report

SMALL_USERS = 500


def body(args) -> dict:
    options = dict(
        users=args.users,
        dim=args.dim,
        rounds=args.rounds,
        dropout=args.dropout,
        mode=args.mode,
        seed=args.seed,
        out_dir=args.out,
        fail=args.fail,
    )
    if args.cohorts:
        options["cohorts"] = args.cohorts
    if args.threat_model != "semi-honest":
        options["threat_model"] = args.threat_model
    result = rayfed.run("secure-sum", address=args.address, **options)
    print(result.summary())
    written = report(result.run_dir)
    return {
        "protocol": result.protocol,
        "run_dir": result.run_dir,
        "headline": result.headline,
        "per_round": result.metrics.get("per_round", []),
        "seconds": result.seconds,
        "report": str(written[-1]),
    }


def main(argv: list[str] | None = None) -> int:
    p = jobs.parser(__doc__, small=f"{SMALL_USERS} users, 2 rounds", seed=True)
    p.add_argument("--users", type=int, default=10_000)
    p.add_argument("--dim", type=int, default=1000, help="vector length per user")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dropout", type=float, default=0.0, help="fraction dropping per round")
    p.add_argument("--mode", default="simulation", choices=["secure", "simulation", "dealer"])
    p.add_argument("--cohorts", type=int, help="user-cohort actors (default: the cluster's CPUs)")
    p.add_argument("--fail", action="append", metavar="SPEC", help="fault injection (repeatable)")
    p.add_argument(
        "--threat-model",
        default="semi-honest",
        choices=["semi-honest", "malicious"],
        help="malicious: SecAgg's consistency round with keys authenticated through the "
        "simulated PKI and t > (k + corrupt)/2 (secure or simulation mode; its cost: "
        "benchmarks/secagg_threat.py)",
    )
    args = p.parse_args(argv)
    if args.small:
        args.users, args.rounds, args.dim = SMALL_USERS, 2, 100
    return jobs.run("secure_sum", body, args)


if __name__ == "__main__":
    raise SystemExit(main())
