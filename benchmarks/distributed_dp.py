"""Distributed DP mean estimation through secure-sum (issue 27 item 6): the distributed discrete
Gaussian (``ddg``) and Skellam (``skellam``) pipelines against the central continuous Gaussian.
Writes ``benchmarks/results/distributed_dp.json`` and ``distributed_dp.png``.

    python benchmarks/distributed_dp.py            # the grid below: 38 minutes (2 cores, load ~9)
    python benchmarks/distributed_dp.py --quick    # n = 1,000, ε = 1, 12 / 16 bits (~25 s)
    python benchmarks/distributed_dp.py --replot   # the summaries and plot from the JSON

Every point is one ``rayfed.run("secure-sum", dp_mechanism=..., backend="local")``: the whole
pipeline (ℓ2 clip, rotation, scale γ, conditional rounding keyed per user, the integer shares
keyed per user, ring words mod 2^bits, secure aggregation, decode) and the ledger's charge. The
grid runs in ``mode=dealer`` (the same ring arithmetic without key agreement: the sum mod 2^bits
is exact in every mode, so the released mean depends only on the pipeline and the noise); the
``crypto`` section reruns points in ``mode=simulation`` (the X25519 / AES / Shamir work of
``secure``, seeded keys) and checks that the released mean is bit-identical to the dealer run's.

Users' rows: the synthetic inputs (uniform on [-1, 1]^d, rows scaled to ℓ2 norm ≤ clip = 1), seed
0, one round, no user lost. δ = 1/n². Two dropout settings: ``tolerated_dropout=0`` (the least
secure-sum allows: the quorum q = n) and the default 0.3 (q = 0.7 n: every share calibrated for
only q shares, worst-case charging). No colluding users (``corrupt_fraction=0``): the distributed
events count only the honest users' shares (q = min_survivors − ⌈γn⌉), so a fraction γ of
colluders multiplies the expected MSE by (n − ⌈δn⌉)/(n − ⌈δn⌉ − ⌈γn⌉) — ×1.053 at δ = 0 and ×1.077
at δ = 0.3 for the default γ = 0.05, which alone misses a 5 % target; set apart here to measure
the mechanism.

Per point, beside the realised MSE of the released mean against the survivors' true mean (one draw,
its relative sd ≈ √(2/d): 4.4 % at d = 1,024), the *expected* MSE computed here, exactly:
(noise variance of the sum + R) / (γ s)², with R = Σ_users mean_j p_j(1 - p_j) the rounding's
variance (p_j the fractional parts the rounding sees: the rows regenerated from the seed, rotated
with the run's public signs and scaled by its γ). It factors, exactly, into

    expected / central_PLD = dropout · accounting · mechanism · inflation · rounding

* dropout    = s / q: the sum holds s shares calibrated for q (worst-case charging);
* accounting = (z_RDP / z_PLD)²: the integer events are RDP curves (dp-accounting has no PLD for
  them), the central Gaussian under ``tightest`` is PLD;
* mechanism  = q·share / (z_RDP·Δ₂)²: what the DDG / Skellam RDP bound needs beyond a continuous
  Gaussian under RDP at the same integer sensitivity Δ₂;
* inflation  = (Δ₂ / (γ·clip))²: the rounding's norm inflation of the sensitivity;
* rounding   = 1 + R / noise variance: the rounding's own variance.

Modular clipping costs through γ: γ is the largest scale whose wrap bound is ≤ 10⁻⁶ at the given
bits, so fewer bits mean a smaller γ and larger inflation / rounding factors; the wrap itself is
bounded (``modular_clip_bound``), and a wrap would show as a realised MSE many sd above the
expected one (``z``). The target (issue 27): within 5 % of the central MSE at ≤ 16 bits; judged on
the expected ratio (the realised one's sampling sd is 4.4 %), against the central Gaussian under
PLD (the tight one) and under RDP (the integer events' own accountant).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

import rayfed
from rayfed.actors.base import StepContext
from rayfed.errors import ConfigError
from rayfed.privacy import gaussian_noise_multiplier
from rayfed.protocols.secure_sum import dp as private
from rayfed.protocols.secure_sum.steps import synthetic_inputs
from rayfed.secagg import ddp

SEED = 0
CLIP = 1.0
TARGET = 1.05
RELATION = private.RELATION.kind
MECHANISMS = ("ddg", "skellam")
EPSILONS = (0.5, 1.0, 4.0)
ALL_BITS = (8, 10, 12, 14, 16, 18, 20)
#: (tolerated_dropout, label): the least secure-sum allows (q = n) and the default (q = 0.7 n)
DROPOUTS = ((0.0, "q=n"), (0.3, "q=0.7n"))


#: what this run can say about the papers' own experiments (their figures were not readable here)
PAPERS = (
    "Kairouz, Liu & Steinke (ICML 2021) and Agarwal, Kairouz & Liu (NeurIPS 2021): only their "
    "abstracts were readable here (DDG 'matches central DP with less than 16 bits'; Skellam 'the "
    "same privacy-accuracy trade-offs as the continuous Gaussian, even when the precision is "
    "low'), not their figures' numbers. The authors' mean-estimation script "
    "(google-research/federated distributed_dp/dme_run.py) runs n = 100 and 1,000, d = 250, "
    "c = 10, δ = 1e-5, 10-16 bits, against the analytic (tight) Gaussian, with the scale chosen "
    "so that k_stddevs = 2 standard deviations of an assumed-Gaussian aggregate fit the range "
    "(a heuristic, not a bound) and β = e^-1/2; this pipeline bounds the wrap probability "
    "rigorously at 1e-6 over every coordinate (≈ 6.5 sd at d = 1,024), about log2(6.5/2) ≈ 1.7 "
    "bits more for the same γ, and charges the integer events under RDP"
)


def grid(quick: bool) -> list[dict]:
    """The points, in run order. Each: n, d, eps, bits, mechanism, tolerated_dropout, mode."""
    pts = []

    def add(n, d, eps, bits, mechs=MECHANISMS, drops=(0.0,), mode="dealer"):
        for td in drops:
            for e in eps:
                for b in bits:
                    for m in mechs:
                        pts.append(dict(n=n, d=d, eps=e, bits=b, mechanism=m, td=td, mode=mode))

    if quick:
        add(1000, 1024, (1.0,), (12, 16), drops=(0.0, 0.3))
        add(1000, 1024, (1.0,), (16,), mode="simulation")
        return pts
    # n = 1,000: the whole grid, both dropout settings
    add(1000, 1024, EPSILONS, ALL_BITS, drops=(0.0, 0.3))
    # n = 10,000 at q = n: Skellam at every ε and bits; the discrete Gaussian (its exact sampler
    # costs ~3 µs a draw: 40-50 s a point here) at 12 / 16 / 20 bits; the default dropout at ε = 1
    add(10_000, 1024, EPSILONS, ALL_BITS, mechs=("skellam",))
    add(10_000, 1024, EPSILONS, (12, 16, 20), mechs=("ddg",))
    add(10_000, 1024, (1.0,), (12, 16, 20), drops=(0.3,))
    # n = 100,000 (dealer, 90-190 s a Skellam point, 4.7 GB): Skellam at ε = 1, 20 / 22 / 24 bits
    # (16 bits: γ = 1.6, ×180 the central MSE), ε = 0.5 / 4 at 24 bits; no discrete Gaussian
    # (10^8 exact draws, ~5 minutes a point)
    add(100_000, 1024, (1.0,), (20, 22, 24), mechs=("skellam",))
    add(100_000, 1024, (0.5, 4.0), (24,), mechs=("skellam",))
    # d = 65,536 with the dealer: n = 1,000, Skellam only (10^4 × 65,536 int64 words is 5 GB a
    # copy; the discrete Gaussian's 6.6·10^7 draws ~3.5 minutes)
    add(1000, 65_536, (1.0,), (16, 20), mechs=("skellam",))
    # real crypto (mode=simulation): n = 1,000 every ε × 12/16/20 bits, both mechanisms;
    # n = 10,000 ε = 1: Skellam at 12/16/20 bits, the discrete Gaussian at 16
    add(1000, 1024, EPSILONS, (12, 16, 20), mode="simulation")
    add(10_000, 1024, (1.0,), (12, 16, 20), mechs=("skellam",), mode="simulation")
    add(10_000, 1024, (1.0,), (16,), mechs=("ddg",), mode="simulation")
    return pts


# --- evaluation-only references --------------------------------------------------------------------
_ROWS: dict[tuple[int, int], np.ndarray] = {}


def rotated_rows(n: int, d: int) -> np.ndarray:
    """The users' rows as the run's plan builds them (seed, synthetic, ℓ2-clipped), rotated with
    the run's public signs (rotation seed = the run seed, round 0): γ·this is what the users round
    (float64; the last (n, d) only: 0.8 GB at n = 10^5)."""
    key = (n, d)
    if key not in _ROWS:
        _ROWS.clear()
        ctx = StepContext(name="plan", role="driver", seed=SEED)
        p = ddp.plan(dim=d, users=n, clip=CLIP, bits=62, gamma=1.0, rotation_seed=SEED)
        out = np.empty((n, p.padded_dim), dtype=np.float64)
        for lo in range(0, n, 10_000):
            ids = np.arange(lo, min(n, lo + 10_000), dtype=np.int64)
            x, _ = private.clip_rows(synthetic_inputs(ctx, 0, ids, d, CLIP), CLIP)
            out[lo : lo + len(ids)] = p.rotate(x)
        _ROWS[key] = out
    return _ROWS[key]


def rounding_variance(n: int, d: int, gamma: float) -> float:
    """R = Σ_users mean_j p_j(1 - p_j): the rounding's variance per integer coordinate of the sum
    (the conditional re-rounding of ≤ β of the rows is ignored: β = 10⁻⁶)."""
    y = rotated_rows(n, d)
    total = 0.0
    for lo in range(0, n, 5_000):
        z = y[lo : lo + 5_000] * gamma
        f = z - np.floor(z)
        total += float(np.sum(f * (1 - f))) / y.shape[1]
    return total


_Z: dict[tuple[float, float, str], float] = {}


def z(eps: float, delta: float, accountant: str) -> float:
    key = (eps, delta, accountant)
    if key not in _Z:
        _Z[key] = gaussian_noise_multiplier(
            eps, delta, steps=1, accountant=accountant, relation=RELATION
        )
    return _Z[key]


# --- one point -------------------------------------------------------------------------------------
def run_point(pt: dict) -> dict:
    n, d, eps, bits, mech = pt["n"], pt["d"], pt["eps"], pt["bits"], pt["mechanism"]
    delta = 1.0 / n**2
    row = {
        "n": n,
        "d": d,
        "epsilon": eps,
        "delta": delta,
        "bits": bits,
        "mechanism": mech,
        "tolerated_dropout": pt["td"],
        "mode": pt["mode"],
    }
    start = time.perf_counter()
    try:
        result = rayfed.run(
            "secure-sum", backend="local", out_dir=None, seed=SEED, users=n, dim=d, clip=CLIP,
            mode=pt["mode"], dp_mechanism=mech, epsilon=eps, delta=delta, bits=bits,
            tolerated_dropout=pt["td"], corrupt_fraction=0.0, cohorts=2,
        )  # fmt: skip
    except ConfigError as e:  # bits that cannot hold the sum: refused before any actor
        row.update(feasible=False, refused=str(e), seconds=round(time.perf_counter() - start, 2))
        return row
    seconds = time.perf_counter() - start
    m = result.metrics
    mean = result.tables["mean"]
    released = mean.column("released_mean").to_numpy()
    truth = mean.column("true_mean").to_numpy()
    s, q = m["survivors"], m["quorum"]
    gamma = m["gamma"]
    noise = m["noise_variance_in_sum"]
    r_var = rounding_variance(n, d, gamma)
    # the regenerated rows are the run's: their mean is the run's true mean (all users survive)
    rows_mean = rotated_rows(n, d).mean(axis=0)
    p = ddp.plan(dim=d, users=n, clip=CLIP, bits=62, gamma=1.0, rotation_seed=SEED)
    regen_error = float(np.max(np.abs(p.unrotate(rows_mean[None, :])[0] - truth)))
    assert s == n and regen_error < 1e-9, (s, regen_error)
    expected = (noise + r_var) / (gamma * s) ** 2
    z_pld, z_rdp = z(eps, delta, "tightest"), z(eps, delta, "rdp")
    central_pld = (z_pld * CLIP / s) ** 2
    central_rdp = (z_rdp * CLIP / s) ** 2
    assert abs(central_pld / m["central_gaussian_mse_evaluation_only"] - 1) < 1e-9
    factors = {
        "dropout": noise / m["target_noise_variance"],
        "accounting": (z_rdp / z_pld) ** 2,
        "mechanism": m["target_noise_variance"] / (z_rdp * m["l2_bound"]) ** 2,
        "inflation": m["inflation_bound"] ** 2,
        "rounding": 1 + r_var / noise,
    }
    product = math.prod(factors.values())
    assert abs(product / (expected / central_pld) - 1) < 1e-9, (product, expected / central_pld)
    mse = m["mse"]
    row.update(
        feasible=True,
        seconds=round(seconds, 2),
        quorum=q,
        survivors=s,
        degree=m["degree"],
        threshold=m["threshold"],
        epsilon_charged=m["epsilon_charged"],
        gamma=gamma,
        padded_dim=m["padded_dim"],
        l2_bound=m["l2_bound"],
        modular_clip_bound=m["modular_clip_bound"],
        share_variance=m["share_variance"],
        rounding_variance=r_var,
        mse=mse,
        expected_mse=expected,
        central_pld_mse=central_pld,
        central_rdp_mse=central_rdp,
        z_pld=z_pld,
        z_rdp=z_rdp,
        ratio_pld=mse / central_pld,
        ratio_rdp=mse / central_rdp,
        expected_ratio_pld=expected / central_pld,
        expected_ratio_rdp=expected / central_rdp,
        # realised against expected in sds of the MSE estimator (≈ expected·√(2/d)): a modular
        # wrap would add ~(2^bits/γ)²/(d·s²) and show as a large z
        z_score=(mse / expected - 1) / math.sqrt(2 / d),
        factors=factors,
        released_sha256=hashlib.sha256(released.tobytes()).hexdigest(),
        phase_seconds={k: round(v, 3) for k, v in m["phase_seconds"].items()},
    )
    return row


def fmt(row: dict) -> str:
    head = (
        f"n={row['n']:>6} d={row['d']:>5} eps={row['epsilon']:<3} bits={row['bits']:>2} "
        f"{row['mechanism']:<7} td={row['tolerated_dropout']:<3} {row['mode']:<10}"
    )
    if not row["feasible"]:
        return f"{head} refused ({row['seconds']} s): {row['refused'][:90]}"
    f = row["factors"]
    return (
        f"{head} {row['seconds']:>6.1f} s  γ={row['gamma']:<9.4g} MSE/central PLD "
        f"{row['ratio_pld']:.3f} (expected {row['expected_ratio_pld']:.3f}, z {row['z_score']:+.1f}), "
        f"RDP {row['ratio_rdp']:.3f} (expected {row['expected_ratio_rdp']:.3f}); dropout "
        f"{f['dropout']:.3f} acct {f['accounting']:.3f} mech {f['mechanism']:.4f} infl "
        f"{f['inflation']:.4f} round {f['rounding']:.5f}"
    )


# --- summaries -------------------------------------------------------------------------------------
def fewest_bits(rows: list[dict]) -> list[dict]:
    """Per (n, d, ε, mechanism, dropout setting): the fewest bits whose expected MSE is within 5 %
    of the central Gaussian's under PLD and under RDP (None: no bits run met it), dealer rows."""
    out = {}
    for r in rows:
        if r["mode"] != "dealer":
            continue
        key = (r["n"], r["d"], r["epsilon"], r["mechanism"], r["tolerated_dropout"])
        e = out.setdefault(
            key,
            {
                "n": r["n"],
                "d": r["d"],
                "epsilon": r["epsilon"],
                "mechanism": r["mechanism"],
                "tolerated_dropout": r["tolerated_dropout"],
                "bits_run": [],
                "fewest_bits_pld": None,
                "fewest_bits_rdp": None,
                "best_expected_ratio_pld": None,
                "best_expected_ratio_rdp": None,
            },
        )
        e["bits_run"].append(r["bits"])
        if not r["feasible"]:
            continue
        for acc in ("pld", "rdp"):
            ratio = r[f"expected_ratio_{acc}"]
            best = e[f"best_expected_ratio_{acc}"]
            e[f"best_expected_ratio_{acc}"] = ratio if best is None else min(best, ratio)
            if ratio <= TARGET:
                b = e[f"fewest_bits_{acc}"]
                e[f"fewest_bits_{acc}"] = r["bits"] if b is None else min(b, r["bits"])
    return list(out.values())


def z_check(rows: list[dict], alpha: float = 1e-3) -> dict:
    """Is the realised MSE the expected one? Over the distinct (dealer) points, Σ z² against χ²
    with as many degrees of freedom (z ≈ N(0, 1): the MSE of d ≈ iid errors), at level
    ``alpha``; a noise variance off by 10 % moves each z by ≈ 0.1/√(2/d) = 2.3 at d = 1,024."""
    from scipy.stats import chi2

    zs = [r["z_score"] for r in rows if r["mode"] == "dealer" and r["feasible"]]
    stat = float(sum(z * z for z in zs))
    critical = float(chi2.ppf(1 - alpha, len(zs)))
    return {
        "points": len(zs),
        "mean_z": float(np.mean(zs)),
        "sum_z2": stat,
        "chi2_critical": critical,
        "alpha": alpha,
        "passes": stat <= critical,
    }


def crypto_checks(rows: list[dict]) -> list[dict]:
    """Each simulation point beside the dealer point of the same settings: bit-identical release."""
    dealer = {
        (r["n"], r["d"], r["epsilon"], r["bits"], r["mechanism"], r["tolerated_dropout"]): r
        for r in rows
        if r["mode"] == "dealer"
    }
    out = []
    for r in rows:
        if r["mode"] != "simulation":
            continue
        key = (r["n"], r["d"], r["epsilon"], r["bits"], r["mechanism"], r["tolerated_dropout"])
        d = dealer.get(key)
        out.append(
            {
                "n": r["n"],
                "epsilon": r["epsilon"],
                "bits": r["bits"],
                "mechanism": r["mechanism"],
                "simulation_seconds": r["seconds"],
                "dealer_seconds": d["seconds"] if d else None,
                "degree": r.get("degree"),
                "threshold": r.get("threshold"),
                "ratio_pld": r.get("ratio_pld"),
                "bit_identical_to_dealer": (
                    None
                    if d is None or not r["feasible"]
                    else r["released_sha256"] == d["released_sha256"]
                ),  # fmt: skip
            }
        )
    return out


TICKS = (1, 1.05, 1.1, 1.2, 1.5, 2, 5, 10, 100, 1_000, 10_000)


def plot(rows: list[dict], path: Path) -> None:
    """MSE / central against bits, one panel per (n, d): top row against the central Gaussian
    under PLD (the tight one), bottom row under RDP (the integer events' accountant); lines the
    expected ratio, × the realised one; q = n, dealer rows (the simulation rows are identical)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    panels = sorted({(r["n"], r["d"]) for r in rows if r["mode"] == "dealer"})
    fig, axes = plt.subplots(
        2, len(panels), figsize=(4.6 * len(panels), 7.6), squeeze=False, sharex=True
    )
    colours = {0.5: "tab:blue", 1.0: "tab:orange", 4.0: "tab:green"}
    for col, (n, d) in enumerate(panels):
        for row, acc in enumerate(("pld", "rdp")):
            ax = axes[row][col]
            for eps in EPSILONS:
                for mech, style in (("ddg", "-"), ("skellam", "--")):
                    pts = sorted(
                        (r["bits"], r[f"expected_ratio_{acc}"], r[f"ratio_{acc}"])
                        for r in rows
                        if r["mode"] == "dealer" and r["feasible"] and r["n"] == n
                        and r["d"] == d and r["epsilon"] == eps and r["mechanism"] == mech
                        and r["tolerated_dropout"] == 0.0
                    )  # fmt: skip
                    if not pts:
                        continue
                    b, exp, real = zip(*pts, strict=True)
                    ax.plot(b, exp, style, color=colours[eps], marker="o" if mech == "ddg" else "s",
                            markersize=4, label=f"{mech} ε={eps:g}")  # fmt: skip
                    ax.plot(b, real, "x", color=colours[eps], markersize=5)
            ax.axhline(TARGET, color="k", lw=0.9, ls=":", label="1.05 (target)")
            ax.axhline(1.0, color="grey", lw=0.5)
            ax.set_yscale("log")
            top = max((max(ln.get_ydata()) for ln in ax.lines if len(ln.get_ydata()) > 1),
                      default=2.0)  # fmt: skip
            ax.set_ylim(0.9, max(1.5, 1.3 * top))
            ticks = TICKS if top < 20 else tuple(t for t in TICKS if t == 1 or t >= 2)
            ax.yaxis.set_major_locator(FixedLocator(ticks))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.set_xlim(9, 25)
            ax.set_xticks(range(10, 25, 2))
            ax.grid(alpha=0.3)
            central = "PLD (tight)" if acc == "pld" else "RDP (the events' accountant)"
            ax.set_title(f"n = {n:,}, d = {d:,}: vs central {central}", fontsize=9)
            if row == 1:
                ax.set_xlabel("bits per coordinate")
        axes[0][col].legend(fontsize=6, ncol=2)
    fig.supylabel("MSE / central Gaussian MSE (lines expected, × realised)")
    fig.suptitle("distributed DP mean estimation through secure-sum (q = n: no dropout charged)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="n = 1,000, ε = 1, two bit widths")
    ap.add_argument("--out", default=None, help="JSON path (default: results/distributed_dp.json)")
    ap.add_argument("--replot", action="store_true", help="the summaries and plot from the JSON")
    args = ap.parse_args(argv)
    default = "distributed_dp_quick.json" if args.quick else "distributed_dp.json"
    out = Path(args.out or Path(__file__).parent / "results" / default)
    if args.replot:
        record = json.loads(out.read_text())
        record["fewest_bits"] = fewest_bits(record["points"])
        record["crypto_checks"] = crypto_checks(record["points"])
        record["z_check"] = z_check(record["points"])
        record["papers"] = PAPERS
        out.write_text(json.dumps(record, indent=1) + "\n")
        plot(record["points"], out.with_suffix(".png"))
        return 0
    load = [round(x, 2) for x in os.getloadavg()]
    start = time.perf_counter()
    rows = []
    points = grid(args.quick)
    for i, pt in enumerate(points):
        rows.append(run_point(pt))
        print(f"[{i + 1}/{len(points)} {time.perf_counter() - start:6.0f} s] {fmt(rows[-1])}",
              flush=True)  # fmt: skip
    total = time.perf_counter() - start
    record = {
        "what": "distributed DP mean estimation through secure-sum: ddg / skellam against the "
        "central continuous Gaussian (evaluation only), d = 1,024 (65,536), δ = 1/n², clip 1, "
        "synthetic rows (uniform on [-1, 1]^d, scaled to ℓ2 norm ≤ 1), seed 0, no user lost, "
        "corrupt_fraction 0 (colluders at γ would multiply the expected MSE by "
        "(n − ⌈δn⌉)/(n − ⌈δn⌉ − ⌈γn⌉): ×1.053 at δ = 0, ×1.077 at δ = 0.3, γ = 0.05)",
        "command": "python benchmarks/distributed_dp.py" + (" --quick" if args.quick else ""),
        "crypto": "mode=dealer for the grid (the same ring arithmetic without key agreement); "
        "mode=simulation (X25519, AES, Shamir of secure mode, seeded keys) for the rows with "
        "mode=simulation, whose released mean is compared bit for bit with the dealer run's",
        "target": "expected MSE within 5 % of the central Gaussian's at <= 16 bits (issue 27)",
        "factors": "expected/central_PLD = dropout · accounting · mechanism · inflation · "
        "rounding (module docstring)",
        "total_seconds": round(total, 1),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_before": load,
            "load_after": [round(x, 2) for x in os.getloadavg()],
        },
        "fewest_bits": fewest_bits(rows),
        "crypto_checks": crypto_checks(rows),
        "z_check": z_check(rows),
        "papers": PAPERS,
        "points": rows,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    plot(rows, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')} ({total:.0f} s)")
    for e in record["fewest_bits"]:
        print(json.dumps(e))
    for c in record["crypto_checks"]:
        print(json.dumps(c))
    return 0


if __name__ == "__main__":
    sys.exit(main())
