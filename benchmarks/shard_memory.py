"""The sharded server at n = 10^4 (mode=secure, real crypto): the coordinator's busy seconds and
every actor's peak resident memory with S = 1 (the coordinator alone) and S = 2 server shards.

    python benchmarks/shard_memory.py [--users 10000] [--dim 100] [--shards 1 2]

Prints one JSON object per S (and writes them to --out if given). Busy seconds are the phases a
role ran (rayfed's phase timings by role); peaks are each actor process's VmHWM, reset when the
actor became this run's member.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from rayfed.data import per_user
from rayfed.federation import Federation
from rayfed.privacy import PrivacyDeclaration
from rayfed.protocols.secure_sum.steps import synthetic_inputs
from rayfed.runtime import ensure_ray
from rayfed.secagg import FixedPoint, find_params, make_spec, secure_sum
from rayfed.secagg.phases import schedule as secagg_schedule


def _rss_step(ctx):
    """(current, peak) resident memory of this actor's process, in bytes."""
    fields = dict(
        line.split(":", 1)
        for line in Path("/proc/self/status").read_text().splitlines()
        if ":" in line
    )
    return tuple(int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM"))


def run(users: int, dim: int, shards: int, cohorts: int, seed: int = 0) -> dict:
    ids = np.arange(users, dtype=np.int64)
    params = find_params(users, dropout=0.3, corrupt=0.05, graph="auto")
    rng = np.random.default_rng(seed)
    lost = rng.choice(ids, users // 10, replace=False)  # 5 % after sharing, 5 % at unmask
    schedule = secagg_schedule(
        explicit={
            "masked_input": lost[: users // 20].tolist(),
            "unmask": lost[users // 20 :].tolist(),
        }
    )
    spec = make_spec(
        round=0,
        mode="secure",
        registry=ids,
        params=params,
        encoding=FixedPoint.choose(users, 1.0, 16),
        dim=dim,
        dropout=schedule,
    )
    dealt = per_user(pa.table({"user_id": ids}), "user_id", cohorts)
    with Federation(
        run_id=f"shards-{shards}",
        seed=seed,
        cohorts={k: (t, {}) for k, t in dealt.items()},
        privacy=PrivacyDeclaration.none("benchmark"),
        randomness="secure",
        deadline_s=3600.0,
        server_shards=shards,
    ) as fed:
        started = time.perf_counter()
        result = secure_sum(
            fed.cohorts,
            spec,
            synthetic_inputs,
            (dim, 1.0),
            server=fed.coordinator,
            shards=fed.shards,
        )
        seconds = time.perf_counter() - started
        peaks = {}
        for group in (fed.coordinator, fed.cohorts, fed.shards):
            if len(group):
                got = fed.get(group.run(_rss_step, phase="memory"))
                peaks.update({name: got[name][1] for name in got})
        busy: dict[str, float] = {}
        for t in fed.timings:
            if t["phase"] not in ("(round)", "memory"):
                busy[t["role"]] = busy.get(t["role"], 0.0) + t["seconds"]
        phases = {
            f"{t['role']}:{t['phase']}": round(t["seconds"], 3)
            for t in fed.timings
            if t["role"] in ("coordinator", "shards")
        }
    return {
        "users": users,
        "dim": dim,
        "degree": params.degree,
        "threshold": params.threshold,
        "server_shards": shards,
        "cohorts": cohorts,
        "round_s": round(seconds, 2),
        "coordinator_busy_s": round(busy.get("coordinator", 0.0), 3),
        "shards_busy_s": round(busy.get("shards", 0.0), 3),
        "server_phases_s": phases,
        "peak_mib": {name: round(p / 2**20, 1) for name, p in sorted(peaks.items())},
        "survivors": int(result.survivors.size),
        "dropped_after_sharing": int(result.dropped_after_sharing.size),
        "words_digest": int(np.bitwise_xor.reduce(result.words.astype(np.uint64))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--dim", type=int, default=100)
    parser.add_argument("--cohorts", type=int, default=2)
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    ensure_ray(None, 2)
    records = [run(args.users, args.dim, s, args.cohorts) for s in args.shards]
    for record in records:
        print(json.dumps(record))
    if args.out:
        args.out.write_text(json.dumps(records, indent=1) + "\n")


if __name__ == "__main__":
    main()
