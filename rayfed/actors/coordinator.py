"""CoordinatorActor: the server / central coordinator of a run; it owns the privacy ledger."""

from __future__ import annotations

from rayfed.actors.base import RoleActor
from rayfed.errors import UnaccountedNoise
from rayfed.privacy.ledger import Budget, PrivacyLedger, PrivacyReport


class CoordinatorActor(RoleActor):
    """Holds no data partition; holds the run's :class:`PrivacyLedger` in ``ctx.ledger``."""

    role = "coordinator"

    def open_ledger(self, budget: Budget, **declaration) -> None:
        self.ctx.ledger = PrivacyLedger(budget, **declaration)

    def charge(self, charges: list[tuple], round: int) -> list[float]:
        """Charge ``(scope, label, event)`` triples in order, before their noise is drawn.

        All or nothing: if one would exceed the budget, none is recorded.
        """
        entries = self.ctx.ledger.charge_all(charges, round=round)
        return [e.epsilon_after for e in entries]

    def note(self, text: str) -> None:
        self.ctx.ledger.note(text)

    def verify_charged(self, events: list[tuple]) -> None:
        """Raise UnaccountedNoise unless every ``(scope, round, event)`` matches a ledger entry not
        matched before: each charge covers exactly one message carrying its event."""
        used = self.ctx.state.setdefault("ledger_entries_used", set())
        for scope, round, event in events:
            match = next(
                (
                    i
                    for i, e in enumerate(self.ctx.ledger.entries)
                    if i not in used and (e.scope, e.round, e.event) == (scope, round, event)
                ),
                None,
            )
            if match is None:
                raise UnaccountedNoise(
                    f"round {round}: a message from scope {scope!r} carries {event} that was not "
                    "charged to the privacy ledger before the noise was drawn (or was charged once "
                    "and sent twice)"
                )
            used.add(match)

    def privacy_report(self) -> PrivacyReport:
        return self.ctx.ledger.report()
