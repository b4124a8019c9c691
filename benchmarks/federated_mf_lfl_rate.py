"""LFL's server step from a public rule (issue 30): the fit of κ_L and γ_max, and a held-out check.

    python benchmarks/federated_mf_lfl_rate.py [--out benchmarks/results/federated_mf_lfl_rate.json]
    python benchmarks/federated_mf_lfl_rate.py --only ml100k   # only the ML-100K users-split check

The rule (:func:`rayfed.protocols.federated_mf.lfl.plan.server_lr`, ``lr`` not given) is
γ = min(γ_max, κ_L·t·√(R/p)/(σ_S·√T)): the noise's random walk on one coordinate of V over the T
iterations held at κ_L·√(R/p). σ_S, t, R, p, T are public, so the rule's scale
t·√(R/p)/(σ_S·√T) is computed here by the plan's own functions, and each private run steps at
γ = κ·scale for κ on a grid (uncapped). The noise-free best γ_max comes from ε = 10^4 (the largest
ε the config allows, z ≈ 0.02) on a γ grid.

Fit: synthetic populations (the project's generator; public, never the user's data), 100 items,
p = 10, T = 5, ε in {0.5, 1, 4, 8}, 2 seeds, in-process (``backend=local``, dealer-mode secure
aggregation: the same sums and noise as ``simulation``, faster). κ_L is the largest grid point
whose learning curve falls at every iteration in at least 2/3 of the fit's cells (the default
must show learning); the κ of smallest mean regret (final test MSE over the best κ of its cell)
is reported beside it, with both regrets. γ_max is the noise-free grid's least-regret γ. Held out: a population size and density the fit never saw, the rule's γ
against the best of κ_L/2, κ_L, 2κ_L there (γ_max/2, γ_max, 2γ_max without noise). Last, the
main job at its defaults, seeds 0-4: its learning curves. And a real split the fit never saw:
ML-100K's odd user ids only (472 users, written to a temporary directory), T = 5, ε in {1, 4},
seed 0, the rule's γ against half and twice it (``--only ml100k`` runs this part alone and
replaces only its entry of the JSON).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import rayfed
from rayfed.protocols.federated_mf.config import FederatedMFConfig
from rayfed.protocols.federated_mf.lfl import plan as lfl_plan

FIT_POPULATIONS = [(1500, 0.05), (3000, 0.1)]
HELD_OUT = [(2000, 0.2)]
EPSILONS = [0.5, 1.0, 4.0, 8.0]
NOISE_FREE = 1e4
KAPPAS = [0.125, 0.25, 0.5, 1.0, 2.0]
GAMMAS = [4.0, 8.0, 16.0, 32.0, 64.0]
SEEDS = [0, 1]
#: κ_L: the largest κ of the grid whose learning curves fall at every iteration in at least this
#: share of the fit's private cells (a default that shows learning; the least-regret κ is
#: reported beside it)
MONOTONE_SHARE = 2 / 3
#: the held-out grid: the fitted constant halved, as fitted, doubled
NEAR = [0.5, 1.0, 2.0]
BASE = dict(items=100, iterations=5, backend="local", secagg_mode="dealer", out_dir=None)
ML100K = Path(__file__).resolve().parents[2] / "shared" / "data" / "movielens-100k" / "ratings.csv"
ML100K_EPSILONS = [1.0, 4.0]


def scale(users: int, density: float, epsilon: float, seed: int) -> float:
    """The rule's γ per unit κ, uncapped: t·√(R/p)/(σ_S·√T), from the plan's public numbers."""
    cfg = FederatedMFConfig(
        users=users, density=density, epsilon=epsilon, items=BASE["items"], iterations=5
    )
    params = lfl_plan.plan(cfg, seed).params
    sigma = lfl_plan.summed_noise_std(
        cfg.mode, "lfl", params.n, cfg.omega, params.z, params.sensitivity, params.secagg.corrupt
    )
    return lfl_plan.server_lr(
        sigma, params.threshold, cfg.bound, cfg.rank, cfg.iterations, kappa=1.0, cap=math.inf
    )


#: --cache: finished runs by their options (a rerun after an interruption skips them)
CACHE: dict[str, dict] = {}


def run(users: int, density: float, epsilon: float, seed: int, lr: float | None) -> dict:
    key = json.dumps([users, density, epsilon, seed, lr])
    if key not in CACHE:
        CACHE[key] = _run(users, density, epsilon, seed, lr)
        if CACHE_PATH is not None:
            with open(CACHE_PATH, "a") as f:
                f.write(json.dumps({"key": key, "row": CACHE[key]}) + "\n")
        print(json.dumps({k: v for k, v in CACHE[key].items() if k != "curve"}), file=sys.stderr)
    return dict(CACHE[key])


CACHE_PATH: Path | None = None


def _run(users: int, density: float, epsilon: float, seed: int, lr: float | None) -> dict:
    started = time.perf_counter()
    m = rayfed.run(
        "federated-mf", users=users, density=density, epsilon=epsilon, seed=seed, lr=lr, **BASE
    ).metrics
    curve = m["learning_curve"]
    return {
        "users": users,
        "density": density,
        "epsilon": epsilon,
        "seed": seed,
        "lr": m["server_lr"],
        "test_mse": m["test_mse"],
        "curve": curve,
        "monotone": bool(all(b <= a for a, b in zip(curve, curve[1:], strict=False))),
        "stage1": m["stage1_test_mse"],
        "central": m["central_test_mse"],
        "seconds": time.perf_counter() - started,
    }


def regret_table(rows: list[dict], key: str, grid: list[float]) -> dict[float, float]:
    """Mean over the cells (population, ε, seed) of final test MSE / the cell's best."""
    cells: dict[tuple, dict[float, float]] = {}
    for r in rows:
        cells.setdefault((r["users"], r["density"], r["epsilon"], r["seed"]), {})[r[key]] = r[
            "test_mse"
        ]
    return {g: float(np.mean([c[g] / min(c.values()) for c in cells.values()])) for g in grid}


def _main_job(seed: int) -> dict:
    """The main job at its defaults (``rayfed run federated-mf``: 2,500 users, density 0.1, T = 5,
    ε = 1, γ from the rule) in dealer mode, whose sums and noise are simulation mode's."""
    m = rayfed.run("federated-mf", seed=seed, backend="local", secagg_mode="dealer", out_dir=None)
    curve = m.metrics["learning_curve"]
    return {
        "seed": seed,
        "server_lr": m.metrics["server_lr"],
        "curve": curve,
        "falls": bool(all(b <= a for a, b in zip(curve, curve[1:], strict=False))),
        "stage1": m.metrics["stage1_test_mse"],
        "central": m.metrics["central_test_mse"],
    }


def _odd_users(src: Path, dst: Path) -> Path:
    """ML-100K's ratings of the odd user ids only: a split by users that no fit has seen."""
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    table = pacsv.read_csv(src)
    pacsv.write_csv(table.filter(pc.equal(pc.bit_wise_and(table["user_id"], 1), 1)), dst)
    return dst


def ml100k_check(src: Path = ML100K, seed: int = 0) -> dict:
    """The rule on ML-100K's odd users (T = 5, the fit's T; dealer mode): for each ε the rule's
    γ (``lr`` not given) and half and twice it, with each run's final test MSE and whether its
    curve falls at every iteration."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = str(_odd_users(src, Path(tmp) / "ml100k_odd_users.csv"))
        for eps in ML100K_EPSILONS:
            opts = dict(data={"path": path}, epsilon=eps, seed=seed, **BASE)
            opts.pop("items")
            rule = None
            for factor in (1.0, 0.5, 2.0):
                started = time.perf_counter()
                lr = None if factor == 1.0 else factor * rule
                m = rayfed.run("federated-mf", lr=lr, **opts).metrics
                if factor == 1.0:
                    rule = m["server_lr"]
                curve = m["learning_curve"]
                row = {
                    "epsilon": eps,
                    "seed": seed,
                    "users": m["users"],
                    "factor": factor,
                    "lr": m["server_lr"],
                    "test_mse": m["test_mse"],
                    "curve": curve,
                    "falls": bool(all(b <= a for a, b in zip(curve, curve[1:], strict=False))),
                    "stage1": m["stage1_test_mse"],
                    "central": m["central_test_mse"],
                    "seconds": time.perf_counter() - started,
                }
                print(json.dumps({k: v for k, v in row.items() if k != "curve"}), file=sys.stderr)
                rows.append(row)
    return {
        "data": "ML-100K ratings of the odd user ids (a users split no fit saw)",
        "iterations": BASE["iterations"],
        "secagg_mode": BASE["secagg_mode"],
        "factors_of_rule": [0.5, 1.0, 2.0],
        "runs": rows,
    }


def _held_out_row(rule: dict, grid: list[dict]) -> dict:
    """The rule's run at a held-out cell against the best run of the grid there."""
    best = min(grid, key=lambda r: r["test_mse"])
    return {
        **{k: rule[k] for k in ("users", "density", "epsilon", "seed", "stage1", "central")},
        "rule_lr": rule["lr"],
        "rule_test_mse": rule["test_mse"],
        "rule_curve": rule["curve"],
        "rule_monotone": rule["monotone"],
        "best_grid_lr": best["lr"],
        "best_grid_test_mse": best["test_mse"],
        "regret": rule["test_mse"] / best["test_mse"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/results/federated_mf_lfl_rate.json")
    p.add_argument("--cache", help="a JSON-lines file of finished runs, read and appended to")
    p.add_argument(
        "--only",
        choices=["ml100k"],
        help="run only this part and replace only its entry of an existing --out",
    )
    args = p.parse_args(argv)
    if args.only == "ml100k":
        out = Path(args.out)
        record = json.loads(out.read_text()) if out.exists() else {}
        record["ml100k_odd_users"] = ml100k_check()
        out.write_text(json.dumps(record, indent=2) + "\n")
        print(args.out)
        return 0
    global CACHE_PATH
    if args.cache:
        CACHE_PATH = Path(args.cache)
        if CACHE_PATH.exists():
            for line in CACHE_PATH.read_text().splitlines():
                entry = json.loads(line)
                CACHE[entry["key"]] = entry["row"]
    private, free = [], []
    for users, density in FIT_POPULATIONS:
        for seed in SEEDS:
            for eps in EPSILONS:
                unit = scale(users, density, eps, seed)
                for kappa in KAPPAS:
                    private.append({**run(users, density, eps, seed, kappa * unit), "kappa": kappa})
            free += [run(users, density, NOISE_FREE, seed, gamma) for gamma in GAMMAS]
    kappa_regret = regret_table(private, "kappa", KAPPAS)
    gamma_regret = regret_table(free, "lr", GAMMAS)
    gamma_max = min(gamma_regret, key=gamma_regret.get)
    monotone = {
        k: float(np.mean([r["monotone"] for r in private if r["kappa"] == k])) for k in KAPPAS
    }
    least_regret = min(kappa_regret, key=kappa_regret.get)
    kappa = max(k for k in KAPPAS if monotone[k] >= MONOTONE_SHARE)
    held = []
    for users, density in HELD_OUT:
        for seed in SEEDS:
            for eps in EPSILONS:
                unit = scale(users, density, eps, seed)
                grid = [run(users, density, eps, seed, k * kappa * unit) for k in NEAR]
                # the rule itself (lr not given), the code's κ_L and γ_max
                held.append(_held_out_row(run(users, density, eps, seed, None), grid))
            grid = [run(users, density, NOISE_FREE, seed, g * gamma_max) for g in NEAR]
            held.append(_held_out_row(run(users, density, NOISE_FREE, seed, None), grid))
    main_job = [_main_job(seed) for seed in range(5)]
    record = {
        "rule": "γ = min(γ_max, κ_L·t·√(R/p)/(σ_S·√T))",
        "fitted": {"kappa": kappa, "gamma_max": gamma_max},
        "kappa_least_regret": least_regret,
        "monotone_share_required": MONOTONE_SHARE,
        "in_code": {"kappa": lfl_plan.SERVER_LR_KAPPA, "gamma_max": lfl_plan.SERVER_LR_MAX},
        "kappa_mean_regret": {str(k): v for k, v in kappa_regret.items()},
        "kappa_monotone_share": {str(k): v for k, v in monotone.items()},
        "gamma_max_mean_regret": {str(g): v for g, v in gamma_regret.items()},
        "held_out": held,
        "main_job": main_job,
        "ml100k_odd_users": ml100k_check(),
        "held_out_mean_regret": float(np.mean([h["regret"] for h in held])),
        "setup": {
            "fit_populations": FIT_POPULATIONS,
            "held_out": HELD_OUT,
            "epsilons": EPSILONS,
            "kappas": KAPPAS,
            "gammas_noise_free": GAMMAS,
            "seeds": SEEDS,
            **{k: v for k, v in BASE.items() if k != "out_dir"},
        },
        "private_runs": private,
        "noise_free_runs": free,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
