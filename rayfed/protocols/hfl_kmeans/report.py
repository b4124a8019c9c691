"""What an ``hfl-kmeans`` run reports: the centroids table, metrics, headline and privacy notes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from rayfed import rng
from rayfed.clustering import dplloyd
from rayfed.clustering.constrained import empty_clusters, silhouette, wcss
from rayfed.data.scaling import from_unit
from rayfed.protocols.base import Outcome
from rayfed.protocols.hfl_kmeans.config import HflKmeansConfig
from rayfed.protocols.hfl_kmeans.params import (
    Evaluation,
    Params,
    Setup,
    malicious_coalition,
    sum_params,
)

MASKING = {
    "shared-seed": "uploads and aggregates are one-time-padded in Z_2^{b} with pads every "
    "client derives from the group key: the server sees only uniform words; the server "
    "colluding with any one client unmasks every upload (all clients know all pads)",
    "none": "masking=none: NOT secure, the server sees every client's upload and the "
    "aggregate (an insecure baseline)",
}
RING = {
    "shared-seed": "ring: the first client pads the running sum with a random mask; each client "
    "sees only a padded partial sum, and the release is the noisy total — but a client's two "
    "ring neighbours together learn its upload (values plus noise)",
    "none": "ring with masking=none: NOT secure, every client sees the running sum",
}


def pairwise_note(cfg: HflKmeansConfig, setup: Setup) -> str:
    """masking=pairwise, from what runs: the one secure sum over the M clients (SecAgg on the
    complete graph, threshold t and quorum M of :func:`~.params.sum_params`), no partial sums."""
    m = setup.clients
    t = sum_params(m, setup.honest, setup.threat_model).threshold
    head = (
        f"masking=pairwise: every client's upload goes through the one secure sum over the M = {m} "
        f"clients (SecAgg pairwise masks, complete graph, Shamir threshold t = {t}, the "
        "coordinator relaying keys, shares and masked uploads); there are no partial sums, and a "
        "client lost at any phase ends the run before the coordinator asks for an unmask. "
    )
    if cfg.topology == "ring":
        what = "the exact aggregate" if cfg.noise == "none" else "the released noisy sum"
        seen = (
            f"The coordinator learns each iteration's sum, {what}, which every client gets; "
            f"colluding with t = {t} clients it can unmask one client's upload (its values with "
            "only that client's own noise"
            + (f", a 1/{setup.honest} share" if setup.honest is not None else "")
            + ")"
        )
        if setup.honest is not None and setup.honest >= 2:
            seen += f": t > M − h = {m - setup.honest}, the coalition the split noise's ε covers"
    else:
        seen = (
            "Under the masks the uploads carry the thesis's shared-seed pads, so the coordinator "
            "learns only the padded aggregate; colluding with one client it learns the aggregate "
            f"before its own noise (not DP), and with t = {t} clients one client's upload"
        )
    if setup.threat_model == "malicious":
        server = (
            ". Against a malicious server (threat_model=malicious: the consistency round, signed "
            f"keys): it isolates an upload only with 2t <= M - 1 + c, so t = {t} holds against up "
            f"to c = {malicious_coalition(m)} colluding clients"
        )
    else:
        server = (
            ". Against a semi-honest server (it follows the protocol): there is no consistency "
            "round, so a malicious server that lies about who dropped is not covered "
            "(threat_model=malicious)"
        )
    return head + seen + server


def notes(cfg: HflKmeansConfig, setup: Setup) -> list[str]:
    if cfg.masking == "pairwise":
        masking = pairwise_note(cfg, setup)
    else:
        masking = (RING if cfg.topology == "ring" else MASKING)[cfg.masking]
    out = [
        masking.replace("{b}", str(setup.ring_bits)),
        f"N = {setup.n} is a public input of the run, as the thesis treats it (spec §1.1, A3): "
        "t_max, c_min, c_max and ε^(m) derive from it, and the guarantee does not protect the "
        "number of rows (the clients do not send their row counts). Under add/remove "
        "neighbours N itself discloses whether a point is present: what the noise protects is "
        "a point's value, and the ε holds for the parameters planned from this N (a neighbour "
        "with one point more or less is compared under the same t_max, sizes and noise)",
    ]
    if cfg.noise == "none":
        return [*out, "noise=none: not private; the clients see exact aggregates"]
    sampler = (
        "sampled by the clients' MPC from κ-bit coins (realised parameter and truncation in the "
        "ledger's ε and δ)"
        if setup.joint
        else "drawn with numpy's geometric sampler, which computes in floating point — not an "
        "exact sampler"
    )
    out.append(
        "noise: discrete Laplace on the 2^-{f} grid (integer noise, so Theorem 7.2.1's "
        f"quantisation argument is not needed; {sampler})".replace("{f}", str(setup.frac_bits))
    )
    if cfg.assignment == "constrained":
        out.append(
            "size-constrained assignment: one added or removed point can re-route up to k - 1 "
            "other points between clusters (an augmenting path of the min-cost flow), which the "
            "thesis's analysis (§6.2.1, §6.3.1) does not count; the corrected sensitivities do: "
            "sums (2k - 1)·d·B at E = 1, counts E, AMN centroids k - 1 replacements and one "
            "addition. The bound assumes the flow's optimum is unique up to exchanging equal "
            "points. The flow's costs are squared distances to the centroids shifted by public "
            "offsets (i + 1)·2^-16·u (u ∝ (√2, √3, √5, …)), in integers as fine as the "
            "solver's int64 range allows: coinciding centroids no longer tie every point, and "
            "centroid truncation (which makes them coincide often) is refused. An exact tie of "
            "the integer costs — distinct points re-routed at zero total cost, which needs an "
            "exact linear relation between the points and the noisy centroids to within the "
            "rounding — is not excluded; there, the solver's choice is outside the bound"
        )
        if cfg.aggregation == "nma" and setup.claimed_epsilon is None:
            e = setup.contribution
            factor = dplloyd.sums_sensitivity(cfg.assignment, setup.k, e) / e
            out.append(
                f"NMA: at the true ε the size bound costs {factor:g} times the sums' noise of "
                "one point's own clusters; on S1 and Iris assignment=unconstrained gave 1.9-3.6x "
                "lower WCSS at the same ε, measured at equal iteration counts before issue 30 "
                "(iterations=auto now runs fewer constrained iterations; docs/protocols/"
                "hfl-kmeans.md)"
            )
    if setup.claimed_epsilon is not None:
        true_eps = setup.t_max * setup.epsilon_per_iteration
        moved = ", ".join(
            f"{key} {thesis:.6g} (true {true:,})"
            for key, (thesis, true) in setup.sensitivity.items()
        )
        out.append(
            f"sensitivity=thesis: noise calibrated to the thesis's Δ₁ in grid units — {moved}: "
            f"the thesis claims ε = {setup.claimed_epsilon:g}, the noise buys "
            f"ε = {true_eps:.4g} (ledger)"
        )
    if setup.joint:
        blocks = setup.noise
        out.append(
            f"ring, MPC noise (thesis §7.3.2): the {setup.clients} clients sample one discrete "
            "Laplace noise per coordinate in additive shares (each G = Σ_j 2^j c_j from J = "
            f"{', '.join(str(b.sampler.digits) for b in blocks)} coins [U < A_j] per block, U "
            "the XOR of "
            f"every client's {blocks[0].sampler.kappa} random bits), so only Σ values + DLap is "
            "revealed: central noise, DP against any coalition of up to M − 1 clients. It "
            "assumes the dealer of the Beaver triples and daBits is honest and colludes with no "
            "client and not with the driver (with the clients' opening shares, which the driver "
            "relays, it could unmask the coins). The coins' probabilities are A_j/2^κ, so the "
            "ledger charges ε = a'·Δ for the realised a' ≈ a (computed exactly, rounded up), "
            "and δ for truncating G at J digits"
        )
    elif cfg.topology == "ring" and setup.honest is None:
        out.append(
            f"ring: each of the {setup.clients} clients adds full noise for its own rows, so "
            "the released sum carries M times the central noise variance"
        )
    elif cfg.topology == "ring":
        out.append(
            f"ring, split noise (thesis §7.3.3): each of the {setup.clients} clients adds a "
            f"1/{setup.honest} share of one discrete Laplace noise, so the release carries "
            f"{setup.clients}/{setup.honest} times the central noise variance and is ε-DP "
            f"against any coalition of up to M − h = {setup.clients - setup.honest} clients "
            "(they know their own shares; the others' add up to at least the full noise)"
        )
    return out


def outcome(
    cfg: HflKmeansConfig,
    params: Params,
    setup: Setup,
    centers: np.ndarray,
    seconds: float,
    evaluation: Evaluation | None,
) -> Outcome:
    data_centers = from_unit(centers, params.lo, params.hi)
    table = pa.table(
        {"cluster": np.arange(len(centers))}
        | {c: data_centers[:, j] for j, c in enumerate(params.features)}
    )
    metrics = _metrics(cfg, setup, seconds)
    # what entering the declared bounds clipped, per feature column
    metrics["clipped"] = {c.field.removeprefix("bounds."): c.to_dict() for c in params.clipped}
    headline = (
        f"{cfg.aggregation.upper()} {cfg.assignment}, {setup.n:,} points over "
        f"{setup.clients} clients, k = {setup.k}, t_max = {setup.t_max}"
    )
    clips = [c.statement() for c in params.clipped if c.count]
    if clips:
        headline += "; " + ", ".join(clips)
    if evaluation is not None:
        x = evaluation.x
        score, labels = wcss(x, centers)
        gen = rng.stream(0, "evaluation", 0, "silhouette")
        sil, used = silhouette(x, labels, gen, cfg.silhouette_points)
        metrics.update(
            wcss=score,
            nicv=score / len(x),
            empty_clusters=empty_clusters(labels, setup.k),
            silhouette=sil,
            silhouette_points=used,
        )
        headline += f"; WCSS {score:.4g}, {metrics['empty_clusters']} empty, silhouette {sil:.3f}"
    return Outcome(tables={"centroids": table}, metrics=metrics, headline=headline)


def _metrics(cfg: HflKmeansConfig, setup: Setup, seconds: float) -> dict[str, Any]:
    b = setup.bounds
    return {
        "aggregation": cfg.aggregation,
        "assignment": cfg.assignment,
        "masking": cfg.masking,
        "topology": cfg.topology,
        "points": setup.n,
        "dims": setup.d,
        "k": setup.k,
        "clients": setup.clients,
        "t_max": setup.t_max,
        "epsilon_m": setup.epsilon_m,
        "c_min": b.c_min,
        "c_max": b.c_max,
        "client_min": b.client_min,
        "client_max": b.client_max,
        **setup.split,
        # in real units, not grid units
        "noise_scales": {blk.key: blk.scale / setup.scale for blk in setup.noise},
        "upload_bytes": setup.length * setup.ring_bits // 8,
        "ms_per_iteration": 1000.0 * seconds / setup.t_max,
    }
