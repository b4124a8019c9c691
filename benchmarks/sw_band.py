"""Square Wave's band half-width b: SW-EMS W1 against b at fixed ε (spec Q9, the thesis's
Fig. 3.6: b_SW "is among the ones that provide best utility"; very small b is clearly worse).
Writes JSON.

    python benchmarks/sw_band.py            # Beta(5,2), n = 10^5, d = 256, 5 seeds; ~3 minutes

Each seed's users and coins are the same for every b of one ε (``band`` only changes b), so the
curve is compared point against point.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

import rayfed
from rayfed.ldp import square_wave as sw

BANDS = (0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.38)
EPSILONS = (0.5, 1.0, 2.0, 4.0)
SPEC = {0.5: "0.01: 145, 0.05: 19, 0.1: 12, b_SW: 9.0", 2.0: "b_SW: 2.1, 0.01: 9.6"}


def w1(eps: float, band: float | None, seeds: int) -> tuple[float, float]:
    """Mean and standard error of W1 x 1e-3 over ``seeds`` runs."""
    extra = {} if band is None else {"band": band}
    w = np.array(
        [
            rayfed.run(
                "square-wave", backend="local", out_dir=None, epsilon=eps, seed=s, **extra
            ).metrics["wasserstein"]
            for s in range(seeds)
        ]
    )
    return 1e3 * float(w.mean()), 1e3 * float(w.std(ddof=1) / np.sqrt(seeds))


def main(out: str = "benchmarks/results/sw_band.json", seeds: int = 5) -> int:
    rows = []
    for eps in EPSILONS:
        b_sw = sw.band_half_width(eps)
        curve = {b: w1(eps, b, seeds) for b in BANDS}
        at_sw = w1(eps, None, seeds)
        best = min(curve, key=lambda b: curve[b][0])
        rows.append(
            {
                "epsilon": eps,
                "b_sw": b_sw,
                "w1_at_b_sw": at_sw[0],
                "w1_at_b_sw_se": at_sw[1],
                "curve": {str(b): {"w1": m, "se": se} for b, (m, se) in curve.items()},
                "best_b": best,
                "b_sw_within_2se_of_best": bool(
                    at_sw[0] <= curve[best][0] + 2 * np.hypot(at_sw[1], curve[best][1])
                ),
                "spec_reference": SPEC.get(eps),
            }
        )
        print(
            f"ε={eps}: b_SW={b_sw:.3f} W1 {at_sw[0]:.2f} ± {at_sw[1]:.2f}; "
            + ", ".join(f"{b}: {m:.2f}" for b, (m, _) in curve.items()),
            flush=True,
        )
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(
        json.dumps({"n": 100_000, "d": 256, "seeds": seeds, "rows": rows}, indent=1) + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
