"""Federated MF reproduction: test MSE vs ε for VFL, HFL and LFL, with their baselines (JSON + plot).

Needs rayfed installed where it runs (cluster.yaml installs it on every node):

    python jobs/federated_mf_repro.py                              # ML-100K from ../shared/data
    python jobs/federated_mf_repro.py --data ratings.csv --epsilons 0.5,1,2,4,8
    python jobs/federated_mf_repro.py --small                      # synthetic, 2 ε values (tests)
    ray job submit --working-dir . -- python jobs/federated_mf_repro.py --out /abs/path

The thesis's DP figures are images whose values did not survive (spec federated-mf.md §5.4), so the
expected outcomes are orderings, checked and printed: VFL-SGDMF below local-only at every ε,
HFL-SGDMF (after fine-tuning) below local non-private SGD, LFL-SGDMF below LDP-level noise. The
non-private central reference is drawn as a line. LFL uses secure aggregation in ``--secagg`` mode
(dealer by default for speed; ``simulation`` runs the real key agreement and secret sharing).

Spec check C3 (issue 18): the same federated VFL and HFL rounds without noise (``noise=none``)
are drawn as lines, and VFL per-rating (the protocol's default unit) as a curve over ε. Its gap to
the non-private line must shrink as ε grows. By default every C3 run takes the configuration's
learning rate — the public rule of the noise (``rayfed/mf/rates.py``): nothing is tuned, and the
record keeps each run's resolved rate. ``--tune`` picks ``vfl_lr`` per ε from ``--lrs`` (decaying to
a tenth over the first 80 % of the steps, §7.9) by **public tuning**: the candidates run on a
synthetic stand-in of the data's public shape (users, items, number of ratings; scale [1, R];
``rayfed.protocols.federated_mf.tuning``), and the private data is run once at the picked rate,
so the pick reads no private rating (issue 30; the thesis tuned on the private training loss,
uncharged, which this job no longer does).

The literature baselines (spec §2.10; ML-100K only, slow): ``--literature e3`` adds check E3 (VFL-SGDMF
against DP-SGLD and ObjPertb at s = 1, about 7 minutes), ``--literature e8`` check E8 (GD-DR against
the LFL baselines, about 22 minutes) and ``e8-null`` GD-DR's null control (data-blind reports,
about 4 minutes): the studies of ``benchmarks/federated_mf_{baselines,gddr,gddr_null}.py``, their
records written beside the job's.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path

import rayfed
from rayfed import jobs
from rayfed.protocols.federated_mf import tuning

ML100K = Path(__file__).resolve().parents[2] / "shared" / "data" / "movielens-100k" / "ratings.csv"
RUNS = {  # setting -> (method, baselines)
    "vfl": ("vfl", ["local"]),
    "hfl": ("hfl", ["local"]),
    "lfl": ("lfl", ["ldp", "stage1"]),
}


#: the tuned runs' learning rate decays to this fraction of the start (spec §7.9's assumption)
LR_DECAY = 0.1
#: --literature: the spec checks of the literature baselines, run by their benchmark scripts
LITERATURE = {
    "e3": "federated_mf_baselines",
    "e8": "federated_mf_gddr",
    "e8-null": "federated_mf_gddr_null",
}


def literature(names: str, out: Path) -> dict[str, str]:
    """The literature studies ``names`` (of :data:`LITERATURE`) with their records in ``out``: the
    same code as the benchmark scripts, on ML-100K, in-process."""
    benchmarks = Path(__file__).resolve().parents[1] / "benchmarks"
    sys.path.insert(0, str(benchmarks))
    records = {}
    for name in names.split(","):
        script = LITERATURE[name]
        path = out / f"{script}.json"
        importlib.import_module(script).main(["--out", str(path)])
        records[name] = str(path)
    plot_literature(records, out / "federated_mf_literature.png")
    return records


def plot_literature(records: dict[str, str], path: Path) -> None:
    """E3: test MSE against ε of VFL-SGDMF (s = 1), DP-SGLD and ObjPertb, per rating and per user;
    E8: GD-DR against the LFL baselines per ε (from the studies' records)."""
    panels = [n for n in ("e3", "e8") if n in records]
    if not panels:
        return
    fig, axes = jobs.pyplot().subplots(1, 2 * ("e3" in panels) + ("e8" in panels), squeeze=False)
    fig.set_size_inches(4.7 * axes.shape[1], 4.2)
    axes = list(axes[0])
    if "e3" in panels:
        summary = json.loads(Path(records["e3"]).read_text())["summary"]
        for ax, unit in zip(axes, ("rating", "user"), strict=False):
            for method in ("vfl", "dp-sgld", "objpert"):
                pts = sorted(
                    (r["epsilon"], r["test_mse_mean"])
                    for r in summary
                    if r["unit"] == unit and r["method"] == method and r["mode"] == "corrected"
                )
                ax.plot([e for e, _ in pts], [v for _, v in pts], marker="o", label=method)
            ax.set(xscale="log", yscale="log", xlabel="ε", ylabel="test MSE")
            epsilons = sorted({r["epsilon"] for r in summary})
            ax.set_xticks(epsilons, [f"{e:g}" for e in epsilons])
            ax.minorticks_off()
            ax.set_title(f"E3, per {unit}, s = 1 (ML-100K)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        axes = axes[2:]
    if "e8" in panels:
        table = json.loads(Path(records["e8"]).read_text())["mean_test_mse"]
        ax = axes[0]
        methods = ("gd-dr", "stage1", "ldp", "lfl")
        for i, method in enumerate(methods):
            ax.bar(
                [j + 0.2 * i for j in range(len(table))],
                [row[method] for row in table.values()],
                width=0.2,
                label=method,
            )
        ax.set_xticks([j + 0.3 for j in range(len(table))], list(table))
        ax.set(ylabel="test MSE", title="E8, LFL (ML-100K, T = 10)")
        ax.set_ylim(bottom=1.0)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    jobs.save(fig, path, dpi=120)


def options(setting: str, method: str, epsilon: float, args) -> dict:
    base = {
        "setting": setting,
        "method": method,
        "epsilon": epsilon,
        "accountant": args.accountant,
        "seed": args.seed,
        "out_dir": None,
        "backend": args.backend,
    }
    if args.data:
        base["data"] = {"path": args.data}
    else:
        base.update(users=args.users, items=args.items)
    if setting in ("vfl", "hfl"):
        base.update(
            iterations=args.rounds,
            parties=args.parties,
            privacy_unit="user",
            trim=5 if setting == "vfl" else 10,
        )
    else:
        base.update(iterations=10, secagg_mode=args.secagg)
    return base


def _record(result, **keys) -> dict:
    """``keys``, the run's test MSE and its (ε, δ) — None for a run that declared no DP (its
    ε = 0 is no guarantee)."""
    p = result.privacy
    epsilon, delta = (p.epsilon, p.delta) if p.private else (None, None)
    return {
        **keys,
        "test_mse": result.metrics["test_mse"],
        "epsilon_spent": epsilon,
        "delta": delta,
    }


def c3_options(setting: str, epsilon: float | None, args) -> dict:
    """The C3 runs: per-rating DP at ``epsilon``, or no noise (None), at the configuration's
    learning rate."""
    base = options(setting, setting, 1.0, args)
    del base["privacy_unit"], base["trim"]
    if epsilon is None:
        del base["epsilon"], base["accountant"]
        base["noise"] = "none"
    else:
        base.update(epsilon=epsilon, privacy_unit="rating")
    return base


def rate(lr: float) -> dict:
    """A tuning candidate: ``vfl_lr`` = ``lr`` decaying to LR_DECAY·lr."""
    return {"vfl_lr": lr, "vfl_lr_end": lr * LR_DECAY}


def c3_point(setting: str, epsilon: float | None, args, grid: list) -> dict:
    """One C3 run on the data: at the configuration's rate, or with ``--tune`` at the rate from
    ``--lrs`` of lowest test MSE on a synthetic stand-in of the data's public shape (its grid of
    stand-in scores kept in ``grid``)."""
    base = c3_options(setting, epsilon, args)
    keys: dict = {"setting": setting, "epsilon": epsilon}
    if args.tune:
        tuned = tuning.tune(base, [rate(lr) for lr in jobs.numbers(args.lrs)])
        grid.extend({**keys, **point} for point in tuned.grid)
        base.update(tuned.picked)
        keys["tuning"] = tuning.TUNING
    else:
        keys["tuning"] = None
    result = rayfed.run("federated-mf", **base)
    point = _record(result, **keys)
    rate_used = result.metrics["learning_rate"]
    point.update(
        vfl_lr=rate_used["start"], vfl_lr_end=rate_used["end"], lr_source=rate_used["source"]
    )
    label = "non-private" if epsilon is None else f"per-rating ε={epsilon:<4g}"
    print(
        f"{setting} C3 {label} vfl_lr={point['vfl_lr']:.4g} ({point['lr_source']}) "
        f"test MSE {point['test_mse']:.4f}",
        file=sys.stderr,
    )
    return point


def c3(args, epsilons: list, settings: list) -> tuple[dict, list, list, dict]:
    """Spec C3: the federated non-private lines (VFL, HFL), VFL's per-rating curve (at the
    configuration's rate, or publicly tuned per ε with ``--tune``), and the check that the curve
    approaches its line."""
    grid: list = []
    lines = {s: c3_point(s, None, args, grid) for s in ("vfl", "hfl") if s in settings}
    curve = [c3_point("vfl", eps, args, grid) for eps in epsilons] if "vfl" in settings else []
    checks = {}
    if curve:
        gap = [abs(p["test_mse"] - lines["vfl"]["test_mse"]) for p in curve]
        checks[
            f"vfl per-rating nearer the non-private line at ε={epsilons[-1]:g} than at "
            f"ε={epsilons[0]:g}"
        ] = gap[-1] < gap[0]
    return lines, curve, grid, checks


def body(args) -> dict:
    _check_literature(args)
    epsilons = jobs.numbers(args.epsilons)
    settings = args.settings.split(",")
    started = time.perf_counter()
    rows = []
    for setting, (method, baselines) in RUNS.items():
        if setting not in settings:
            continue
        for eps in epsilons:
            for m in [method, *baselines]:
                result = rayfed.run("federated-mf", **options(setting, m, eps, args))
                rows.append(_record(result, setting=setting, method=m, epsilon=eps))
                print(
                    f"{setting} {m:<7} ε={eps:<4g} test MSE {rows[-1]['test_mse']:.4f}",
                    file=sys.stderr,
                )
    central = rayfed.run("federated-mf", **options("lfl", "central", 1.0, args)).metrics["test_mse"]
    lines, curve, grid, checks = c3(args, epsilons, settings)
    for setting, (method, _) in RUNS.items():
        if setting not in settings:
            continue
        for eps in epsilons:
            mse = {
                r["method"]: r["test_mse"]
                for r in rows
                if r["setting"] == setting and r["epsilon"] == eps
            }
            against = "ldp" if setting == "lfl" else "local"
            checks[f"{setting} {method} < {against} at ε={eps:g}"] = mse[method] < mse[against]
    out = jobs.out_dir(args)
    record = {
        "data": args.data or f"synthetic {args.users}x{args.items}",
        "parties": args.parties,
        "central_nonprivate_mse": central,
        "rows": rows,
        "federated_nonprivate": lines,
        "vfl_per_rating": curve,
        "tuning": tuning.TUNING if args.tune else None,
        "stand_in_lr_grid": grid,
        "lr_decay": LR_DECAY if args.tune else None,
        "orderings": checks,
        "seconds": time.perf_counter() - started,
    }
    if args.literature:
        record["literature"] = literature(args.literature, out)
    jobs.write_json(out / "federated_mf_repro.json", record)
    plot(rows, central, lines, curve, epsilons, settings, out / "federated_mf_repro.png")
    return {"out": str(out.resolve()), "orderings_hold": jobs.checks_hold(checks)}


def plot(rows, central, lines, curve, epsilons, settings, path) -> None:
    shown = [(s, runs) for s, runs in RUNS.items() if s in settings]
    fig, axes = jobs.pyplot().subplots(
        1, len(shown), figsize=(4.7 * len(shown), 4.2), squeeze=False
    )
    for ax, (setting, (method, baselines)) in zip(axes[0], shown, strict=True):
        for m in [method, *baselines]:
            pts = sorted(
                (r["epsilon"], r["test_mse"])
                for r in rows
                if r["setting"] == setting and r["method"] == m
            )
            ax.plot([e for e, _ in pts], [v for _, v in pts], marker="o", label=m)
        if setting == "vfl" and curve:
            ax.plot(
                [p["epsilon"] for p in curve],
                [p["test_mse"] for p in curve],
                marker="s",
                label="vfl per-rating, lr tuned publicly"
                if curve[0]["tuning"]
                else "vfl per-rating",
            )
        if setting in lines:
            ax.axhline(
                lines[setting]["test_mse"],
                color="black",
                linestyle="--",
                label="federated non-private (noise=none)",
            )
        ax.axhline(central, color="grey", linestyle=":", label="central non-private")
        ax.set(
            xscale="log",
            xlabel="ε (per user; the C3 curve per rating)",
            ylabel="test MSE",
            title=setting.upper(),
        )
        ax.set_xticks(epsilons, [f"{e:g}" for e in epsilons])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    jobs.save(fig, path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = jobs.parser(
        __doc__,
        small="synthetic data, two ε values, short runs (tests)",
        out="runs/federated_mf_repro",
        seed=True,
        backend="ray",
    )
    p.add_argument(
        "--data", help="ratings file with user_id,item_id,rating (default: ML-100K beside the repo)"
    )
    p.add_argument("--epsilons", default="0.5,1,2,4,8")
    p.add_argument("--parties", type=int, default=2, help="VFL/HFL parties s")
    p.add_argument("--settings", default="vfl,hfl,lfl", help="which settings to run")
    p.add_argument(
        "--tune",
        action="store_true",
        help="C3: pick vfl_lr per ε from --lrs on a synthetic stand-in of the data's public "
        "shape (public tuning); default: the public rule's rate, nothing tuned",
    )
    p.add_argument(
        "--lrs", default="0.05,0.2,0.5,2,5,20", help="C3 with --tune: the vfl_lr candidates"
    )
    p.add_argument("--rounds", type=int, default=100, help="VFL/HFL T (T'=10)")
    p.add_argument("--secagg", default="dealer", choices=["dealer", "simulation", "secure"])
    p.add_argument(
        "--accountant",
        default="tightest",
        choices=["tightest", "rdp"],
        help="what the noise is calibrated against (rdp: the thesis's, and the records before "
        "issue 25)",
    )
    p.add_argument("--users", type=int, default=1000)
    p.add_argument("--items", type=int, default=100)
    p.add_argument(
        "--literature",
        help=f"also the literature baselines' checks, comma-separated from {sorted(LITERATURE)} "
        "(ML-100K only; slow)",
    )
    args = p.parse_args(argv)
    if args.small:
        args.epsilons, args.rounds, args.data, args.lrs = "1,8", 30, None, "0.2,2"
    elif args.data is None and ML100K.exists():
        args.data = str(ML100K)
    return jobs.run("federated_mf_repro", body, args)


def _check_literature(args) -> None:
    if not args.literature:
        return
    unknown = set(args.literature.split(",")) - set(LITERATURE)
    if unknown:
        raise rayfed.ConfigError("--literature", f"unknown {sorted(unknown)}", sorted(LITERATURE))
    if args.small or not ML100K.exists() or Path(args.data or "") != ML100K:
        raise rayfed.ConfigError(
            "--literature",
            "the literature studies run on ML-100K from ../shared/data only",
            "drop --small and --data (and have ML-100K beside the repo)",
        )


if __name__ == "__main__":
    sys.exit(main())
