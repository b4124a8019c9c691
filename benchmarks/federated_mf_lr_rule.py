"""The public learning-rate rule of VFL/HFL DP-SGD (rayfed/mf/rates.py): its fit, and its check on
data the fit never saw (issue 30).

    python benchmarks/federated_mf_lr_rule.py [--out benchmarks/results/federated_mf_lr_rule.json]

**Fit.** ML-100K (public data), VFL, 5 parties, (T, T') = (100, 10), η = 0.01, per-rating DP,
seed 0: a geometric grid of starting rates (each decaying to a tenth) around the rule's own, ratio
1.6 from a quarter to 4 times it, at every ε in FIT_EPSILONS and without noise. Each ε's best rate is the minimum of a parabola in log γ through the grid's best point and
its neighbours (test MSE: ML-100K is public). κ = the geometric mean over ε of best rate ·
σ√S / √(R/p) (σ the average's noise per unit rate, :func:`rayfed.mf.rates.average_noise`);
c = the best rate without noise · R / min(n, m).

**Check.** Data the fit never saw: synthetic ratings of other sizes and densities from the
project's generator, and the ML-100K users the fit's user split left out (the fit above uses every
user; the split fit refits κ on the even user ids and checks on the odd ones; c stays the one fitted
on all users). Beside them, other settings on the fitted data: ML-100K with 2 parties, per user,
and HFL (the per-user row without noise is the fit's own no-noise run: no unit without noise). For each, at ε = 1 and 8: the test MSE at the rule's rate and at 1/4,
1/2, 2 and 4 times it, so the regret of the rule against the best of that grid, and the old
constant default 0.05. A quality record, not a speed one.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import rayfed
from rayfed.mf import rates

ML100K = Path(__file__).resolve().parents[2] / "shared" / "data" / "movielens-100k" / "ratings.csv"
FIT_EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0, 1000.0)
#: the fit's grid: multiples of the rule's own rate (a geometric grid, ratio 1.6, around it)
FIT_MULTIPLIERS = (1 / 4, 1 / 2.56, 1 / 1.6, 1.0, 1.6, 2.56, 4.0)
MULTIPLIERS = (0.25, 0.5, 1.0, 2.0, 4.0)
CHECK_EPSILONS = (1.0, 8.0, None)
OLD_DEFAULT = 0.05
BOUND = 5.0
BASE = dict(iterations=100, local_steps=10, sampling_rate=0.01, seed=0)


#: runs already made (``--cache``: a JSONL file a rerun after a crash resumes from)
CACHE: dict[str, dict] = {}
CACHE_PATH: list[Path] = []


def run(options: dict, epsilon: float | None, lr: float | None) -> dict:
    """One run: the rule's rate (``lr`` None) or ``lr`` decaying to a tenth."""
    constants = [
        rates.NOISE_WALK,
        rates.SIGNAL_CAP,
        rates.DECAY,
    ]  # a rule run's rate depends on them
    key = json.dumps([options, epsilon, lr, constants], sort_keys=True)
    if key not in CACHE:
        CACHE[key] = _run(options, epsilon, lr)
        for path in CACHE_PATH:
            with path.open("a") as f:
                f.write(json.dumps({"key": key, "result": CACHE[key]}) + "\n")
    return CACHE[key]


def _run(options: dict, epsilon: float | None, lr: float | None) -> dict:
    o = {**BASE, **options}
    if epsilon is None:  # no noise: no privacy unit (the same rounds, sampling as per rating)
        o.pop("privacy_unit", None)
    if lr is not None:
        o.update(vfl_lr=lr, vfl_lr_end=lr * rates.DECAY)
    if epsilon is None:
        o["noise"] = "none"
    else:
        o["epsilon"] = epsilon
    m = rayfed.run("federated-mf", backend="local", out_dir=None, **o).metrics
    return {
        "vfl_lr": m["learning_rate"]["start"],
        "source": m["learning_rate"]["source"],
        "test_mse": m["test_mse"],
        "train_mse": m["train_mse"],
        "z": m["noise_multiplier"],
        "signal_bound": rates.SIGNAL_CAP * min(m["users"], m["items"]) / BOUND,
    }


def best_rate(points: list[dict]) -> float:
    """The minimum of a parabola in log γ through the grid's best point and its neighbours (the
    grid's best at an end of the grid)."""
    points = sorted(points, key=lambda p: p["vfl_lr"])
    i = min(range(len(points)), key=lambda k: points[k]["test_mse"])
    if i in (0, len(points) - 1):
        print(f"  (the best rate {points[i]['vfl_lr']:.3g} is at the grid's edge)", file=sys.stderr)
        return points[i]["vfl_lr"]
    x = np.log([points[k]["vfl_lr"] for k in (i - 1, i, i + 1)])
    y = [points[k]["test_mse"] for k in (i - 1, i, i + 1)]
    a, b, _ = np.polyfit(x, y, 2)
    return float(np.exp(np.clip(-b / (2 * a), x[0], x[2])))


def fit(options: dict, label: str, epsilons=FIT_EPSILONS) -> dict:
    """κ and c on ``options``' data: the grid at every ε and without noise. An ε's κ is its best
    rate over the rule's rate at κ = 1 (the rule's rate / NOISE_WALK, where the signal bound does
    not cap it)."""
    grid, kappas = [], {}
    for epsilon in (*epsilons, None):
        rule = run(options, epsilon, None)
        points = [
            {**(rule if k == 1 else run(options, epsilon, rule["vfl_lr"] * k)), "epsilon": epsilon}
            for k in FIT_MULTIPLIERS
        ]
        grid.extend(points)
        best = best_rate(points)
        print(f"{label} fit ε={epsilon}: best rate {best:.3g}", file=sys.stderr)
        if epsilon is None:
            c = best * rates.SIGNAL_CAP / rule["signal_bound"]
            continue
        if rule["vfl_lr"] < rule["signal_bound"]:
            kappas[f"{epsilon:g}"] = best * rates.NOISE_WALK / rule["vfl_lr"]
    return {
        "label": label,
        "kappa": float(np.exp(np.mean(np.log(list(kappas.values()))))),
        "kappa_per_epsilon": kappas,
        "c": c,
        "grid": grid,
    }


def check(options: dict, label: str, kappa: float = rates.NOISE_WALK) -> list[dict]:
    """The rule (at ``kappa``) against the grid of its multiples and the old default, at every
    check ε."""
    rows = []
    for epsilon in CHECK_EPSILONS:
        rule = run(options, epsilon, None)
        if kappa != rates.NOISE_WALK and rule["vfl_lr"] < rule["signal_bound"]:
            rate = min(rule["vfl_lr"] * kappa / rates.NOISE_WALK, rule["signal_bound"])
            rule = run(options, epsilon, rate)
        grid = [
            {"multiplier": k, **(rule if k == 1 else run(options, epsilon, rule["vfl_lr"] * k))}
            for k in MULTIPLIERS
        ]
        best = min(grid, key=lambda p: p["test_mse"])
        old = run({**options, "vfl_lr": OLD_DEFAULT}, epsilon, None)["test_mse"]
        rows.append(
            {
                "data": label,
                "epsilon": epsilon,
                "rule_rate": rule["vfl_lr"],
                "rule_test_mse": rule["test_mse"],
                "best_multiplier": best["multiplier"],
                "best_test_mse": best["test_mse"],
                "regret": rule["test_mse"] - best["test_mse"],
                "old_default_test_mse": old,
                "grid": grid,
            }
        )
        print(
            f"{label:<52} ε={epsilon}: rule {rule['vfl_lr']:.3g} → {rule['test_mse']:.4f}, "
            f"best ×{best['multiplier']:g} → {best['test_mse']:.4f}, old 0.05 → {old:.4f}",
            file=sys.stderr,
        )
    return rows


def user_split(tmp: Path) -> tuple[Path, Path]:
    """ML-100K's ratings of even and of odd user ids, as two files in ``tmp`` (never the repo)."""
    with ML100K.open() as f:
        reader = csv.reader(f)
        header = next(reader)
        rows = list(reader)
    paths = []
    for parity in (0, 1):
        path = tmp / f"ml100k_users_{'even' if parity == 0 else 'odd'}.csv"
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(r for r in rows if int(r[0]) % 2 == parity)
        paths.append(path)
    return paths[0], paths[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/results/federated_mf_lr_rule.json")
    p.add_argument("--cache", help="a JSONL file of runs to resume from and append to")
    args = p.parse_args(argv)
    if args.cache:
        CACHE_PATH.append(Path(args.cache))
        if CACHE_PATH[0].exists():
            for line in CACHE_PATH[0].read_text().splitlines():
                entry = json.loads(line)
                CACHE[entry["key"]] = entry["result"]
    start = time.perf_counter()
    ml = {"setting": "vfl", "parties": 5, "data": {"path": str(ML100K)}}
    fitted = fit(ml, "ml100k")
    print(
        f"κ = {fitted['kappa']:.3g} (rule: {rates.NOISE_WALK}), c = {fitted['c']:.3g} "
        f"(rule: {rates.SIGNAL_CAP})",
        file=sys.stderr,
    )
    synthetic = [
        {"users": 500, "items": 100, "density": 0.2},
        {"users": 5000, "items": 400, "density": 0.02},
        {"users": 2000, "items": 200, "density": 0.1},
        {"users": 1500, "items": 100, "density": 0.05},
    ]
    rows = []
    for shape in synthetic:
        label = f"synthetic {shape['users']}x{shape['items']} density {shape['density']:g}"
        rows += check({"setting": "vfl", "parties": 5, **shape}, f"VFL 5 parties, {label}")
    rows += check({**ml, "parties": 2}, "VFL 2 parties, ML-100K")
    rows += check({**ml, "privacy_unit": "user"}, "VFL 5 parties, ML-100K per user (θ = 5)")
    rows += check({"setting": "hfl", "parties": 5, "data": ml["data"]}, "HFL 5 parties, ML-100K")
    with tempfile.TemporaryDirectory() as tmp:
        even, odd = user_split(Path(tmp))
        split = fit({**ml, "data": {"path": str(even)}}, "ml100k even users", (1.0, 8.0))
        odd_users = {**ml, "data": {"path": str(odd)}}
        rows += check(odd_users, "VFL 5 parties, ML-100K odd users (κ of the even)", split["kappa"])
    record = {
        "fit": fitted,
        "rule": {"kappa": rates.NOISE_WALK, "c": rates.SIGNAL_CAP, "decay": rates.DECAY},
        "split_fit": {k: v for k, v in split.items() if k != "grid"},
        "check": rows,
        "seconds": time.perf_counter() - start,
        "note": "test MSE on public data (ML-100K) or synthetic ratings: the rule is fitted on "
        "public data only; no run's default reads its private ratings",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
