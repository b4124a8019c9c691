"""Secure-aggregation benchmark: time and peak memory per phase, against this machine's primitive
lower bound. Writes JSON.

    python benchmarks/secagg.py                       # the issue's target configurations
    python benchmarks/secagg.py --grid                # n x d x variant grid (feasible cells)
    python benchmarks/secagg.py --only secagg+ --users 1000 --dim 100

For every configuration it runs one round on the Ray path (embedded local Ray, one cohort per CPU)
with the parameter finder's degree and threshold (security parameters are never lowered to meet a
time), and reports:

* seconds and peak resident memory (sum over cohorts, coordinator and driver) after each phase;
* the lower bound the primitives imply: the X25519 agreements the users must perform (one per
  neighbour for share encryption, one per neighbour for the pairwise masks) times this machine's
  measured exchange cost, plus the keystream bytes the users expand (self and pairwise masks)
  divided by this machine's measured AES-CTR throughput. ``ratio_serial`` divides the wall time by
  that bound, ``ratio_parallel`` by the bound shared over the cohorts' CPUs;
* the number of driver-to-actor calls per phase (one per cohort, independent of users).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

import rayfed
from rayfed.actors.base import StepContext
from rayfed.data import per_user
from rayfed.federation import Federation
from rayfed.privacy import PrivacyDeclaration
from rayfed.protocols.secure_sum.steps import synthetic_inputs
from rayfed.secagg import FixedPoint, _crypto, find_params, make_spec, secure_sum
from rayfed.secagg.graph import NeighbourGraph
from rayfed.secagg.phases import drop_codes
from rayfed.secagg.phases import schedule as secagg_schedule
from rayfed.secagg.reference import exact_sum, expected_survivors

TARGETS = [
    # (name, users, dim, variant, dropout after masked input)
    ("secagg+ n=10k d=1k 30% dropout", 10_000, 1_000, "secagg+", 0.3),
    ("secagg n=1k d=1k 30% dropout", 1_000, 1_000, "secagg", 0.3),
    ("secagg+ n=1k d=1k 30% dropout", 1_000, 1_000, "secagg+", 0.3),
    ("dealer n=100k d=1k 30% dropout", 100_000, 1_000, "dealer", 0.3),
]


def measure_primitives(repeat: int = 20_000) -> dict:
    """This machine's X25519 exchange cost and AES-CTR keystream throughput (the lower bound's units)."""
    raw = np.frombuffer(os.urandom(64 * 64), np.uint8).reshape(64, 64)
    keys = [_crypto.keypair(r[:32].tobytes())[0] for r in raw]
    peers = _crypto.public_keys(
        np.stack([np.frombuffer(_crypto.keypair(r[32:].tobytes())[1], np.uint8) for r in raw])
    )
    started = time.perf_counter()
    for i in range(repeat):
        keys[i % 64].exchange(peers[(i * 7) % 64])
    exchange_s = (time.perf_counter() - started) / repeat
    seed = os.urandom(32)
    n_words = 64 << 20 >> 2
    _crypto.expand(seed, n_words)  # warm the buffers
    started = time.perf_counter()
    for _ in range(4):
        _crypto.expand(seed, n_words)
    prg_bytes_per_s = 4 * n_words * 4 / (time.perf_counter() - started)
    return {"x25519_exchange_s": exchange_s, "prg_bytes_per_s": prg_bytes_per_s}


def _rss_step(ctx):
    """(current, peak, pid): resident memory of this actor's process, in bytes, and its pid."""
    fields = dict(
        line.split(":", 1)
        for line in Path("/proc/self/status").read_text().splitlines()
        if ":" in line
    )
    kib = lambda key: int(fields[key].split()[0]) * 1024  # noqa: E731
    return kib("VmRSS"), kib("VmHWM"), os.getpid()


def run_one(
    name: str,
    users: int,
    dim: int,
    variant: str,
    dropout: float,
    seed: int = 0,
    *,
    cohorts: int | None = None,
    actor_options: dict[str, dict] | None = None,
) -> dict:
    """One round on Ray: ``cohorts`` user cohorts (default: one per CPU of this machine);
    ``actor_options`` per role as :class:`~rayfed.federation.Federation` takes them (placement)."""
    mode = "dealer" if variant == "dealer" else "secure"  # real crypto with OS randomness
    graph = "complete" if variant == "secagg" else "auto"
    params = find_params(users, dropout=max(0.3, dropout), corrupt=0.05, graph=graph)
    encoding = FixedPoint.choose(users, 1.0, 16)
    ids = np.arange(users, dtype=np.int64)
    n_cohorts = cohorts or os.cpu_count() or 1
    cohorts = {
        k: (t, {}) for k, t in per_user(pa.table({"user_id": ids}), "user_id", n_cohorts).items()
    }
    # exactly `dropout` of the users (a seeded random choice) drop after sending their masked input
    dropped = np.random.default_rng(seed).choice(ids, int(round(dropout * users)), replace=False)
    schedule = secagg_schedule(explicit={"unmask": dropped.tolist()})  # lost after masked input
    spec = make_spec(
        round=0,
        mode=mode,
        registry=ids,
        params=params,
        encoding=encoding,
        dim=dim,
        dropout=schedule,
    )
    memory: dict[str, dict] = {}
    pids: dict[str, int] = {}  # member -> its process (to read PeakMemory's per-process peaks)
    Path("/proc/self/clear_refs").write_text("5")  # reset the driver's peak (VmHWM) for this run
    with Federation(
        run_id=f"bench-{variant}",
        seed=seed,
        cohorts=cohorts,
        privacy=PrivacyDeclaration.none("benchmark"),
        randomness="seeded" if mode == "dealer" else "secure",
        deadline_s=3600.0,
        actor_options=actor_options,
    ) as fed:

        def sample(phase: str) -> None:
            cohort = fed.get(fed.cohorts.run(_rss_step, phase="memory"))
            coord = fed.coordinator.call(_rss_step, phase="memory")
            driver_peak = _rss_step(None)[1]
            pids.update({name: pid for name, (_, _, pid) in cohort.items()}, coordinator=coord[2])
            memory[phase] = {
                "peak_bytes_total": sum(p for _, p, _ in cohort.values()) + coord[1] + driver_peak,
                "peak_bytes_per_cohort": max(p for _, p, _ in cohort.values()),
                "peak_bytes_coordinator": coord[1],
                "peak_bytes_cohorts": {name: p for name, (_, p, _) in cohort.items()},
            }

        sample("start")
        started = time.perf_counter()
        result = secure_sum(
            fed.cohorts,
            spec,
            synthetic_inputs,
            (dim, 1.0),
            server=fed.coordinator,
            after_phase=sample,
        )
        wall = (
            time.perf_counter()
            - started
            - sum(t["seconds"] for t in fed.timings if t["phase"] == "memory")
        )
        phases = {t["phase"]: t["seconds"] for t in fed.timings if t["phase"] != "memory"}
        calls = {}
        for row in fed.transcript.rows:
            calls[row["phase"]] = calls.get(row["phase"], 0) + 1
        sample("end")
        placement = fed.placement()
    # the independent reference: survivors from the schedule and graph, exact integer sum
    survivors = expected_survivors(
        ids,
        drop_codes(schedule, seed, 0, ids),
        NeighbourGraph.build(users, params.degree, params.complete, result.graph_seed, 0),
        params.threshold,
    )
    x = synthetic_inputs(
        StepContext(name="reference", role="driver", seed=seed), 0, survivors, dim, 1.0
    )
    exact = bool(
        np.array_equal(survivors, result.survivors)
        and np.array_equal(encoding.signed(result.words), exact_sum(x, 1.0, 16))
    )
    k = params.degree
    kas = 0 if mode == "dealer" else 2 * users * k  # no dropouts before masked input in these runs
    keystream = (users * k + users) * dim * encoding.dtype.itemsize
    return {
        "name": name,
        "users": users,
        "dim": dim,
        "variant": variant,
        "mode": mode,
        "degree": k,
        "threshold": params.threshold,
        "min_survivors": params.min_survivors,
        "complete_graph": params.complete,
        "log2_security_failure": params.log2_security_failure,
        "log2_correctness_failure": params.log2_correctness_failure,
        "dropout_after_masked_input": dropout,
        "cohorts": n_cohorts,
        "exact": exact,
        "survivors": int(result.survivors.size),
        "wall_seconds": wall,
        "phase_seconds": phases,
        "memory": memory,
        "peak_bytes": max(m["peak_bytes_total"] for m in memory.values()),
        "messages_per_phase": calls,
        "user_key_agreements": kas,
        "user_keystream_bytes": keystream,
        "pids": pids,
        "placement": placement,
    }


#: the roles that run the users' side of a round; every other role's phases are server work
CLIENT_ROLES = ("cohorts", "parties")


def busy_split(timings: list[dict]) -> dict:
    """A run's phase seconds (``fed.timings`` / ``Result.timings``: round, phase, role, seconds)
    split into the users' side (cohorts, parties) and the server's (the coordinator, and any other
    role: server shards once they exist), each the driver's wait on that phase. The round's
    seconds are the federation's round totals (phases and the driver's work between them), else
    the phases' sum."""
    by_role: dict[str, dict[str, float]] = {}
    rounds = 0.0
    for t in timings:
        if t["phase"] == "(round)":
            rounds += float(t["seconds"])
            continue
        phases = by_role.setdefault(t["role"], {})
        phases[t["phase"]] = phases.get(t["phase"], 0.0) + float(t["seconds"])
    server = sum(sum(p.values()) for r, p in by_role.items() if r not in CLIENT_ROLES)
    client = sum(sum(p.values()) for r, p in by_role.items() if r in CLIENT_ROLES)
    round_s = rounds or server + client
    return {
        "server_seconds": server,
        "client_seconds": client,
        "round_seconds": round_s,
        "server_share": server / round_s if round_s else 0.0,
        "phase_seconds_by_role": by_role,
    }


def with_bounds(record: dict, prim: dict) -> dict:
    bound = (
        record["user_key_agreements"] * prim["x25519_exchange_s"]
        + record["user_keystream_bytes"] / prim["prg_bytes_per_s"]
    )
    record["lower_bound_serial_s"] = bound
    record["lower_bound_parallel_s"] = bound / record["cohorts"]
    record["ratio_serial"] = record["wall_seconds"] / bound if bound else None
    record["ratio_parallel"] = (
        record["wall_seconds"] / (bound / record["cohorts"]) if bound else None
    )
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/results/secagg.json")
    p.add_argument(
        "--grid", action="store_true", help="n in {100,1k,10k,100k} x d in {100,1k,10k} x variants"
    )
    p.add_argument("--only", choices=["secagg", "secagg+", "dealer"], help="one variant")
    p.add_argument("--users", type=int)
    p.add_argument("--dim", type=int)
    p.add_argument("--dropout", type=float, default=0.3)
    args = p.parse_args(argv)
    if args.users or args.dim or args.only:
        configs = [
            (
                f"{args.only or 'secagg+'} n={args.users or 1000} d={args.dim or 1000}",
                args.users or 1000,
                args.dim or 1000,
                args.only or "secagg+",
                args.dropout,
            )
        ]
    elif args.grid:
        configs = [
            (f"{v} n={n} d={d}", n, d, v, args.dropout)
            for n in (100, 1_000, 10_000, 100_000)
            for d in (100, 1_000, 10_000)
            for v in ("secagg", "secagg+", "dealer")
            if not (v == "secagg" and n > 1_000)
            and not (v == "secagg+" and n > 10_000)
            and n * d <= 10**8
        ]
    else:
        configs = TARGETS
    rayfed.ensure_ray()
    prim = measure_primitives()
    print(
        f"X25519 exchange {prim['x25519_exchange_s'] * 1e6:.1f} us, AES-CTR {prim['prg_bytes_per_s'] / 1e9:.2f} GB/s",
        file=sys.stderr,
    )
    records = []
    for config in configs:
        try:
            record = with_bounds(run_one(*config), prim)
        except rayfed.RayfedError as err:
            records.append({"name": config[0], "error": f"{type(err).__name__}: {err}"})
            print(f"{config[0]}: {type(err).__name__}: {err}", file=sys.stderr)
            continue
        records.append(record)
        print(
            f"{record['name']}: {record['wall_seconds']:.1f} s (k={record['degree']}, t={record['threshold']}, "
            f"exact={record['exact']}), peak {record['peak_bytes'] / 2**30:.2f} GiB, "
            f"ratio serial {record['ratio_serial'] or 0:.2f} / parallel {record['ratio_parallel'] or 0:.2f}",
            file=sys.stderr,
        )
    out = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), **prim},
        "versions": {"rayfed": rayfed.__version__},
        "results": records,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2, default=float) + "\n")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
