"""Planning ``pattern-count``: the data (synthetic, or a file with declared domains) split into
the parties' column blocks, the requested patterns and the budget — before any actor starts."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pyarrow as pa

from rayfed import rng
from rayfed.data import even_groups, load_table, party_names, require_clean, sort_by_key, vertical
from rayfed.errors import ConfigError, DataError
from rayfed.ldp.patterns import (
    Domain,
    bias,
    encode_values,
    one_hot,
    out_of_domain,
    predicted_variance,
    product_sums,
    public_sample,
    rr_measurement,
)
from rayfed.privacy import Budget, DataDomain, Field, Neighbours, OneHot, PrivacyDeclaration
from rayfed.protocols.base import Plan
from rayfed.protocols.pattern_count.config import PatternCountConfig
from rayfed.protocols.pattern_count.params import Evaluation, Params

MAX_ONEHOT_BYTES = 4 << 30
RELATION = Neighbours("replace_one", "user's value", at_one_party=True)
STATEMENT = (
    "DP in VFL (Def. 1.2): one user's value changes at one party; each party's messages depend "
    "only on its own data, so scopes (parties) compose in parallel"
)


def data_bytes(cfg: PatternCountConfig) -> int:
    """The synthetic table (8 bytes a value) and each party's one-hot matrix (a byte a bit)."""
    if cfg.data.path is not None:
        return 0
    return cfg.users * cfg.parties * (8 + 2 * cfg.domain_size)


def plan(cfg: PatternCountConfig, seed: int) -> Plan:
    table, groups, domains, key = _source(cfg, seed)
    partitions = vertical(table, groups, key)
    require_clean(table, [c for cols in groups.values() for c in cols])
    order = list(groups)
    _check_memory(groups, domains, table.num_rows)
    outside = _outside(cfg, partitions, groups, domains, order)
    labels = [_domain_labels(groups[p], domains) for p in order]
    patterns = _resolve_patterns(cfg, labels)
    parties = {
        p: (
            partitions[p],
            {"columns": groups[p], "domains": {c: domains[c] for c in groups[p]}, "size": len(lab)},
        )
        for p, lab in zip(order, labels, strict=True)
    }
    sent = int(public_sample(seed, table.num_rows, cfg.sample_rate).sum())
    eps_prime = bias(cfg.epsilon, cfg.calibration)
    if not 0.5 + eps_prime < 1:  # randomized response would keep every bit: no noise at all
        largest = "below 8 (ε' = ε/16 < 1/2)" if cfg.calibration == "paper" else "at most about 74"
        raise ConfigError(
            "epsilon",
            f"ε = {cfg.epsilon:g} under calibration={cfg.calibration} makes randomized response "
            f"keep each bit with probability 1/2 + ε' = {0.5 + eps_prime:.17g}: no noise",
            f"an epsilon {largest}",
        )
    releases = {
        p: rr_measurement(
            f"{p}: randomized response on one-hot values", eps_prime, len(lab), RELATION
        )
        for p, lab in zip(order, labels, strict=True)
    }
    evaluation = None
    if cfg.evaluate or (cfg.evaluate is None and cfg.data.path is None):
        evaluation = _evaluation(cfg, eps_prime, partitions, groups, domains, labels, patterns)
    return Plan(
        privacy=PrivacyDeclaration(
            budget=Budget(cfg.epsilon, 0.0),
            accountant="pure",
            relation=RELATION,
            composition="parallel",
            statement=STATEMENT,
            measurements=tuple(releases.values()),
            data=DataDomain(
                tuple(Field((c,), OneHot(_size(domains[c]))) for p in order for c in groups[p]),
                key=key,
                partition="vertical",
            ),
        ),
        parties=parties,
        rounds=1,
        evaluation=evaluation,
        params=Params(
            order=order,
            labels=labels,
            patterns=patterns,
            users=table.num_rows,
            sent=sent,
            outside=outside,
            eps_prime=eps_prime,
            releases=releases,
        ),
    )


def synthetic_table(
    users: int, parties: int, domain_size: int, correlation: float, seed: int
) -> pa.Table:
    """Spec §4.1: x_0 uniform on {0..M}; x_j copies x_0 with probability ``correlation``, else uniform."""
    gen = rng.stream(seed, "synthetic", 0, "pattern-count")
    base = gen.integers(0, domain_size, users)
    cols = {"user_id": np.arange(users, dtype=np.int64), "x0": base}
    for j in range(1, parties):
        copy = gen.random(users) < correlation
        cols[f"x{j}"] = np.where(copy, base, gen.integers(0, domain_size, users))
    return pa.table(cols)


def _source(cfg: PatternCountConfig, seed: int):
    """(table, party -> columns, column -> declared domain, key column)."""
    if cfg.data.path is None:
        table = synthetic_table(cfg.users, cfg.parties, cfg.domain_size, cfg.correlation, seed)
        domains: dict[str, Domain] = {f"x{j}": cfg.domain_size for j in range(cfg.parties)}
        groups = {p: [f"x{j}"] for j, p in enumerate(party_names(cfg.parties))}
        return table, groups, domains, "user_id"
    table = sort_by_key(load_table(cfg.data.path, cfg.data.format), cfg.data.key)
    if cfg.data.columns is not None:
        groups = dict(cfg.data.columns)
    elif cfg.domains:
        groups = even_groups(list(cfg.domains), cfg.parties)
    else:
        raise ConfigError(
            "domains",
            "a data file needs the domain of every column it counts",
            "e.g. --set domains.city=[a,b,c] --set domains.age_band=5",
        )
    domains = dict(cfg.domains or {})
    for party, cols in groups.items():
        for col in cols:
            if col not in domains:
                raise ConfigError(
                    f"domains.{col}",
                    f"column {col!r} of party {party!r} has no declared domain",
                    "a size n (values 0..n-1) or the list of its values",
                )
    return table, groups, domains, cfg.data.key


def _outside(cfg, partitions, groups, domains, order) -> dict[str, int]:
    """Values outside their declared domain, per column: an error unless out_of_domain=zero."""
    outside = {
        c: n for p in order for c, n in out_of_domain(partitions[p], groups[p], domains).items()
    }
    if outside and cfg.out_of_domain == "error":
        col, n = next(iter(outside.items()))
        raise DataError(
            f"domains.{col}",
            f"{n} value(s) of column {col!r} are outside its declared domain",
            "declare them in domains, or set out_of_domain=zero to encode them as all-zero",
        )
    return outside


def _evaluation(cfg, eps_prime, partitions, groups, domains, labels, patterns) -> Evaluation:
    """The true counts and the estimator's predicted variance, from the raw data (not private)."""
    order = list(groups)
    onehots = [
        one_hot(encode_values(partitions[p], groups[p], domains), len(lab))
        for p, lab in zip(order, labels, strict=True)
    ]
    return Evaluation(
        true=product_sums(onehots, 0.0, 1.0, patterns),
        variance=predicted_variance(onehots, eps_prime, patterns, cfg.sample_rate),
    )


def _size(domain: Domain) -> int:
    return domain if isinstance(domain, int) else len(domain)


def _domain_labels(columns: list[str], domains: dict[str, Domain]) -> list[str]:
    """Label of every index of a party's value space (mixed radix over its columns)."""
    per_col = [
        [str(v) for v in (range(d) if isinstance(d, int) else d)]
        for d in (domains[c] for c in columns)
    ]
    return ["|".join(combo) for combo in itertools.product(*per_col)]


def _resolve_patterns(cfg: PatternCountConfig, labels: list[list[str]]) -> np.ndarray | None:
    cells = math.prod(len(lab) for lab in labels)
    if cfg.patterns == "all":
        if cells > cfg.max_patterns:
            raise ConfigError(
                "patterns",
                f"'all' means {cells:,} patterns, above max_patterns={cfg.max_patterns:,}",
                "a list of patterns, or raise max_patterns",
            )
        return None
    if len(cfg.patterns) > cfg.max_patterns:
        raise ConfigError(
            "patterns",
            f"{len(cfg.patterns)} patterns requested, above max_patterns={cfg.max_patterns}",
        )
    out = np.zeros((len(cfg.patterns), len(labels)), dtype=np.int64)
    for k, pattern in enumerate(cfg.patterns):
        if len(pattern) != len(labels):
            raise ConfigError(
                f"patterns[{k}]",
                f"has {len(pattern)} values for {len(labels)} parties",
                "one value per party",
            )
        for j, value in enumerate(pattern):
            out[k, j] = _pattern_index(value, labels[j], k, j)
    return out


def _pattern_index(value, labels: list[str], k: int, j: int) -> int:
    if isinstance(value, int) and 0 <= value < len(labels):
        return value
    if str(value) in labels:
        return labels.index(str(value))
    raise ConfigError(
        f"patterns[{k}][{j}]",
        f"{value!r} is not in party {j}'s domain",
        labels if len(labels) <= 20 else f"indices 0..{len(labels) - 1}",
    )


def _check_memory(groups: dict[str, list[str]], domains: dict[str, Domain], users: int) -> None:
    """Each party materialises a (values x users) one-hot matrix: refuse one above 4 GiB."""
    for party, cols in groups.items():
        size = math.prod(d if isinstance(d, int) else len(d) for d in (domains[c] for c in cols))
        if size * users > MAX_ONEHOT_BYTES:
            raise ConfigError(
                f"data.columns.{party}",
                f"party {party!r} has {size:,} joint values x {users:,} users: "
                f"its one-hot encoding needs {size * users / 2**30:.1f} GiB",
                f"at most {MAX_ONEHOT_BYTES >> 30} GiB: fewer or coarser columns per party",
            )
