"""Memory of one rayfed actor process: the basis of rayfed.sizing.ACTOR_OVERHEAD_BYTES.

    python benchmarks/actor_memory.py [--parties 4] [--out benchmarks/results/actor_memory.json]

Starts a federation of PartyActors with tiny partitions on an embedded local Ray, has each run a
step that imports what protocol steps import (numpy, pyarrow, scikit-learn, OR-Tools, cryptography),
and reads every actor process's resident (RSS) and proportional (PSS: shared pages split among
sharers) set size from /proc. The sizing check budgets the larger, RSS, per actor.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa

import rayfed
from rayfed.actors.base import Message, StepContext
from rayfed.federation import Federation
from rayfed.privacy import PrivacyDeclaration
from rayfed.sizing import ACTOR_OVERHEAD_BYTES


def _kib(pid: int, field: str) -> int:
    text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith(field + ":"))
    return int(line.split()[1]) * 1024


def loaded_pid(ctx: StepContext) -> Message:
    """Import what protocol steps use, then report this process's id."""
    import rayfed.clustering.constrained  # noqa: F401 - OR-Tools, scikit-learn
    import rayfed.protocols.hfl_kmeans.steps  # noqa: F401 - cryptography, pads

    return Message("pid", os.getpid())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parties", type=int, default=4)
    p.add_argument("--out", default="benchmarks/results/actor_memory.json")
    args = p.parse_args(argv)
    rayfed.ensure_ray()
    table = pa.table({"x": np.zeros(10)})
    parties = {f"p{i}": (table, {}) for i in range(args.parties)}
    fed = Federation(
        run_id="actor-memory", seed=0, parties=parties, privacy=PrivacyDeclaration.none("benchmark")
    )
    with fed.start():
        pids = fed.get(fed.parties.run(loaded_pid, phase="load"))
        rss = [_kib(pid, "Rss") for pid in pids.values()]
        pss = [_kib(pid, "Pss") for pid in pids.values()]
    record = {
        "actors": args.parties,
        "rss_bytes": rss,
        "pss_bytes": pss,
        "max_rss_mib": max(rss) / 2**20,
        "max_pss_mib": max(pss) / 2**20,
        "budgeted_mib": ACTOR_OVERHEAD_BYTES / 2**20,
        "within_budget": max(rss) <= ACTOR_OVERHEAD_BYTES,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(
        f"actor RSS up to {record['max_rss_mib']:.0f} MiB, PSS up to {record['max_pss_mib']:.0f} "
        f"MiB (budgeted {record['budgeted_mib']:.0f} MiB)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
