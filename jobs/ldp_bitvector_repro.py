"""LDP bit-vector clustering reproduction (Sun, Zhao & Ye): Table III on digits beside the paper,
NMI vs ε (Fig. 8 analogue), the distance estimator's error vs distance and the effect of distance
consistence (Fig. 5 analogue), and DBSCAN on the SIPU shapes (JSON + plot).

Needs rayfed installed where it runs (cluster.yaml installs it on every node):

    python jobs/ldp_bitvector_repro.py                  # about 5 minutes on 2 cores
    python jobs/ldp_bitvector_repro.py --reps 10
    python jobs/ldp_bitvector_repro.py --small          # s = 200, fewer points (tests)

Digits is scikit-learn's bundled copy; aggregation and pathbased are read from ../shared/data when
present. The privacy of the DPBV rows is pure d·s·ε per record (spec §3): the paper's (ε, δ) labels
are printed beside it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

import rayfed
from rayfed import jobs, rng
from rayfed.ldp import bitvector as bv
from rayfed.privacy import NoiseSource, binary_randomized_response
from rayfed.protocols.ldp_bitvector.config import BASELINES

SHAPES = Path(__file__).resolve().parents[2] / "shared" / "data"
TABLE_III = [  # label, options, the paper's NMI
    ("k-means", {"method": "kmeans"}, 0.7432),
    ("RSP 50% (q=32)", {"method": "rsp", "rsp_dims": 32}, 0.6365),
    ("RSP 75% (q=48)", {"method": "rsp", "rsp_dims": 48}, 0.6708),
    ("ADP σ=1", {"method": "adp", "adp_sigma": 1.0}, 0.7399),
    ("ADP σ=2", {"method": "adp", "adp_sigma": 2.0}, 0.7272),
    ("kCluster (exact distances)", {"encoding": "exact"}, 0.7465),
    ("kCluster (noise-free BV)", {"encoding": "bv"}, 0.7465),
    ("LDP+kCluster ε=1", {"epsilon": 1.0}, 0.7089),
    ("LDP+kCluster ε=2", {"epsilon": 2.0}, 0.7357),
]


def nmi(options: dict, seeds, backend: str) -> list[float]:
    return [
        rayfed.run("ldp-bitvector", seed=s, backend=backend, out_dir=None, **options).metrics["nmi"]
        for s in seeds
    ]


def table_iii(args) -> list[dict]:
    rows = []
    for label, options, paper in TABLE_III:
        reps = args.reps * (4 if options.get("method") in ("rsp",) else 1)
        if options.get("method") not in BASELINES:  # the baselines encode nothing
            options = {**options, "bits": args.bits}
        values = nmi(options, range(reps), args.backend)
        rows.append(
            {
                "method": label,
                "paper": paper,
                "nmi": float(np.mean(values)),
                "sd": float(np.std(values)),
                "runs": reps,
            }
        )
        print(
            f"{label:<28} NMI {rows[-1]['nmi']:.4f} (paper {paper:.4f})",
            file=sys.stderr,
            flush=True,
        )
    return rows


def nmi_vs_epsilon(args, epsilons) -> list[dict]:
    rows = []
    for eps in epsilons:
        values = nmi({"epsilon": eps, "bits": args.bits}, range(args.reps), args.backend)
        rows.append({"epsilon": eps, "nmi": float(np.mean(values)), "sd": float(np.std(values))})
        print(f"ε={eps:<5g} NMI {rows[-1]['nmi']:.4f}", file=sys.stderr, flush=True)
    return rows


def estimator_error(args) -> dict:
    """Mean and sd of d̂ vs the true distance (μ = 100, fresh anchors per trial) and ERR_avg with
    and without distance consistence (noise-free BV, uniform [0, 25], t = 3, 200 points)."""
    gen = rng.stream(0, "evaluation", 0, "ldp-bitvector-estimator")
    noise = NoiseSource.seeded(0, "ldp-bitvector-estimator")
    s, trials = args.bits, 400 if args.small else 1000

    def rr(bits, eps):  # the custodians' per-bit randomized response
        keep = bv.keep_probability(eps)
        return binary_randomized_response(noise, bits, keep_probability=keep)[0]

    by_distance = []
    for eps in (0.5, 1.0, 2.0, 4.0):
        for d in (0, 5, 10, 25, 40, 50):
            r = gen.uniform(-25, 75, (trials, s))
            x = np.full((trials, 1), 0.0 if d > 25 else 20.0)
            bx = rr(np.abs(x - r) <= 25, eps)
            by = rr(np.abs(x + d - r) <= 25, eps)
            est = bv.debias((bx != by).sum(1), s, 100.0, eps)
            by_distance.append(
                {
                    "epsilon": eps,
                    "distance": d,
                    "mean": float(est.mean()),
                    "sd": float(est.std()),
                    "theory_sd": bv.estimator_sd(d, s, 100.0, eps),
                }
            )
    chaining = []
    points = gen.uniform(0, 25, 200)
    true = np.abs(points[:, None] - points[None, :])
    for bits in (100, 500, 1000, 2000):
        r = gen.uniform(-3, 28, bits)
        codes = bv.encode(points, r, 3.0)
        raw = bv.debias(bv.hamming(codes, codes), bits, 31.0, None)
        chained = bv.distance_consistence(raw, 0.5 * 6.0)
        chaining.append(
            {
                "bits": bits,
                "without": float(np.abs(raw - true).mean()),
                "with": float(np.abs(chained - true).mean()),
            }
        )
    return {"by_distance": by_distance, "consistence": chaining}


def shapes(args) -> list[dict]:
    rows = []
    for name, bounds in (("aggregation", [0, 40]), ("pathbased", [0, 36])):
        path = SHAPES / name / f"{name}.csv"
        if not path.exists():
            continue
        for encoding, eps in (("exact", 1.0), ("dpbv", 4.0), ("dpbv", 2.0), ("dpbv", 1.0)):
            for radius in (1.5, 2.5, 3.5):
                options = dict(
                    method="dbscan",
                    encoding=encoding,
                    epsilon=eps,
                    dbscan_eps=radius,
                    bounds=bounds,
                    label="label",
                    bits=args.bits,
                    data={"path": str(path), "columns": {"p0": ["x"], "p1": ["y"]}},
                )
                value = nmi(options, [0], args.backend)[0]
                rows.append(
                    {
                        "dataset": name,
                        "encoding": encoding if encoding == "exact" else f"ε={eps:g}",
                        "E": radius,
                        "nmi": value,
                    }
                )
    return rows


def body(args) -> dict:
    epsilons = jobs.numbers(args.epsilons)
    started = time.perf_counter()
    record = {
        "bits": args.bits,
        "repetitions": args.reps,
        "table_iii": table_iii(args),
        "nmi_vs_epsilon": nmi_vs_epsilon(args, epsilons),
        "estimator": estimator_error(args),
        "dbscan_shapes": shapes(args),
        "paper_delta_labels": {f"{e:g}": bv.paper_delta(e, 1000) for e in (1.0, 2.0)},
        "true_epsilon_per_record_digits": {f"{e:g}": 64 * args.bits * e for e in (1.0, 2.0)},
    }
    record["seconds"] = time.perf_counter() - started
    out = jobs.out_dir(args)
    jobs.write_json(out / "ldp_bitvector_repro.json", record)
    plot(record, out / "ldp_bitvector_repro.png")
    return {"out": str(out.resolve())}


def plot(record: dict, path: Path) -> None:
    plt = jobs.pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.6))
    ax = axes[0]
    rows = record["table_iii"]
    y = np.arange(len(rows))
    ax.barh(y - 0.2, [r["nmi"] for r in rows], 0.4, xerr=[r["sd"] for r in rows], label="rayfed")
    ax.barh(y + 0.2, [r["paper"] for r in rows], 0.4, label="paper (Table III)")
    ax.set_yticks(y, [r["method"] for r in rows], fontsize=8)
    ax.set(xlim=(0.5, 0.8), xlabel="NMI", title="digits, k = 10")
    ax.legend(fontsize=8)
    ax = axes[1]
    pts = record["nmi_vs_epsilon"]
    ax.errorbar(
        [r["epsilon"] for r in pts],
        [r["nmi"] for r in pts],
        yerr=[r["sd"] for r in pts],
        marker="o",
        capsize=3,
    )
    ax.set(xscale="log", xlabel="ε per bit", ylabel="NMI", title="LDP + kCluster on digits")
    ax.set_xticks([r["epsilon"] for r in pts], [f"{r['epsilon']:g}" for r in pts])
    ax.xaxis.set_minor_locator(plt.NullLocator())
    ax = axes[2]
    for eps in (0.5, 1.0, 2.0, 4.0):
        pts = [r for r in record["estimator"]["by_distance"] if r["epsilon"] == eps]
        ax.errorbar(
            [r["distance"] for r in pts],
            [r["mean"] for r in pts],
            yerr=[r["sd"] for r in pts],
            marker="o",
            capsize=3,
            label=f"ε={eps:g}",
        )
    ax.plot([0, 50], [0, 50], "k:", label="true distance")
    ax.axhline(50, color="grey", ls="--", lw=0.8)
    ax.set(
        xlabel="true distance (μ = 100, 2t = 50)",
        ylabel="estimate ± sd",
        title="debiased estimator (saturates at 2t)",
    )
    ax.legend(fontsize=8)
    ax = axes[3]
    pts = record["estimator"]["consistence"]
    ax.plot(
        [r["bits"] for r in pts],
        [r["without"] for r in pts],
        marker="o",
        label="without consistence",
    )
    ax.plot(
        [r["bits"] for r in pts],
        [r["with"] for r in pts],
        marker="o",
        label="with (r = 0.5·2t, first j)",
    )
    ax.set(
        xscale="log",
        xlabel="s (bits)",
        ylabel="ERR_avg",
        title="uniform [0,25], t = 3, noise-free BV",
    )
    ax.legend(fontsize=8)
    jobs.save(fig, path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    p = jobs.parser(
        __doc__,
        small="s = 200, 1 repetition, three ε",
        out="runs/ldp_bitvector_repro",
        backend="local",
    )
    p.add_argument("--epsilons", default="0.1,0.25,0.5,1,2,3,4")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--bits", type=int, default=1000)
    args = p.parse_args(argv)
    if args.small:
        args.epsilons, args.reps, args.bits = "0.5,1,4", 1, 200
    return jobs.run("ldp_bitvector_repro", body, args)


if __name__ == "__main__":
    sys.exit(main())
