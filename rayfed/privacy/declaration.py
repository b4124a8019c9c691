"""A protocol's privacy declaration: the budget, the accountant, the neighbour relation, how its
scopes compose, what the guarantee protects, and the releases it will charge — one typed object
built in ``plan`` and checked before any actor or run directory exists.

:meth:`PrivacyDeclaration.validate` is a dry run of the accounting: every declared
:class:`~rayfed.privacy.measurement.Measurement` must be of the declared relation and its event
supported by the declared accountant (dp-accounting's ``supports``). A failure is a
:class:`~rayfed.errors.DeclarationError` — a defect of the protocol, not of the user's options.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rayfed.errors import DeclarationError
from rayfed.privacy.domain import DataDomain, Neighbours
from rayfed.privacy.ledger import ACCOUNTANTS, Budget, make_accountant
from rayfed.privacy.measurement import Measurement

COMPOSITIONS = ("sequential", "parallel")


@dataclass(frozen=True)
class PrivacyDeclaration:
    """What a run's ledger is opened with, and the releases it will be charged.

    Parameters
    ----------
    budget:
        The (ε, δ) the ledger refuses to exceed (:meth:`Budget.none` for a run with no DP).
    accountant:
        ``"pure"`` (basic composition: pure-DP runs), ``"rdp"``, ``"pld"``, or ``"tightest"``
        (PLD and RDP side by side; the smaller ε is reported, with the one that gave it).
    relation:
        What one neighbour changes; every measurement must be of the same kind.
    composition:
        ``"parallel"`` (scopes hold disjoint data: the worst scope is the guarantee) or
        ``"sequential"``.
    statement:
        One sentence saying what the guarantee protects; the relation is prefixed to it.
    measurements:
        The releases the driver will charge, each built once here.
    requested_epsilon:
        The ε the user asked for, where a faithful mode's calibration costs more (the budget).
    data:
        Where the protected units' data lives in the plan's tables and its declared domain
        (the conformance suite's sensitivity check builds neighbours from it).
    """

    budget: Budget
    accountant: Literal["pure", "rdp", "pld", "tightest"]
    relation: Neighbours | None
    composition: Literal["sequential", "parallel"] = "sequential"
    statement: str = ""
    measurements: tuple[Measurement, ...] = field(default_factory=tuple)
    requested_epsilon: float | None = None
    data: DataDomain | None = None

    @staticmethod
    def none(statement: str) -> PrivacyDeclaration:
        """A run that adds no DP noise: its ledger refuses every charge."""
        return PrivacyDeclaration(Budget.none(), "pure", None, statement=statement)

    @property
    def private(self) -> bool:
        return self.budget != Budget.none()

    def validate(self, protocol: str) -> None:
        """DeclarationError unless the declaration is consistent (see the module docstring)."""

        def refuse(what: str, problem: str) -> None:
            raise DeclarationError(protocol, what, problem)

        if self.accountant not in ACCOUNTANTS:
            refuse("accountant", f"unknown accountant {self.accountant!r} (one of {ACCOUNTANTS})")
        if self.composition not in COMPOSITIONS:
            refuse("composition", f"unknown composition {self.composition!r}")
        if not self.private:
            if self.measurements:
                refuse("measurements", "a run with no privacy budget declares no release")
            return
        if not isinstance(self.relation, Neighbours):
            refuse("relation", f"a private run declares its Neighbours, got {self.relation!r}")
        if not self.statement.strip():
            refuse("statement", "a private run says what its guarantee protects")
        if not self.measurements:
            refuse("measurements", "a private run declares the releases it will charge")
        labels = [m.label for m in self.measurements]
        if len(set(labels)) != len(labels):
            refuse("measurements", f"two releases share a label: {sorted(labels)}")
        for m in self.measurements:
            if m.relation != self.relation:
                refuse(
                    f"measurements[{m.label!r}]",
                    f"its sensitivity is for neighbours {m.relation.describe()!r}, the "
                    f"declaration's are {self.relation.describe()!r}",
                )
            if m.sampling < 1 and self.relation.kind == "replace_one":
                refuse(
                    f"measurements[{m.label!r}]",
                    "Poisson sampling is accounted for add/remove-one neighbours only",
                )
            accountant = make_accountant(self.accountant, self.relation.kind)
            try:
                supported = accountant.supports(m.event)
            except TypeError:  # an event dp-accounting cannot even hash
                supported = False
            if not supported:
                refuse(
                    f"measurements[{m.label!r}]",
                    f"the {self.accountant} accountant cannot account {m.event} under "
                    f"{self.relation.kind} neighbours",
                )

    def full_statement(self) -> str:
        """The statement with the relation it holds for in front."""
        if self.relation is None or not self.private:
            return self.statement
        return f"neighbours: {self.relation.describe()}. {self.statement}"

    def ledger_options(self) -> dict:
        """The keyword arguments of :class:`~rayfed.privacy.ledger.PrivacyLedger`."""
        return dict(
            accountant=self.accountant,
            relation=self.relation.kind if self.relation is not None else "replace_one",
            composition=self.composition,
            statement=self.full_statement(),
            releases=[m.describe() for m in self.measurements],
            declared={m.label: m.event for m in self.measurements} if self.private else None,
        )
