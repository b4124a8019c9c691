"""Why HFL's default test MSE is flat in ε, and what its Stage 2 and Stage 3 each contribute
(issue 30, deliver 3).

ML-100K, 5 parties, ``setting=hfl``, (T, T') = (100, 10), per user (θ = 10 unless a row says),
the tightest accountant, δ = 1/|ratings|, seeds 0 and 1, in-process (``backend=local``).

Every run stops after Stage 2 (``finetune_steps=0``); the Stage-3 variants are then evaluated
from that same federated V: a wrapper around the driver's fine-tuning step computes, on copies
of each party's U and V, the test and training MSE after F = 0, 5, 10, 20, 50 joint steps at
``local_lr`` 0.01 / 0.02 / 0.05 (the default: 50 at 0.05) — exactly what ``hfl_finetune_step``
with those options would leave, F steps of ``descend_jointly`` — and after 10 steps on U alone
with the federated V fixed (``u_only``: what the published V is worth to a party that only fits
its own users). F = 50 at 0.05 gives a full default run's test MSE bit for bit (seed 0, ε = 1:
0.98930787). Sections:

* ``stage2``: ``method=local`` (each party alone, Stage 1 then Stage 3), then ε 1, 8, 100, 10⁴
  and noise=none x the DP-SGD rate (the default constant vfl_lr 0.05, and 0.2, 0.5, 2, 5
  decaying to a tenth), default q = 0.01 and θ = 10.
* ``batch``: the sampling rate q and the trim θ (q = 0.1 with θ 10 and 30)
  at ε 1, 8, 100 and the rates 0.5, 2, 5.

* ``random``: each party alone, fine-tuned (50 joint steps at 0.05) from a V of pure noise
  (N(0, 1) entries projected onto 𝒱, the same at every party, independent of the data), and
  from the average of 5 such draws.

    python benchmarks/federated_mf_hfl_flat.py [--sections stage2,batch,random] [--seeds 0,1]
        [--out benchmarks/results/federated_mf_hfl_flat.json]

What it shows (docs/protocols/federated-mf.md, "Why HFL's default cannot improve with ε"):
Stage 2's V is at the mean predictor's MSE up to ε ≈ 100 whatever the rate, q or θ, and the
published number is the joint fine-tuning's, which does better from the DP V than from the
non-private one (or the initial V, or a V of pure noise), so the default gets worse as ε grows
(0.987 at ε = 1, 1.028 without noise).

The MSEs are the evaluation outside the protocol. Rates are compared on test MSE here only to
explain the defaults; a run's default never reads its data.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

import rayfed
from rayfed import mf
from rayfed.mf.training import descend_jointly, descend_users
from rayfed.protocols.federated_mf.partitioned import driver
from rayfed.protocols.federated_mf.partitioned.steps import _full_u
from rayfed.protocols.federated_mf.steps import user_ratings

ML100K = Path("/work/shared/data/movielens-100k/ratings.csv")
#: ε of the runs; None: noise=none, the non-private federated reference
EPSILONS = (1.0, 8.0, 100.0, 1e4, None)
#: (vfl_lr, vfl_lr_end): the default constant rate, then rates decaying to a tenth
RATES = ((0.05, None), (0.2, 0.02), (0.5, 0.05), (2.0, 0.2), (5.0, 0.5))
#: Stage 3: joint steps F (checkpoints) at each local_lr; U-only steps with V fixed
FINETUNE = (0, 5, 10, 20, 50)
LOCAL_LRS = (0.01, 0.02, 0.05)
U_ONLY = (10, 0.05)
#: (q, θ) of the batch section, its ε and rates
BATCHES = ((0.1, 10), (0.1, 30))
BATCH_EPSILONS = (1.0, 8.0, 100.0)
BATCH_RATES = RATES[2:]

#: squared errors and counts of every Stage-3 variant, summed over a run's parties
_SINK: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(4))


def _errors(ctx, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    out = []
    for split in ("test", "train"):
        users, items, ratings = user_ratings(ctx, split)
        pred = np.einsum("ij,ij->i", u[users], v[items])
        out += [float(np.sum((pred - ratings) ** 2)), ratings.size]
    return np.array(out)


def _variants(ctx, v, *, steps, lr, bound):
    """The driver's Stage 3, preceded by the variants' evaluation on copies (the real step then
    runs as configured: with finetune_steps=0 it leaves U and V as Stage 2 did)."""
    users, items, ratings = user_ratings(ctx, "train")
    u0, v0 = _full_u(ctx), np.array(v)
    batch = mf.Ratings(users, items, ratings, u0.shape[0], v0.shape[0], 0, bound)
    for local_lr in LOCAL_LRS:
        u, w = u0, v0
        for done in range(max(FINETUNE) + 1):
            if done in FINETUNE:
                _SINK[f"joint F={done} local_lr={local_lr:g}"] += _errors(ctx, u, w)
            u, w = descend_jointly(u, w, batch, steps=1, lr=local_lr, bound=bound)
    if _RANDOM_V:  # the same data-independent V at every party: N(0, 1) entries, projected,
        # and the server's average of 5 such draws (the shape of an averaged noise-bound V)
        gen = np.random.default_rng(ctx.seed)
        draws = np.array([mf.project(gen.normal(size=v0.shape), bound) for _ in range(5)])
        for name, w in (("random_v", draws[0]), ("random_avg5_v", draws.mean(axis=0))):
            u, w = descend_jointly(u0, w, batch, steps=50, lr=0.05, bound=bound)
            _SINK[f"{name} F=50 local_lr=0.05"] += _errors(ctx, u, w)
    f, local_lr = U_ONLY
    rows = np.asarray(users)
    u = descend_users(u0, v0, rows, items, ratings, steps=f, lr=local_lr, bound=bound)
    _SINK[f"u_only F={f} local_lr={local_lr:g}"] += _errors(ctx, u, v0)
    return _FINETUNE(ctx, v, steps=steps, lr=lr, bound=bound)


#: the ``random`` section: also fine-tune from a data-independent V scattered over 𝒱
_RANDOM_V = False
_FINETUNE = driver.hfl_finetune_step
driver.hfl_finetune_step = _variants


def options(seed: int, epsilon: float | str | None, **kw) -> dict:
    out = dict(
        setting="hfl",
        parties=5,
        iterations=100,
        data={"path": str(ML100K)},
        seed=seed,
        backend="local",
        out_dir=None,
        finetune_steps=0,
    )
    if epsilon == "local":  # each party alone: Stage 1 and Stage 3, nothing federated
        out["method"] = "local"
    else:
        out.update({"noise": "none"} if epsilon is None else {"epsilon": epsilon})
    out.update(kw)
    return out


def run(seed: int, epsilon: float | str | None, **kw) -> dict:
    start = time.perf_counter()
    _SINK.clear()
    result = rayfed.run("federated-mf", **options(seed, epsilon, **kw))
    stage3 = {k: {"test_mse": e[0] / e[1], "train_mse": e[2] / e[3]} for k, e in _SINK.items()}
    assert np.isclose(stage3["joint F=0 local_lr=0.05"]["test_mse"], result.metrics["test_mse"])
    return {
        "seed": seed,
        "noise_multiplier": result.metrics.get("noise_multiplier"),
        "stage3": stage3,
        "seconds": round(time.perf_counter() - start, 1),
    }


def row(seeds: list[int], epsilon: float | str | None, **kw) -> dict:
    runs = [run(s, epsilon, **kw) for s in seeds]
    means = {
        k: statistics.fmean(r["stage3"][k]["test_mse"] for r in runs) for k in runs[0]["stage3"]
    }
    out = {"epsilon": epsilon if epsilon is not None else "none", **kw, "test_mse_mean": means}
    out["runs"] = runs
    shown = " ".join(f"{k}={v}" for k, v in kw.items())
    print(
        f"ε={out['epsilon']} {shown}: stage2 {means['joint F=0 local_lr=0.05']:.4f} "
        f"F10@.02 {means['joint F=10 local_lr=0.02']:.4f} "
        f"F50@.05 {means['joint F=50 local_lr=0.05']:.4f} u_only {means['u_only F=10 local_lr=0.05']:.4f}",
        file=sys.stderr,
        flush=True,
    )
    return out


def stage2(seeds: list[int]) -> list[dict]:
    return [row(seeds, "local")] + [
        row(seeds, epsilon, vfl_lr=lr, vfl_lr_end=lr_end)
        for epsilon, (lr, lr_end) in itertools.product(EPSILONS, RATES)
    ]


def batch(seeds: list[int]) -> list[dict]:
    return [
        row(seeds, epsilon, sampling_rate=q, trim=theta, vfl_lr=lr, vfl_lr_end=lr_end)
        for (q, theta), epsilon, (lr, lr_end) in itertools.product(
            BATCHES, BATCH_EPSILONS, BATCH_RATES
        )
    ]


def random_v(seeds: list[int]) -> list[dict]:
    """Each party alone (Stage 1), then the default fine-tuning from the initial V and from a V of
    pure noise: what a DP Stage 2 that learned nothing would hand over."""
    global _RANDOM_V
    _RANDOM_V = True
    try:
        return [row(seeds, "local")]
    finally:
        _RANDOM_V = False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sections", default="stage2,batch,random")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--out", default="benchmarks/results/federated_mf_hfl_flat.json")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    out = Path(args.out)
    record = json.loads(out.read_text()) if out.exists() else {}
    record.update(
        data="ML-100K (943 users, 1,682 items, 100,000 ratings), 5 parties, setting=hfl",
        settings="per user, (T, T') = (100, 10), δ = 1/|ratings|, accountant tightest, "
        "q = 0.01 and θ = 10 unless a row names them; every run stops after Stage 2 and the "
        "Stage-3 variants are evaluated from its V",
        seeds=seeds,
    )
    sections = {"stage2": stage2, "batch": batch, "random": random_v}
    for name in args.sections.split(","):
        started = time.perf_counter()
        record[name] = {"rows": sections[name](seeds)}
        record[name]["wall_s"] = round(time.perf_counter() - started, 1)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=2) + "\n")
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
