"""A secret group key among the parties, hidden from the coordinator (:mod:`rayfed.secagg.groupkey`),
as a recipe of three party steps and a driver helper: X25519 public keys, then key shares under
AES-GCM for every other party, then the XOR of the shares. The coordinator relays only public keys
and ciphertexts. vfl-kmeans (its hash keys) and hfl-kmeans (its pads) run it."""

from __future__ import annotations

from rayfed.actors.base import Message, StepContext
from rayfed.secagg import groupkey


def keygen_step(ctx: StepContext, *, purpose: str) -> Message:
    """Party: a fresh X25519 key pair and key share from its noise source (the OS in a secure run,
    the seeded ``purpose`` stream otherwise); publish the public key to the other parties."""
    secret = ctx.noise.secret_bytes(purpose, 64)
    ctx.state["group"], public = groupkey.new_member(secret)
    return Message("key_public", public, to="parties")


def key_share_step(ctx: StepContext, publics: dict[str, bytes], *, order: list[str]) -> Message:
    """Party: its key share, encrypted for every other party."""
    pubs = [publics[p] for p in order]
    shares = groupkey.encrypt_share(ctx.state["group"], order.index(ctx.name), pubs)
    return Message("key_shares", shares, to="parties")


def key_combine_step(
    ctx: StepContext,
    publics: dict[str, bytes],
    shares: dict[str, dict],
    *,
    order: list[str],
    slot: str,
) -> None:
    """Party: decrypt the shares addressed to it; the XOR of all shares is the group key, kept in
    ``ctx.state[slot]``."""
    me = order.index(ctx.name)
    pubs = [publics[p] for p in order]
    sent = {order.index(p): c for p, c in shares.items()}
    group = ctx.state.pop("group")
    ctx.state[slot] = groupkey.combine(group, me, pubs, sent)


def agree_group_key(fed, order: list[str], *, purpose: str, slot: str) -> None:
    """Driver: run the three steps on ``fed.parties`` (three phases, no message to the server)."""
    publics = fed.parties.run(keygen_step, purpose=purpose, phase="key-agreement")
    shares = fed.parties.run(key_share_step, publics, order=order, phase="key-shares")
    fed.parties.run(
        key_combine_step,
        publics,
        shares,
        order=order,
        slot=slot,
        phase="key-combine",
    )
