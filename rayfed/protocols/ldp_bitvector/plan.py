"""Planning ``ldp-bitvector``: the records (the bundled digits, or a file with declared bounds),
the shared anchors, the custodians' partitions and the budget — before any actor starts."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from rayfed import rng
from rayfed.data import even_groups, horizontal, load_table, require_clean, sort_by_key, vertical
from rayfed.data.scaling import features_of
from rayfed.errors import ConfigError, DataError
from rayfed.ldp import bitvector as bv
from rayfed.privacy import (
    Budget,
    Clipped,
    CodeResponse,
    DataDomain,
    Field,
    Interval,
    Measurement,
    Neighbours,
    PrivacyDeclaration,
    enforce,
)
from rayfed.protocols.base import Plan, adjusted
from rayfed.protocols.ldp_bitvector.config import BASELINES, LdpBitvectorConfig
from rayfed.protocols.ldp_bitvector.params import Clustering, Evaluation, Params
from rayfed.protocols.ldp_bitvector.steps import MAX_ATTRIBUTES
from rayfed.sizing import machine_memory

TRUSTED = "trusted"
DECOMPOSITION_LIMIT = 1000
#: the share of a machine's memory left to actors: Ray's object store takes 30 % by default
ACTOR_MEMORY_SHARE = 0.7
DIGITS_SHAPE = (1797, 64)  # scikit-learn's bundled digits

Parties = dict[str, tuple[pa.Table, dict]]
RELATION = Neighbours("replace_one", "record")
#: the decomposition protects Bob's part of a record only: Alice's values are hers, in the clear
BOB_RELATION = Neighbours("replace_one", "record's values at Bob")


def data_bytes(cfg: LdpBitvectorConfig) -> int:
    """The bundled digits (1,797 x 64): one attribute's s bits per record at a time, every
    packed code, and the n x n float32 distance matrix — with Algorithm 1 also one attribute's
    matrix and its flags (a file's n is checked in plan)."""
    if cfg.data.path is not None:
        return 0
    n, d = DIGITS_SHAPE
    n = min(n, cfg.records or n)
    return n * cfg.bits * 2 + n * d * cfg.bits // 8 + _matrix_bytes(cfg, n)


def _matrix_bytes(cfg: LdpBitvectorConfig, n: int) -> int:
    """The collector's n²-sized memory: the float32 distance matrix, or Algorithm 1's working set."""
    return (bv.CONSISTENCE_BYTES_PER_PAIR if cfg.consistence else 4) * n * n


def plan(cfg: LdpBitvectorConfig, seed: int) -> Plan:
    table, features, label, bounds, clipped = _load(cfg)
    n, d = table.num_rows, len(features)
    _check_size(cfg, n, d)
    gen = rng.stream(seed, "anchors", 0, "custodians")
    r = bv.anchors(gen, d, cfg.bits, cfg.low, cfg.high, cfg.half_width)
    k_max = max(bv.max_differing_bits(r[j], cfg.half_width, cfg.low, cfg.high) for j in range(d))
    common = {"bounds": bounds, "low": cfg.low, "high": cfg.high, "k_max": k_max}
    parties, order, pair = _custodians(cfg, table, features, r, common, seed)
    private = cfg.method not in BASELINES and cfg.encoding == "dpbv"
    decomposition = cfg.partition == "vertical-decomposition" and cfg.encoding != "exact"
    relation = BOB_RELATION if decomposition else RELATION
    releases = _releases(cfg, parties, order, n, relation) if private else {}
    record_eps = _record_bits(cfg, releases) * cfg.epsilon
    protected = parties[order[-1]][1]["columns"] if decomposition else features
    return Plan(
        privacy=PrivacyDeclaration(
            budget=Budget(record_eps, 0.0) if private else Budget.none(),
            accountant="pure",
            relation=relation,
            composition="parallel" if cfg.partition == "horizontal" else "sequential",
            statement=_statement(cfg, releases, d, k_max, pair.get("pair_k_max"), record_eps),
            measurements=tuple(releases.values()),
            data=DataDomain(
                tuple(Field((c,), Interval(*map(float, bounds))) for c in protected),
                key="record",
            ),
        ),
        parties=parties,
        rounds=1,
        adjusted=_records_adjusted(cfg, n),
        evaluation=Evaluation(labels=table.column(label).to_numpy()) if label else None,
        params=Params(
            order=order,
            records=n,
            dims=d,
            k_max=k_max,
            mu=bv.anchor_range(cfg.low, cfg.high, cfg.half_width),
            attributes={p: len(meta["columns"]) for p, (_, meta) in parties.items()},
            consistence=cfg.consistence_radius * 2 * cfg.half_width if cfg.consistence else None,
            decomposition=decomposition,
            pair_mu=pair.get("pair_mu"),
            pair_k_max=pair.get("pair_k_max"),
            clustering=_clustering(cfg),
            releases=releases,
            clipped=clipped,
        ),
    )


def _releases(
    cfg: LdpBitvectorConfig, parties: Parties, order: list[str], n: int, relation: Neighbours
) -> dict[str, Measurement]:
    """Every encoding custodian's release: per-bit RR on the BV codes of its records. Its Δ₀
    (bits) follows from the codes' domain: replacing a record moves each of its codes within
    the bits its anchors let two values of the range differ in (``Codes``) — a custodian's
    attributes on [L, U]; Bob's u and v of the n − 1 pairs the record enters, on their range."""
    rr = CodeResponse(bv.keep_probability(cfg.epsilon))
    if cfg.partition == "vertical-decomposition":
        bob = order[-1]
        meta = parties[bob][1]
        codes = bv.Codes.of(
            meta["pair_anchors"],
            meta["pair_t"],
            *meta["pair_range"],
            copies=2 * (n - 1),
            what="u and v of the record's pairs",
        )
        _check_informative(codes, cfg, bob)
        return {
            bob: Measurement("pair codes of u and v (randomized response)", rr, codes, relation)
        }
    out = {}
    for p in order:
        meta = parties[p][1]
        codes = bv.Codes.of(meta["anchors"], cfg.half_width, cfg.low, cfg.high, what="attributes")
        _check_informative(codes, cfg, p)
        label = f"{p}: per-bit randomized response on its BV codes"
        out[p] = Measurement(label, rr, codes, relation)
    return out


def _check_informative(codes: bv.Codes, cfg: LdpBitvectorConfig, party: str) -> None:
    """ConfigError naming ``half_width`` when no bit of the party's codes can tell two values of
    the range apart (every record's codes alike: nothing to release, noisy or not)."""
    if not any(codes.reach):
        raise ConfigError(
            "half_width",
            f"t = {cfg.half_width:g}: none of the {codes.bits} anchors of {party}'s codes lies "
            f"where two values of [{codes.low:g}, {codes.high:g}] get different bits, so the "
            "codes carry nothing about the data (a bit separates values only for anchors "
            "within t of the range's ends: about 2(U − L)/(U − L + 2t) of them)",
            "half_width near (U − L)/2, the paper's t, or more bits",
        )


def _record_bits(cfg: LdpBitvectorConfig, releases: dict[str, Measurement]) -> int:
    """The bits of a record's codes one replacement can change, each ε-LDP: the worst
    custodian's Δ₀ where they hold disjoint records (horizontal), the sum over the custodians
    a record's attributes span (vertical; Bob's alone in the decomposition)."""
    bits = [int(m.sensitivity) for m in releases.values()]
    if not bits:
        return 0
    return max(bits) if cfg.partition == "horizontal" else sum(bits)


def _clustering(cfg: LdpBitvectorConfig) -> Clustering:
    return Clustering(
        method=cfg.method,
        k=cfg.k,
        restarts=cfg.restarts,
        dbscan_eps=cfg.dbscan_eps,
        min_samples=cfg.min_samples,
        linkage=cfg.linkage,
    )


def _statement(
    cfg: LdpBitvectorConfig,
    releases: dict[str, Measurement],
    d: int,
    k_max: int,
    pair_k_max: int | None,
    record_eps: float,
) -> str:
    """The ledger's statement: the true per-record guarantee, or why the run is not private."""
    if cfg.method in BASELINES:
        return "not private: a baseline on the raw data"
    if cfg.encoding != "dpbv":
        return f"not private: {cfg.encoding} distances without noise"
    if cfg.partition == "vertical-decomposition":
        (codes,) = (m.domain for m in releases.values())
        return (
            f"decomposition: Alice is the analyst and uses her attributes exactly (sent in the "
            f"clear, not protected); each of Bob's records enters {len(codes.reach) // 2} pairs "
            f"x 2 codes x up to {pair_k_max} differing bits: pure {record_eps:g}-LDP"
        )
    return (
        f"pure ε-LDP per record: {d} attributes, their codes differing in at most "
        f"{_record_bits(cfg, releases)} bits (up to {k_max} per attribute) x "
        f"ε={cfg.epsilon:g} per bit = "
        f"{record_eps:g} (the paper's (ε, δ) of Thm 4 does not hold)"
        + (
            "; custodians hold disjoint records, so they compose in parallel"
            if cfg.partition == "horizontal"
            else "; a record's attributes span the custodians, which compose"
        )
    )


def _check_size(cfg: LdpBitvectorConfig, n: int, d: int) -> None:
    """Refuse what the coin keys, the n x n matrix, Algorithm 1's memory or k cannot take."""
    if d >= MAX_ATTRIBUTES:
        raise DataError(
            "data.columns", f"{d} attributes, at most {MAX_ATTRIBUTES - 1}", "fewer columns"
        )
    if n > cfg.max_points:
        raise ConfigError(
            "max_points",
            f"{n:,} records need a {n * n * 4 / 2**30:.1f} GiB distance matrix; the limit is "
            f"{cfg.max_points:,} records ({cfg.max_points**2 * 4 / 2**30:.1f} GiB)",
            "a sample of the records, or raise max_points",
        )
    have = int(machine_memory() * ACTOR_MEMORY_SHARE)
    if cfg.consistence and have and _matrix_bytes(cfg, n) > have:
        raise ConfigError(
            "consistence",
            f"Algorithm 1 on {n:,} records needs about {_matrix_bytes(cfg, n) / 2**30:.1f} GiB "
            f"on the collector ({bv.CONSISTENCE_BYTES_PER_PAIR} bytes a record pair: the distance "
            f"matrix, one attribute's matrix and its flags) but actors on this machine (the one "
            f"planning the run) get about {have / 2**30:.1f} GiB ({ACTOR_MEMORY_SHARE:.0%} of its "
            "memory; Ray keeps the rest for its object store)",
            "a sample of the records, a larger machine, or consistence=false",
        )
    if cfg.k > n:
        raise ConfigError("k", f"{cfg.k} clusters for {n} records")


# --- the custodians --------------------------------------------------------------------------------
def _custodians(
    cfg: LdpBitvectorConfig,
    table: pa.Table,
    features: list[str],
    r: np.ndarray,
    common: dict,
    seed: int,
) -> tuple[Parties, list[str], dict]:
    """(party -> (partition, meta), their order, the decomposition's pair parameters or {})."""
    if cfg.method in BASELINES:
        return (
            {TRUSTED: (table.select(features + ["record"]), {"columns": features})},
            [TRUSTED],
            {},
        )
    if cfg.partition == "vertical-decomposition" and cfg.encoding != "exact":
        return _decomposition_parties(cfg, table, features, common, seed)
    if cfg.partition == "horizontal":
        blocks = horizontal(table.select(features + ["record"]), cfg.parties)
        d = len(features)
        parties = {
            p: (t, {**common, "columns": features, "attributes": list(range(d)), "anchors": r})
            for p, t in blocks.items()
        }
        return parties, list(blocks), {}
    groups = dict(cfg.data.columns) if cfg.data.columns else even_groups(features, cfg.parties)
    parts = vertical(table, groups, "record")
    index = {c: j for j, c in enumerate(features)}
    parties = {
        p: (
            parts[p],
            {
                **common,
                "columns": cols,
                "attributes": [index[c] for c in cols],
                "anchors": r[[index[c] for c in cols]],
            },
        )
        for p, cols in groups.items()
    }
    return parties, list(groups), {}


def _decomposition_parties(cfg, table, features, common, seed) -> tuple[Parties, list[str], dict]:
    """Alice (first column group: her exact part) and Bob (second group: pair codes of u and v on
    [0, R], R = 2·d_B·U², with half-width t = R/2 so every |u - v| is in local view)."""
    groups = dict(cfg.data.columns) if cfg.data.columns else even_groups(features, 2)
    if len(groups) != 2:
        raise ConfigError("parties", "the decomposition needs exactly two custodians (Alice, Bob)")
    n = table.num_rows
    if n > DECOMPOSITION_LIMIT:
        raise ConfigError(
            "partition",
            f"the decomposition encodes every record pair: {n:,} records is above "
            f"{DECOMPOSITION_LIMIT:,} ({n * (n - 1) // 2:,} pairs)",
            "a sample, or partition=vertical",
        )
    (alice, alice_cols), (bob, bob_cols) = groups.items()
    # u and v of every pair lie in [lo, top] (lo < 0 only when L < 0 < U: v = 2a·b can be
    # negative); t covers the whole range, so |u - v| is in local view
    lo, top = bv.pair_range(cfg.low, cfg.high, len(bob_cols))
    t = (top - lo) / 2
    anchors = bv.anchors(rng.stream(seed, "anchors", 1, "pairs"), 1, cfg.bits, lo, top, t)[0]
    pair = {
        "pair_t": t,
        "pair_range": (lo, top),
        "pair_mu": bv.anchor_range(lo, top, t),
        "pair_k_max": bv.max_differing_bits(anchors, t, lo, top),
    }
    parts = vertical(table, groups, "record")
    parties = {
        alice: (parts[alice], {**common, "columns": alice_cols}),
        bob: (parts[bob], {**common, **pair, "columns": bob_cols, "pair_anchors": anchors}),
    }
    return parties, [alice, bob], pair


# --- the data --------------------------------------------------------------------------------------
def _load(
    cfg: LdpBitvectorConfig,
) -> tuple[pa.Table, list[str], str | None, list[float], Clipped]:
    """(table with a 'record' column, feature columns, label column, declared bounds, what the
    bounds clipped). A feature value outside the bounds is refused (a DataError naming its
    column, ``data.<column>``), or clipped to them and counted per column (``out_of_domain``)."""
    if cfg.data.path is None:
        table, features, label, bounds = _digits(cfg)
    else:
        table, features, label, bounds = _from_file(cfg)
    domain = Interval(float(bounds[0]), float(bounds[1]), len(features))
    x, clipped = enforce(
        features_of(table, features),
        domain,
        cfg.out_of_domain,
        field="data",
        option="out_of_domain",
        columns=features,
        widen="widen bounds",
    )
    if clipped.count:
        for j, c in enumerate(features):
            i = table.schema.get_field_index(c)
            table = table.set_column(i, c, pa.array(x[:, j]))
    return (
        table.append_column("record", pa.array(np.arange(table.num_rows, dtype=np.int64))),
        features,
        label,
        bounds,
        clipped,
    )


def _records_adjusted(cfg: LdpBitvectorConfig, n: int) -> list[dict]:
    """``records`` above the bundled data's size: the run uses them all, and says so."""
    if cfg.data.path is not None or cfg.records is None or cfg.records == n:
        return []
    return [adjusted("records", cfg.records, n, f"the bundled {cfg.dataset} hold {n:,} records")]


def _digits(cfg: LdpBitvectorConfig) -> tuple[pa.Table, list[str], str, list[float]]:
    """scikit-learn's bundled digits (its first ``records`` rows), labelled by the digit."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    rows = slice(0, cfg.records)
    features = [f"pixel{i}" for i in range(digits.data.shape[1])]
    cols = {name: digits.data[rows, i] for i, name in enumerate(features)}
    cols["digit"] = digits.target[rows]
    return pa.table(cols), features, "digit", cfg.bounds or [0.0, 16.0]


def _from_file(cfg: LdpBitvectorConfig) -> tuple[pa.Table, list[str], str | None, list[float]]:
    """A data file's numeric features (data.columns, or every column but the label and key)."""
    table = sort_by_key(load_table(cfg.data.path, cfg.data.format), cfg.data.key)
    label = cfg.label
    if label is not None and label not in table.column_names:
        raise DataError("label", f"column {label!r} is not in the data", table.column_names)
    if cfg.data.columns is not None:
        features = [c for cols in cfg.data.columns.values() for c in cols]
    else:
        skip = {label, cfg.data.key}
        features = [c for c in table.column_names if c not in skip]
    for c in features:
        if c not in table.column_names:
            raise DataError("data.columns", f"column {c!r} is not in the data", table.column_names)
        if not (
            pa.types.is_integer(table.column(c).type) or pa.types.is_floating(table.column(c).type)
        ):
            raise DataError(
                "data.columns", f"column {c!r} is not numeric", "numeric feature columns"
            )
    require_clean(table, features, numeric=True)
    if cfg.bounds is None:
        raise ConfigError(
            "bounds",
            "a data file needs the declared [low, high] of its features",
            "e.g. --set 'bounds=[0, 16]'",
        )
    return table, features, label, list(cfg.bounds)
