"""DP pattern counting in vertical FL — Algorithm 1 and Theorem B.2 of Cohen-Addad, Kacham,
Mirrokni & Zhong, "Differentially Private Vertical Federated Learning Primitives"
(spec: shared/specs/vfl-primitives.md §2.1–2.2, §5 checks 1–7).

v parties hold column blocks of the same m users. Party j maps each user's values to one index
x_j[i] in {0..M_j} (M_j + 1 = the product of its columns' declared domain sizes; a value outside
the declared domain encodes as the all-zero one-hot vector), one-hot encodes it and applies
independent per-bit randomized response, Pr[out = 1] = 1/2 + ε' if the bit is 1 and 1/2 - ε' if 0.
The coordinator debiases every bit, z = (b - 1/2 + ε') / (2ε'), and estimates the count of pattern
ρ as Σ_i Π_j z_j[ρ_j, i] (unbiased: the parties' noise is independent), clipped at 0.

Privacy (DP in VFL, Def. 1.2): one user's value changes at one party, which flips two one-hot bits
of that party's message. Calibration ``paper`` (ε' = ε/16) uses the paper's 8ε'-per-bit bound; the
mechanism's exact loss 2·ln((1+2ε')/(1-2ε')) ≈ ε/2 is what the ledger records and the result
reports. ``exact`` (ε' = tanh(ε/4)/2, flagged, not in the paper) spends exactly ε and has ~4^v
times less variance. The sampled variant (Thm B.2) sends only users of a public sample S (rate p):
still ε-DP (S is data-independent; no amplification is claimed because S is public), with error
growing as sqrt(m/p).

The estimator is computed exactly: expanding Π_j (lo + d·b_j) over subsets T of parties turns
the sum into integer counts of co-occurring bits, so the result does not depend on summation order,
thread count or backend.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from dp_accounting import dp_event

from rayfed import rng
from rayfed.actors.base import Message, StepContext
from rayfed.config import DataConfig, option
from rayfed.data import even_groups, load_table, party_names, require_clean, sort_by_key, vertical
from rayfed.errors import ConfigError, DataError
from rayfed.privacy import Budget, binary_randomized_response, binary_rr_event, check_budget
from rayfed.protocols.base import Outcome, Plan, Protocol, reject_inapplicable

Domain = int | list[str | int]


@dataclass(frozen=True)
class PatternCountConfig:
    """Options of ``rayfed run pattern-count``."""

    epsilon: float = option(1.0, "privacy budget of each party (pure ε-DP in VFL)", above=0)
    calibration: Literal["paper", "exact"] = option(
        "paper",
        "paper: ε'=ε/16 as Alg. 1 (true loss ≈ ε/2); exact: ε'=tanh(ε/4)/2, spends exactly ε (not in the paper)",
    )
    sample_rate: float = option(
        1.0, "p of the low-communication variant (Thm B.2); 1 sends every user", above=0, at_most=1
    )
    patterns: str | list[list[str | int]] = option(
        "all", "'all', or a list of patterns, each one value per party (index or declared label)"
    )
    max_patterns: int = option(
        1_000_000, "refuse to estimate more patterns than this (memory: 8 bytes each)", at_least=1
    )
    parties: int = option(
        2, "number of parties v (synthetic data, or to deal a file's columns evenly)", at_least=1
    )
    users: int = option(20_000, "synthetic data: number of users m", at_least=1, size=True)
    domain_size: int = option(3, "synthetic data: values per party (M + 1)", at_least=2, size=True)
    correlation: float = option(
        0.5,
        "synthetic data: probability that a party copies party 0's value",
        at_least=0,
        at_most=1,
    )
    domains: dict[str, int | list[str | int]] | None = option(
        None,
        "data file: declared domain per column, a size n (values 0..n-1) or the list of values",
    )
    out_of_domain: Literal["error", "zero"] = option(
        "error",
        "a data value outside its declared domain: error, or encode it as all-zero (spec §2.1)",
    )
    evaluate: bool | None = option(
        None,
        "add true counts and errors (non-private, computed outside the protocol); default: synthetic data only",
    )
    data: DataConfig = field(default_factory=DataConfig, metadata={"help": "data source"})

    def validate(self) -> None:
        check_budget(self.epsilon, 0.0)
        if self.calibration == "paper" and not (
            self.epsilon < 8 and exact_loss(self.epsilon / 16) <= self.epsilon
        ):
            raise ConfigError(
                "epsilon",
                f"with calibration=paper, ε={self.epsilon} gives ε'=ε/16 whose exact loss "
                "exceeds ε",
                "epsilon <= 7.6 (the paper's theorems assume < 0.5), or calibration=exact",
            )
        if isinstance(self.patterns, str) and self.patterns != "all":
            raise ConfigError(
                "patterns", f"unknown value {self.patterns!r}", "'all' or a list of patterns"
            )
        for col, dom in (self.domains or {}).items():
            if isinstance(dom, int) and dom < 1 or isinstance(dom, list) and not dom:
                raise ConfigError(
                    f"domains.{col}", f"empty domain {dom!r}", "a size >= 1 or a list of values"
                )
            if isinstance(dom, list) and len(set(map(str, dom))) != len(dom):
                raise ConfigError(f"domains.{col}", "lists a value twice", "distinct values")

    def eps_prime(self) -> float:
        """The randomized-response bias ε' of the chosen calibration."""
        if self.calibration == "paper":
            return self.epsilon / 16.0
        return math.tanh(self.epsilon / 4.0) / 2.0


# --- pure maths (no Ray, no actors) ----------------------------------------------------------------
def exact_loss(eps_prime: float) -> float:
    """Exact privacy loss of one party's message: two bits of RR with bias ε' (spec §2.1)."""
    return 2.0 * math.log((1 + 2 * eps_prime) / (1 - 2 * eps_prime))


def keep_probability(eps_prime: float) -> float:
    """Pr[reported bit = true bit] = 1/2 + ε'."""
    return 0.5 + eps_prime


def rr_event(eps_prime: float) -> dp_event.DpEvent:
    """The DP event of one party's message: RR on the two one-hot bits one user change can flip."""
    return dp_event.SelfComposedDpEvent(event=binary_rr_event(keep_probability(eps_prime)), count=2)


def debias_constants(eps_prime: float) -> tuple[float, float]:
    """(lo, d): a debiased bit is z = lo + d·b, lo = 1/2 - 1/(4ε'), d = 1/(2ε')."""
    return 0.5 - 1.0 / (4.0 * eps_prime), 1.0 / (2.0 * eps_prime)


def per_user_variance_constant(eps_prime: float) -> float:
    """c = Var[z] = 1/(16ε'²) - 1/4, the same for a true bit 0 or 1."""
    return 1.0 / (16.0 * eps_prime**2) - 0.25


def _column_index(values: pa.ChunkedArray, col: str, dom: Domain) -> np.ndarray:
    """Index of each value in the declared domain of one column; -1 where it is outside."""
    if isinstance(dom, int):
        raw = values.to_numpy(zero_copy_only=False)
        if not np.issubdtype(raw.dtype, np.number):
            raise DataError(
                f"domains.{col}",
                f"column {col!r} is not numeric but its domain is a size",
                "declare the list of its values instead",
            )
        idx = raw.astype(np.int64)
        return np.where((raw == idx) & (idx >= 0) & (idx < dom), idx, -1)
    try:
        value_set = pa.array(dom).cast(values.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
        raise DataError(
            f"domains.{col}",
            f"declared values {dom!r} do not match the column's type {values.type}",
            f"values of type {values.type}",
        ) from err
    idx = pc.index_in(values, value_set=value_set)
    return pc.fill_null(idx, -1).to_numpy(zero_copy_only=False).astype(np.int64)


def encode_values(table: pa.Table, columns: list[str], domains: dict[str, Domain]) -> np.ndarray:
    """One index in {0..size-1} per user from its columns (mixed radix); -1 if any value is outside
    its declared domain (encoded as the all-zero one-hot vector, spec §2.1)."""
    index = np.zeros(table.num_rows, dtype=np.int64)
    valid = np.ones(table.num_rows, dtype=bool)
    for col in columns:
        dom = domains[col]
        idx = _column_index(table.column(col), col, dom)
        ok = idx >= 0
        index = index * (dom if isinstance(dom, int) else len(dom)) + np.where(ok, idx, 0)
        valid &= ok
    return np.where(valid, index, -1)


def out_of_domain(
    table: pa.Table, columns: list[str], domains: dict[str, Domain]
) -> dict[str, int]:
    """Number of values outside the declared domain, per column (only the non-zero ones)."""
    counts = {
        c: int(np.count_nonzero(_column_index(table.column(c), c, domains[c]) < 0)) for c in columns
    }
    return {c: n for c, n in counts.items() if n}


def one_hot(values: np.ndarray, size: int) -> np.ndarray:
    """(size, n) boolean matrix; a value of -1 gives an all-zero column."""
    out = np.zeros((size, values.size), dtype=bool)
    present = values >= 0
    out[values[present], np.flatnonzero(present)] = True
    return out


def public_sample(seed: int, m: int, rate: float) -> np.ndarray:
    """The shared sample S of Thm B.2: user i is in S with probability ``rate``; the same for all."""
    if rate >= 1.0:
        return np.ones(m, dtype=bool)
    return rng.stream(seed, "sample", 0, "public-sample").random(m) < rate


def subset_counts(
    mats: list[np.ndarray], subset: tuple[int, ...], patterns: np.ndarray | None
) -> np.ndarray:
    """Σ_i Π_{j∈subset} A_j[ρ_j, i] for 0/1 matrices A_j: exact integer counts (as float64).

    ``patterns`` None: the full tensor over the subset's domains; else a (K, v) index array.
    """
    n = mats[0].shape[1]
    if not subset:
        return np.full(() if patterns is None else len(patterns), float(n))
    if patterns is None:
        letters = "abcdefghijklmnopqrstuvwxy"[: len(subset)]
        expr = ",".join(f"{c}z" for c in letters) + "->" + letters
        out = np.zeros([mats[j].shape[0] for j in subset])
        chunk = max(1024, (1 << 24) // max(1, out.size))
        for a in range(0, n, chunk):
            ops = [mats[j][:, a : a + chunk].astype(np.float64) for j in subset]
            out += np.einsum(expr, *ops)
        return out
    out = np.zeros(len(patterns))
    chunk = max(1024, (1 << 24) // max(1, len(patterns)))
    for a in range(0, n, chunk):
        prod = np.ones((len(patterns), min(chunk, n - a)), dtype=bool)
        for j in subset:
            prod &= mats[j][patterns[:, j], a : a + chunk].astype(bool)
        out += prod.sum(axis=1)
    return out


def product_sums(
    mats: list[np.ndarray], base: float, scale: float, patterns: np.ndarray | None
) -> np.ndarray:
    """Σ_i Π_j (base + scale·A_j[ρ_j, i]), expanded over subsets T of parties into exact counts:
    Σ_T base^(v-|T|) · scale^|T| · #{i : A_j[ρ_j, i] = 1 for all j in T}."""
    v = len(mats)
    sizes = [m.shape[0] for m in mats]
    out = np.zeros(sizes if patterns is None else len(patterns))
    for k in range(v + 1):
        for subset in itertools.combinations(range(v), k):
            coef = base ** (v - k) * scale**k
            if coef == 0.0:
                continue
            counts = subset_counts(mats, subset, patterns)
            if patterns is None:
                counts = counts.reshape([sizes[j] if j in subset else 1 for j in range(v)])
            out = out + coef * counts
    return out


def raw_counts(
    bits: list[np.ndarray], eps_prime: float, patterns: np.ndarray | None, sample_rate: float
) -> np.ndarray:
    """The unbiased (unclipped) estimate (1/p) Σ_{i∈S} Π_j z_j[ρ_j, i] from the parties' RR bits."""
    lo, d = debias_constants(eps_prime)
    return product_sums(bits, lo, d, patterns) / sample_rate


def predicted_variance(
    true_onehots: list[np.ndarray],
    eps_prime: float,
    patterns: np.ndarray | None,
    sample_rate: float,
) -> np.ndarray:
    """Var(raw_ρ) = Σ_i [(1/p) Π_j (c + a_ij) - Π_j a_ij] (spec §2.1–2.2), from the true data."""
    c = per_user_variance_constant(eps_prime)
    second = product_sums(true_onehots, c, 1.0, patterns)
    truth = product_sums(true_onehots, 0.0, 1.0, patterns)
    return second / sample_rate - truth


# --- step functions (run inside the actors) ----------------------------------------------------
def randomize_step(
    ctx: StepContext, *, eps_prime: float, sample_rate: float, round: int
) -> Message:
    """Party: encode each user's values one-hot, apply per-bit RR, send the packed bits."""
    values = encode_values(ctx.table, ctx.meta["columns"], ctx.meta["domains"])
    values = values[public_sample(ctx.seed, values.size, sample_rate)]
    onehot = one_hot(values, ctx.meta["size"])
    noisy, bit_event = binary_randomized_response(
        ctx.noise, onehot, keep_probability=keep_probability(eps_prime), round=round
    )
    payload = {"bits": np.packbits(noisy, axis=1), "users": int(values.size)}
    return Message(
        "rr_bits", payload, to="coordinator", dp_event=dp_event.SelfComposedDpEvent(bit_event, 2)
    )


def estimate_step(
    ctx: StepContext,
    messages: dict[str, dict],
    *,
    order: list[str],
    eps_prime: float,
    patterns: np.ndarray | None,
    sample_rate: float,
) -> np.ndarray:
    """Coordinator: debias the parties' bits and estimate the raw count of every requested pattern."""
    bits = [np.unpackbits(messages[p]["bits"], axis=1, count=messages[p]["users"]) for p in order]
    return raw_counts(bits, eps_prime, patterns, sample_rate)


# --- the protocol ----------------------------------------------------------------------------------
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
            if isinstance(value, int) and 0 <= value < len(labels[j]):
                out[k, j] = value
            elif str(value) in labels[j]:
                out[k, j] = labels[j].index(str(value))
            else:
                raise ConfigError(
                    f"patterns[{k}][{j}]",
                    f"{value!r} is not in party {j}'s domain",
                    labels[j] if len(labels[j]) <= 20 else f"indices 0..{len(labels[j]) - 1}",
                )
    return out


MAX_ONEHOT_BYTES = 4 << 30


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


class PatternCount(Protocol):
    name = "pattern-count"
    summary = "DP pattern counting in vertical FL: per-bit randomized response on one-hot values (Alg. 1, Thm B.2)"
    Config = PatternCountConfig
    examples = (
        {"users": 2000},
        {"users": 2000, "calibration": "exact", "sample_rate": 0.5},
    )

    def data_bytes(self, cfg: PatternCountConfig) -> int:
        """The synthetic table (8 bytes a value) and each party's one-hot matrix (a byte a bit)."""
        if cfg.data.path is not None:
            return 0
        return cfg.users * cfg.parties * (8 + 2 * cfg.domain_size)

    def plan(self, cfg: PatternCountConfig, seed: int) -> Plan:
        reject_inapplicable(cfg, ["domains"], ["users", "domain_size", "correlation"])
        if cfg.data.path is None:
            table = synthetic_table(cfg.users, cfg.parties, cfg.domain_size, cfg.correlation, seed)
            domains: dict[str, Domain] = {f"x{j}": cfg.domain_size for j in range(cfg.parties)}
            groups = {p: [f"x{j}"] for j, p in enumerate(party_names(cfg.parties))}
            key = "user_id"
        else:
            table = sort_by_key(load_table(cfg.data.path, cfg.data.format), cfg.data.key)
            key = cfg.data.key
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
        partitions = vertical(table, groups, key)
        require_clean(table, [c for cols in groups.values() for c in cols])
        order = list(groups)
        _check_memory(groups, domains, table.num_rows)
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
        labels = [_domain_labels(groups[p], domains) for p in order]
        patterns = _resolve_patterns(cfg, labels)
        parties = {
            p: (
                partitions[p],
                {
                    "columns": groups[p],
                    "domains": {c: domains[c] for c in groups[p]},
                    "size": len(lab),
                },
            )
            for p, lab in zip(order, labels, strict=True)
        }
        sent = int(public_sample(seed, table.num_rows, cfg.sample_rate).sum())
        evaluation = None
        if cfg.evaluate or (cfg.evaluate is None and cfg.data.path is None):
            onehots = [
                one_hot(encode_values(partitions[p], groups[p], domains), len(lab))
                for p, lab in zip(order, labels, strict=True)
            ]
            evaluation = {
                "true": product_sums(onehots, 0.0, 1.0, patterns),
                "variance": predicted_variance(onehots, cfg.eps_prime(), patterns, cfg.sample_rate),
            }
        return Plan(
            budget=Budget(cfg.epsilon, 0.0),
            ledger=dict(
                accountant="pure",
                relation="replace_one",
                composition="parallel",
                statement="DP in VFL (Def. 1.2): one user's value changes at one party; each party's "
                "messages depend only on its own data, so scopes (parties) compose in parallel",
            ),
            parties=parties,
            rounds=1,
            evaluation=evaluation,
            info={
                "order": order,
                "labels": labels,
                "patterns": patterns,
                "users": table.num_rows,
                "sent": sent,
                "outside": outside,
            },
        )

    def drive(self, fed, cfg: PatternCountConfig, plan: Plan) -> Outcome:
        eps_prime = cfg.eps_prime()
        order, patterns = plan.info["order"], plan.info["patterns"]
        with fed.round(0):
            fed.charge(
                [(p, "randomized response on one-hot values", rr_event(eps_prime)) for p in order]
            )
            bits = fed.parties.run(
                randomize_step,
                eps_prime=eps_prime,
                sample_rate=cfg.sample_rate,
                round=0,
                phase="randomize",
            )
            raw = fed.one(
                fed.coordinator.run(
                    estimate_step,
                    bits,
                    order=order,
                    eps_prime=eps_prime,
                    patterns=patterns,
                    sample_rate=cfg.sample_rate,
                    phase="estimate",
                )
            )
        loss = exact_loss(eps_prime)
        if cfg.calibration == "paper":
            fed.note(
                f"paper calibration ε'=ε/16: the paper claims ε={cfg.epsilon:g} per party (8ε' per bit); "
                f"the exact loss, reported above, is {loss:.4f}"
            )
        else:
            fed.note(
                f"exact calibration ε'=tanh(ε/4)/2 (not in the paper): exact loss {loss:.4f} per party"
            )
        fed.note(
            f"a user whose values change at all {len(order)} parties: ε = {len(order) * loss:.4f} (sequential)"
        )
        if plan.info["outside"]:
            fed.note(
                f"values outside the declared domains were encoded as all-zero: {plan.info['outside']}"
            )
        if plan.evaluation is not None:
            fed.note(
                "the columns true_count, error and predicted_sd are computed from the raw data outside "
                "the protocol and are not private"
            )
        return self._outcome(cfg, plan, raw, eps_prime)

    def _outcome(
        self, cfg: PatternCountConfig, plan: Plan, raw: np.ndarray, eps_prime: float
    ) -> Outcome:
        order, labels, patterns = plan.info["order"], plan.info["labels"], plan.info["patterns"]
        m, v = plan.info["users"], len(order)
        if patterns is None:
            index = np.array(
                list(itertools.product(*(range(len(lab)) for lab in labels))), dtype=np.int64
            ).reshape(-1, v)
            raw = raw.reshape(-1)
        else:
            index = patterns
        c = per_user_variance_constant(eps_prime)
        columns: dict[str, Any] = {
            p: [labels[j][i] for i in index[:, j]] for j, p in enumerate(order)
        }
        columns["estimate"] = np.maximum(raw, 0.0)
        columns["raw"] = raw
        columns["sd_bound"] = np.full(len(raw), math.sqrt(m * ((c + 1) ** v / cfg.sample_rate - 1)))
        metrics: dict[str, Any] = {
            "users": m,
            "parties": v,
            "patterns": len(raw),
            "eps_prime": eps_prime,
            "exact_epsilon_per_party": exact_loss(eps_prime),
            "users_sent": plan.info["sent"],
            "bits_per_party": {p: len(labels[j]) * plan.info["sent"] for j, p in enumerate(order)},
        }
        headline = f"{len(raw)} pattern counts over {v} parties and {m:,} users"
        if plan.evaluation is not None:
            true = np.asarray(plan.evaluation["true"]).reshape(-1)
            sd = np.sqrt(np.asarray(plan.evaluation["variance"]).reshape(-1))
            columns["true_count"] = true
            columns["error"] = raw - true
            columns["predicted_sd"] = sd
            metrics.update(
                max_abs_error=float(np.max(np.abs(raw - true))),
                rmse=float(np.sqrt(np.mean((raw - true) ** 2))),
                mean_predicted_sd=float(sd.mean()),
            )
            headline += f"; max |error| {metrics['max_abs_error']:.1f} (predicted sd ~{metrics['mean_predicted_sd']:.1f})"
        return Outcome(tables={"counts": pa.table(columns)}, metrics=metrics, headline=headline)
