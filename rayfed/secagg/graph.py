"""The neighbour graph of a round: complete (SecAgg) or a random Harary graph (SecAgg+).

Users are addressed by their position in the round's sorted registry of user ids (0..n-1). The
random Harary graph is the ring power C_n^(k/2) with positions relabelled by a public uniformly
random permutation drawn from a seed and the round — the run's seed, or in secure mode the one
the server draws from the OS and sends with the key table: neighbours of u are the users at ring
slots π(u) ± 1, …, ± k/2. Every party computes the same graph from (seed, round), vectorised.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rayfed import rng


@dataclass(frozen=True)
class NeighbourGraph:
    n: int
    degree: int
    complete: bool
    slot: np.ndarray | None = None  # position -> ring slot
    at_slot: np.ndarray | None = None  # ring slot -> position

    @staticmethod
    def build(n: int, degree: int, complete: bool, seed: int, round: int) -> NeighbourGraph:
        if complete or degree >= n - 1:
            return NeighbourGraph(n, n - 1, True)
        if degree % 2:
            raise ValueError(f"a Harary graph needs an even degree, got {degree}")
        at_slot = rng.stream(seed, "secagg-graph", round, "harary").permutation(n)
        slot = np.empty(n, dtype=np.int64)
        slot[at_slot] = np.arange(n)
        return NeighbourGraph(n, degree, False, slot, at_slot)

    def neighbours(self, positions: np.ndarray) -> np.ndarray:
        """(len(positions), degree) neighbour positions, each row sorted."""
        positions = np.asarray(positions, dtype=np.int64)
        if self.complete:
            everyone = np.arange(self.n, dtype=np.int64)
            out = np.broadcast_to(everyone, (positions.size, self.n))
            return out[out != positions[:, None]].reshape(positions.size, self.n - 1)
        half = self.degree // 2
        offsets = np.concatenate([np.arange(-half, 0), np.arange(1, half + 1)])
        slots = (self.slot[positions][:, None] + offsets[None, :]) % self.n
        return np.sort(self.at_slot[slots], axis=1)

    def count_in(self, positions: np.ndarray, member: np.ndarray) -> np.ndarray:
        """Per position, how many of its neighbours the boolean array ``member`` marks: the
        neighbours' rows unsorted (a count needs no order), the complete graph's without a table."""
        positions = np.asarray(positions, dtype=np.int64)
        if self.complete:
            return np.count_nonzero(member) - member[positions].astype(np.int64)
        half = self.degree // 2
        offsets = np.concatenate([np.arange(-half, 0), np.arange(1, half + 1)])
        slots = (self.slot[positions][:, None] + offsets[None, :]) % self.n
        return member[self.at_slot[slots]].sum(axis=1)

    def are_neighbours(self, u: np.ndarray, v: np.ndarray) -> np.ndarray:
        u, v = np.asarray(u, dtype=np.int64), np.asarray(v, dtype=np.int64)
        if self.complete:
            return u != v
        d = np.abs(self.slot[u] - self.slot[v])
        d = np.minimum(d, self.n - d)
        return (d >= 1) & (d <= self.degree // 2)
