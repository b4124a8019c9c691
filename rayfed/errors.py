"""Typed failures of rayfed.

Every error has one root, :class:`RayfedError`, and a message a user can act on: the field or
party at fault and what is allowed instead. Errors raised inside a Ray actor reach the caller as
the same type (the federation unwraps Ray's task error), with Ray's error as ``__cause__``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class RayfedError(Exception):
    """Root of every error rayfed raises on purpose."""


class ConfigError(RayfedError, ValueError):
    """A configuration value is missing, unknown or out of range.

    Parameters
    ----------
    field:
        Dotted name of the offending key, e.g. ``"epsilon"`` or ``"data.columns.p1"``.
    problem:
        What is wrong with the value given.
    allowed:
        What would be accepted instead (a range, a list of names, a fix).
    """

    def __init__(self, field: str, problem: str, allowed: str | Iterable[Any] | None = None):
        self.field = field
        self.problem = problem
        if allowed is not None and not isinstance(allowed, str):
            allowed = ", ".join(str(a) for a in allowed)
        self.allowed = allowed
        msg = f"{field}: {problem}"
        if allowed:
            msg += f" (allowed: {allowed})"
        super().__init__(msg)

    def __reduce__(self):  # keep the fields when Ray pickles the error across processes
        return (type(self), (self.field, self.problem, self.allowed))


class DeclarationError(RayfedError):
    """A protocol's privacy declaration is inconsistent (an unknown accountant, a release whose
    relation or event the ledger cannot account): a defect of the protocol, found before any
    actor or run directory exists."""

    def __init__(self, protocol: str, what: str, problem: str):
        self.protocol, self.what, self.problem = protocol, what, problem
        super().__init__(f"{protocol}: its privacy declaration's {what}: {problem}")

    def __reduce__(self):
        return (type(self), (self.protocol, self.what, self.problem))


class DataError(ConfigError):
    """Input data does not match what the configuration declares (column, domain, NaN, bounds)."""


class BudgetExceeded(RayfedError):
    """A noise event would take the privacy spent past the declared budget.

    Raised by the ledger *before* the noise is drawn.
    """

    def __init__(self, scope: str, label: str, would_spend: float, budget: float, delta: float):
        self.scope, self.label = scope, label
        self.would_spend, self.budget, self.delta = would_spend, budget, delta
        spend = (
            f"epsilon to {would_spend:.6g} > budget {budget:.6g} (at delta={delta:.3g})"
            if would_spend != float("inf")
            else f"its delta above the budget's delta={delta:.3g}"
        )
        super().__init__(
            f"privacy budget exceeded in scope {scope!r}: {label!r} would bring {spend}; "
            "raise the budget or spend less per round"
        )

    def __reduce__(self):
        return (type(self), (self.scope, self.label, self.would_spend, self.budget, self.delta))


class UnaccountedNoise(RayfedError):
    """A party sent a message carrying a DP event that was never charged to the ledger."""


class BelowThreshold(RayfedError):
    """Fewer participants (or shares) survived a phase than the protocol's threshold requires.

    In secure aggregation, an abort before the unmasking reveals nothing beyond the transcript; an
    abort during it leaves the server with at most what a completed round would have given it.
    """

    def __init__(
        self,
        phase: str,
        alive: int,
        threshold: int,
        round: int | None = None,
        what: str = "participants alive",
        needed: str = "minimum survivors",
    ):
        self.phase, self.alive, self.threshold, self.round, self.what = (
            phase,
            alive,
            threshold,
            round,
            what,
        )
        #: what ``threshold`` counts: "minimum survivors" (secure aggregation's min_survivors,
        #: not its Shamir threshold t), "Shamir threshold t" (shares of one user), or the
        #: signatures a consistency round needs
        self.needed = needed
        where = f"round {round}, " if round is not None else ""
        super().__init__(
            f"{where}phase {phase!r}: {alive} {what}, below the {needed} ({threshold}); the round "
            "was aborted"
        )

    def __reduce__(self):
        return (type(self), (self.phase, self.alive, self.threshold, self.round, self.what))


class PartyFailed(RayfedError):
    """A party (or the coordinator) died or raised while running a step."""

    def __init__(self, party: str, round: int, phase: str, reason: str):
        self.party, self.round, self.phase, self.reason = party, round, phase, reason
        super().__init__(f"party {party!r} failed in round {round}, phase {phase!r}: {reason}")

    def __reduce__(self):
        return (type(self), (self.party, self.round, self.phase, self.reason))


class RoundTimeout(RayfedError, TimeoutError):
    """Some parties did not answer a phase within its deadline."""

    def __init__(self, parties: list[str], round: int, phase: str, deadline_s: float):
        self.parties, self.round, self.phase, self.deadline_s = (
            list(parties),
            round,
            phase,
            deadline_s,
        )
        super().__init__(
            f"round {round}, phase {phase!r}: no answer from {', '.join(self.parties)} within "
            f"{deadline_s:g} s; raise deadline_s or look at those actors' logs"
        )

    def __reduce__(self):
        return (type(self), (self.parties, self.round, self.phase, self.deadline_s))


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal (SIGINT: Ctrl-C, or SIGTERM).

    A KeyboardInterrupt, so code that stops on Ctrl-C stops on SIGTERM alike. ``rayfed run`` and
    ``rayfed stress`` raise it from their signal handlers; a run directory it reaches is marked
    ``interrupted`` with the round and phase, and the command exits ``128 + signum`` (130, 143).
    """

    #: the signal the CLI's handler last caught: Ray re-raises an exception a signal handler
    #: raised inside ``ray.get``/``ray.wait`` as a plain KeyboardInterrupt, losing its type
    caught: int | None = None

    def __init__(self, signum: int):
        import signal

        self.signum = signum
        self.signame = signal.Signals(signum).name
        super().__init__(self.signame)

    def __reduce__(self):
        return (type(self), (self.signum,))

    @staticmethod
    def signal_of(err: BaseException) -> int:
        """The signal behind an interruption: its own, else the one the CLI caught, else SIGINT
        (a plain Ctrl-C)."""
        import signal

        return getattr(err, "signum", None) or Interrupted.caught or int(signal.SIGINT)
