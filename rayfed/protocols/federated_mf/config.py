"""Options of ``rayfed run federated-mf``: one config for the three settings, each option
declaring the settings that read it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from rayfed.config import DataConfig, option
from rayfed.dropout import PopulationConfig
from rayfed.errors import ConfigError
from rayfed.privacy import check_budget
from rayfed.privacy.calibration import MAX_DELTA, MAX_DELTA_WHY
from rayfed.protocols.base import reconcile_randomness

LFL = {"setting": ("lfl",)}
PARTITIONED = {"setting": ("vfl", "hfl")}
PRIVATE = {"noise": ("gaussian",)}
#: VFL's central literature baselines (spec §2.10, Fig. 4.4): s = 1 only
BASELINES = ("dp-sgld", "objpert")
GDDR = {"setting": ("lfl",), "method": ("gd-dr",)}
#: the methods each setting runs: its own algorithm first (the default), then its baselines
METHODS = {
    "lfl": ("lfl", "ldp", "stage1", "central", "gd-dr"),
    "vfl": ("vfl", "local", "central", "dp-sgld", "objpert"),
    "hfl": ("hfl", "local", "central"),
}


def methods_but(*left_out: str) -> dict[str, tuple[str, ...]]:
    """A ``when`` for the options every method reads but ``left_out`` (the method resolved:
    :func:`rayfed.config.check_applicable` reads ``resolved_method``)."""
    every = dict.fromkeys(m for ms in METHODS.values() for m in ms)
    return {"method": tuple(m for m in every if m not in left_out)}


#: DP-SGLD steps at sgld_step for T·T' steps with no fine-tuning; ObjPertb solves K times in
#: closed form, pure ε-DP, no minibatches; GD-DR sends one-bit reports through no secure
#: aggregation and has no corrected/faithful modes
NOT_SGLD_OR_OBJPERT = methods_but("dp-sgld", "objpert")
NOT_OBJPERT = methods_but("objpert")
NOT_GDDR = methods_but("gd-dr")
#: the methods whose noise is Gaussian (ObjPertb's is pure ε-DP, GD-DR's shuffled reports too)
GAUSSIAN_METHODS = methods_but("objpert", "gd-dr")


@dataclass(frozen=True)
class FederatedMFConfig:
    """Options of ``rayfed run federated-mf``."""

    setting: Literal["lfl", "vfl", "hfl"] = option(
        "lfl",
        "lfl: one simulated user per rating-row owner; vfl: parties hold disjoint item sets; "
        "hfl: parties hold disjoint user sets",
    )
    method: (
        Literal[
            "lfl", "ldp", "stage1", "central", "vfl", "hfl", "local", "dp-sgld", "objpert", "gd-dr"
        ]
        | None
    ) = option(
        None,
        "default: the setting's own algorithm. lfl: ldp (LDP-level noise), stage1 (pre-training only), "
        "gd-dr (Private-GD-DR, the LDP baseline: one-bit reports of a projected gradient); "
        "vfl: local (each party alone, with DP), dp-sgld and objpert (the central literature "
        "baselines, parties=1); hfl: local (non-private local SGD); any: central",
    )
    mode: Literal["corrected", "faithful"] = option(
        "corrected",
        "corrected (the spec's fix, nominal ε holds) or faithful (the thesis; the true, larger ε "
        "is reported). LFL: the two rounds' noise shares; VFL/HFL per-rating (and dp-sgld): "
        "corrected Poisson-samples ratings, faithful samples users as the thesis does, which "
        "amplifies per-user privacy only",
        when=NOT_GDDR,
    )
    epsilon: float = option(
        1.0,
        "target ε (per user, or per rating in VFL/HFL with privacy_unit=rating), at most 10⁴",
        above=0,
        at_most=1e4,
        why=(
            "objpert's default λ = R/(e^(ε/(2K·blocks)) − 1) overflows float64 from ε = 10⁵ "
            "(OverflowError), and a guarantee past ε ≈ 745, where e^-ε underflows, says nothing "
            "already"
        ),
        when=PRIVATE,
    )
    delta: float | None = option(
        None,
        "δ (default 1/number of ratings)",
        above=0,
        at_most=MAX_DELTA,
        why=MAX_DELTA_WHY,
        when={**PRIVATE, **NOT_OBJPERT},
    )
    accountant: Literal["tightest", "rdp"] = option(
        "tightest",
        "what the Gaussian noise is calibrated against and the ledger composes with: tightest "
        "(PLD and RDP side by side, the smaller ε) or rdp (the thesis's accountant: more noise "
        "for the same ε). DP-SGLD keeps its papers' advanced-composition calibration either way; "
        "mode=faithful keeps the thesis's RDP calibration of z (its true ε is reported)",
        when={**PRIVATE, **GAUSSIAN_METHODS},
    )
    iterations: int = option(
        5,
        "T, server iterations (the spec's runs use 10 for LFL, 100 for VFL/HFL; 5 keeps the "
        "default run to a minute)",
        at_least=1,
        when=NOT_OBJPERT,
    )
    rank: int = option(10, "embedding dimension p", at_least=1, size=True)
    bound: float = option(
        5.0, "R: rows are clipped to ‖x‖² <= R (ratings must lie in [0, R])", above=0
    )
    out_of_domain: Literal["refuse", "clip"] = option(
        "refuse",
        "ratings outside [0, R]: refuse (an error naming them) or clip them to [0, R] (counted "
        "in the headline and metrics); every sensitivity bound needs ratings in [0, R]",
    )
    pretrain_steps: int = option(
        50, "LFL/HFL Stage 1: local gradient steps on the user embeddings", at_least=0
    )
    finetune_steps: int = option(
        50,
        "LFL/HFL: local, unpublished Stage-3 steps; VFL: κ noisy steps on V_Fk (published, charged)",
        at_least=0,
        when=NOT_SGLD_OR_OBJPERT,
    )
    local_lr: float = option(
        0.05, "LFL/HFL: learning rate of the local (non-private) steps", above=0
    )
    omega: float = option(
        0.3,
        "LFL: ω, tolerated dropout fraction; threshold t = ceil((1-ω) n)",
        at_least=0,
        below=1,
        when=LFL,
    )
    dropout: float = option(
        0.0,
        "LFL: actual dropout rate per iteration, in each of the two rounds",
        at_least=0,
        below=1,
        when=LFL,
    )
    lost_users: Literal["resume", "dropouts"] = option(
        "resume",
        "LFL: when a cohort actor dies, restart it and resume its users from their checkpoint "
        "(Arrow, taken after Stage 1), or carry its users as permanent dropouts",
        when=LFL,
    )
    population: PopulationConfig = field(
        default_factory=PopulationConfig,
        metadata={
            "help": "LFL: who takes part in each iteration's secure aggregation (models)",
            "when": LFL,
        },
    )
    lr: float | None = option(
        None,
        "LFL: γ, server learning rate of V (the update is divided by |U1|); default: a rule of "
        "public quantities only, γ = min(γ_max, κ_L·t·√(R/p)/(σ_S·√T)), σ_S the noise's sd on "
        "a coordinate of the sum (from z, Δ, n, ω); gd-dr: 2",
        above=0,
        when=LFL,
    )
    dp_mechanism: Literal["gaussian", "ddg", "skellam"] = option(
        "gaussian",
        "LFL: the users' noise shares. gaussian: continuous N(0, ζ1σ²) on the float gradient "
        "row, fixed-point rounded into secure aggregation, Round 2 replaces each survivor's "
        "share; skellam: the distributed-DP pipeline (ℓ2 clip, rotation, scale, conditional "
        "rounding) and an integer Skellam share in the ring 2^bits, Round 2 removes the "
        "survivors' excess share components (exact: the sum stays Skellam); ddg (discrete "
        "Gaussian) is refused: its shares admit no sound Round-2 event",
        when={**LFL, "method": ("lfl",)},
    )
    bits: int = option(
        16,
        "LFL, dp_mechanism=skellam: ring bits per coordinate (the secure sum's modulus 2^bits)",
        at_least=2,
        at_most=62,
        when={**LFL, "dp_mechanism": ("ddg", "skellam")},
    )
    gddr_dim: int | None = option(
        None,
        "GD-DR: k <= m, rows of the public random projection Φ (k x m) (default min(m, 64))",
        at_least=1,
        when=GDDR,
    )
    gddr_clip: float | None = option(
        None,
        "GD-DR: c, each projected-gradient entry is clipped to [-c, c] (default 2R^(3/2)/sqrt(k), "
        "the exact bound: no clipping; smaller: less noise, biased)",
        above=0,
        when=GDDR,
    )
    secagg_mode: Literal["secure", "simulation", "dealer"] = option(
        "simulation",
        "LFL: secure aggregation mode for Round 1 (only secure protects against the server; it "
        "makes the run randomness=secure, and a secure run makes simulation secure)",
        when={**LFL, **NOT_GDDR},
    )
    threat_model: Literal["semi-honest", "malicious"] = option(
        "semi-honest",
        "LFL: the server Round 1's secure aggregation defends against. semi-honest: it follows "
        "the protocol (a server that lies about who dropped can isolate a user's Round-1 message "
        "on the sparse graph: out of scope); malicious: SecAgg's consistency round (signed U3, "
        "keys authenticated through a simulated PKI) and t > (k + corrupt neighbours)/2 "
        "(Bell et al.), with k grown to keep the bounds",
        when={**LFL, **NOT_GDDR, "secagg_mode": ("secure", "simulation")},
    )
    cohorts: int | None = option(
        None, "LFL: user-cohort actors (default: this machine's CPUs)", at_least=1, when=LFL
    )
    server_shards: int | Literal["auto"] = option(
        "auto",
        "LFL: server-shard actors splitting Round 1's reconstruction and mask removal by user "
        "range (bit-identical sums); auto: 1 below 8 cluster CPUs, else CPUs // 4, at most 16",
        at_least=1,
        when=LFL,
    )
    parties: int = option(
        2,
        "VFL/HFL: parties s (items, resp. users, dealt at random)",
        at_least=1,
        when=PARTITIONED,
    )
    local_steps: int = option(
        10,
        "VFL/HFL: T', local DP-SGD steps between averages",
        at_least=1,
        when={**PARTITIONED, **NOT_OBJPERT},
    )
    sampling_rate: float = option(
        0.01,
        "VFL/HFL: η, Poisson sampling rate per local step (of users; of ratings per rating in "
        "mode=corrected)",
        above=0,
        at_most=1,
        when={**PARTITIONED, **NOT_OBJPERT},
    )
    privacy_unit: Literal["rating", "user"] | None = option(
        None,
        "VFL/HFL: per-rating or per-user privacy (default: VFL rating, HFL user; spec §7.8)",
        when={**PARTITIONED, **PRIVATE},
    )
    trim: int | None = option(
        None,
        "VFL/HFL per-user: ratings kept per user and party (default VFL 5, HFL 10)",
        at_least=1,
        when={**PARTITIONED, **PRIVATE},
    )
    user_sensitivity: Literal["tight", "thesis"] = option(
        "tight",
        "VFL/HFL per user (and dp-sgld): Δ of a user's θ kept ratings. tight: a user rates an "
        "item at most once, so its θ gradient rows lie on θ distinct items: √θ·2R^(3/2) for a "
        "V-only step, √(θ²+θ)·2R^(3/2) for a joint (U, V) step (the supremum); thesis: θ times "
        "one rating's Δ (the thesis's triangle inequality, spec §7.7: up to √θ times the noise "
        "for the same ε)",
        when={
            **PARTITIONED,
            **PRIVATE,
            "method": ("vfl", "hfl", "local", "dp-sgld"),
            "privacy_unit": ("user",),
        },
    )
    split_column: str | None = option(
        None,
        "VFL: a column of the ratings file; each of its values is one party's item set (e.g. genre)",
        when={"setting": ("vfl",)},
        source="file",
    )
    noise: Literal["gaussian", "none"] = option(
        "gaussian",
        "VFL/HFL: gaussian (DP-SGD) or none: the same federated rounds, sampling and averages "
        "without noise, the non-private federated reference (spec §6 C3); nothing is DP",
        when=PARTITIONED,
    )
    vfl_lr: float | None = option(
        None,
        "VFL/HFL: learning rate of the local DP-SGD steps (with vfl_lr_end, the start of its "
        "decay; alone, a constant rate); default: the public rule of the noise (rayfed/mf/rates.py: "
        "z, Δ, η, the batch sizes, T·T', R, p and the shape), decaying to a tenth",
        above=0,
        at_most=1e4,
        when={**PARTITIONED, **NOT_SGLD_OR_OBJPERT},
    )
    vfl_lr_end: float | None = option(
        None,
        "VFL/HFL: decay the rate linearly to this over the first 80 % of the T·T' DP-SGD steps, "
        "then hold it (spec §5.3; VFL's fine-tuning runs at it); default: a tenth of the rule's "
        "rate, or a constant vfl_lr when vfl_lr is given",
        above=0,
        at_most=1e4,
        when={**PARTITIONED, **NOT_SGLD_OR_OBJPERT},
    )
    sgld_step: float = option(
        1e-3,
        "dp-sgld: η, the Langevin step size: each of the T·T' steps adds N(0, η) to every entry of "
        "U and V; the temperature τ = 2η_s/(z√η·L) follows from it (η_s = sampling_rate)",
        above=0,
        when={"method": ("dp-sgld",)},
    )
    objpert_alternations: int = option(
        10,
        "objpert: K, alternations of the perturbed V-solve and the U-solve; each V-solve gets ε/K",
        at_least=1,
        when={"method": ("objpert",)},
    )
    objpert_reg: float | None = option(
        None,
        "objpert: λ, the ridge of every item's V-solve; it must exceed R/(e^{ε/(K·blocks)} − 1) "
        "(default: the λ that leaves half of ε/K for the noise, Chaudhuri et al.'s Alg. 2)",
        above=0,
        when={"method": ("objpert",)},
    )
    users: int | None = option(
        None,
        "synthetic data: users (default: LFL 2,500, the main job's, sized so that its learning "
        "curve falls within a minute; VFL/HFL 1,500)",
        at_least=1,
        size=True,
    )
    items: int = option(100, "synthetic data: items", at_least=1, size=True)
    density: float | None = option(
        None,
        "synthetic data: fraction of observed ratings (default: LFL 0.1, VFL/HFL 0.05)",
        above=0,
        at_most=1,
    )
    test_fraction: float = option(0.1, "held-out fraction of each user's ratings", above=0, below=1)
    data: DataConfig = field(
        default_factory=DataConfig, metadata={"help": "ratings file (user, item, rating)"}
    )

    #: options that went, and where they went (a ConfigError names the new place)
    MOVED: ClassVar[dict[str, str]] = {
        "consistency": "threat_model=malicious (LFL: the consistency round, the PKI and a "
        "threshold sized for a malicious server)",
    }

    def validate(self) -> None:
        check_budget(self.epsilon, self.delta if self.delta is not None else 1e-6)
        if self.split_column is not None and self.parties != type(self)().parties:
            raise ConfigError(
                "parties", "the parties come from split_column's values", "drop parties"
            )
        allowed = METHODS[self.setting]
        if self.method in BASELINES and self.setting != "vfl":
            raise ConfigError(
                "method",
                f"{self.method} is one of VFL's central baselines (s = 1), not {self.setting}'s",
                "setting=vfl with parties=1",
            )
        if self.resolved_method() not in allowed:
            raise ConfigError(
                "method", f"{self.method!r} does not apply to setting={self.setting}", allowed
            )
        if self.resolved_method() in BASELINES:
            self._check_baseline()
        if self.mode == "faithful" and self.setting != "lfl":
            self._check_faithful()
        if self.dp_mechanism != "gaussian":
            self._check_integer_noise()
        if self.noise == "none" and not self.noisy_method():
            raise ConfigError(
                "noise",
                f"method={self.resolved_method()} in {self.setting} adds no noise anyway",
                "drop noise, or method in (vfl, hfl, local with setting=vfl)",
            )

    def _check_integer_noise(self) -> None:
        """LFL's integer shares: Skellam, whose Round 2 removes share components exactly; the
        discrete Gaussian has no sound Round-2 event, and the faithful mode is the thesis's
        continuous noise algebra (docs/protocols/federated-mf.md, "Integer noise")."""
        if self.dp_mechanism == "ddg":
            raise ConfigError(
                "dp_mechanism",
                "ddg with LFL's Round 2: a sum of discrete Gaussians is only close to one (KLS's "
                "τ term, for equal shares), and neither a survivor's replaced share nor its "
                "removed components leave a sum the distributed discrete Gaussian's event covers",
                "dp_mechanism=skellam (Round 2 exact: the sum stays Skellam), or gaussian",
            )
        if self.mode == "faithful":
            raise ConfigError(
                "mode",
                f"faithful is the thesis's continuous noise algebra; dp_mechanism="
                f"{self.dp_mechanism}'s Round 2 removes share components instead (the nominal ε "
                "holds, as in corrected)",
                "mode=corrected, or dp_mechanism=gaussian",
            )

    def _check_baseline(self) -> None:
        """DP-SGLD and ObjPertb run centrally on one party's ratings, always with their noise (the
        VFL options they do not read are refused by their ``when``)."""
        if self.parties != 1:
            raise ConfigError(
                "parties",
                f"method={self.method} runs on one party, got parties={self.parties}",
                "parties=1: the literature baselines are central",
            )
        if self.noise == "none":
            raise ConfigError(
                "noise",
                f"method={self.method} has no noise-free variant",
                "drop noise (its non-private reference is method=vfl with noise=none)",
            )

    def _check_faithful(self) -> None:
        """VFL/HFL's faithful mode is the thesis's user-level sampling of a per-rating run: it
        changes nothing where users are the unit, or where nothing is sampled."""
        if self.resolved_unit() != "rating":
            raise ConfigError(
                "mode",
                f"faithful changes per-rating runs only (user-level sampling); privacy_unit is "
                f"{self.resolved_unit()}, for which user sampling is already the corrected mode",
                "drop mode, or privacy_unit=rating",
            )
        if not self.noisy_method() or self.resolved_method() == "objpert":
            raise ConfigError(
                "mode",
                f"method={self.resolved_method()} samples no minibatch, so it has no faithful mode",
                "drop mode",
            )
        if self.sampling_rate >= 1:
            raise ConfigError(
                "mode",
                "at sampling_rate=1 every batch holds every rating, whichever unit is sampled",
                "drop mode, or sampling_rate < 1",
            )

    def resolved_method(self) -> str:
        return self.method or self.setting

    def resolved_users(self) -> int:
        """The synthetic population: LFL's main job has 2,500 users (its learning curve falls on
        seeds 0-4 at the public server step, benchmarks/federated_mf_lfl_rate.py), VFL/HFL 1,500."""
        return self.users or (2500 if self.setting == "lfl" else 1500)

    def resolved_density(self) -> float:
        return self.density or (0.1 if self.setting == "lfl" else 0.05)

    def noisy_method(self) -> bool:
        """Whether the method adds DP noise when ``noise=gaussian`` (central and HFL's local
        baseline never do)."""
        method = self.resolved_method()
        return method != "central" and not (self.setting == "hfl" and method == "local")

    def private(self) -> bool:
        """Whether the run releases anything under DP: ``noise=none`` makes VFL/HFL a
        non-private reference."""
        return self.noise == "gaussian"

    def resolved_unit(self) -> str:
        return self.privacy_unit or ("user" if self.setting in ("hfl", "lfl") else "rating")

    def resolved_privacy_unit(self) -> str:
        """The unit the ``when`` of a per-user option reads (:meth:`resolved_unit`)."""
        return self.resolved_unit()

    def resolved_trim(self) -> int:
        return self.trim or (10 if self.setting == "hfl" else 5)


def calibration_accountant(cfg: FederatedMFConfig) -> str:
    """The accountant the Gaussian noise multiplier is calibrated against: the run's
    (``accountant``), but the thesis's RDP in ``mode=faithful``, which reproduces the thesis's
    runs (the ledger then reports their true ε under ``accountant``)."""
    return "rdp" if cfg.mode == "faithful" else cfg.accountant


def resolve_randomness(cfg: FederatedMFConfig, randomness: str) -> tuple[FederatedMFConfig, str]:
    """``secagg_mode=secure`` makes the run secure; a secure run makes ``simulation`` secure
    and refuses ``dealer`` (its mask seeds come from the run seed)."""
    return reconcile_randomness(
        cfg, randomness, "secagg_mode", upgrade=("simulation",), refused=("dealer",)
    )
