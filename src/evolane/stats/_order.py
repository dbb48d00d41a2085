"""The seeded order in which a measurement reads its cases (DESIGN §6)."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable


def case_key(case_id: str, seed: int) -> bytes:
    """The sort key of ``case_id`` under ``seed``: sha256 of the seed and the id."""
    return hashlib.sha256(f"evolane-case-order\x00{seed}\x00{case_id}".encode()).digest()


def case_order(case_ids: Iterable[str], seed: int) -> list[str]:
    """The cases in a seeded pseudo-random order: a permutation that depends only on the set
    of ids and ``seed``.

    Each id is ranked by sha256(seed, id) (ties, practically impossible, by the id), so the
    order is the same on every Python version, platform and process (no `random`, no hash
    randomisation), does not depend on the order the ids come in (file order carries no
    weight), and adding or removing one case leaves the relative order of the others
    unchanged. Early stopping reads cases in this order, so a candidate that helps the first
    half of a file and hurts the second cannot win early on the order alone. Duplicate ids
    are refused.
    """
    ids = list(case_ids)
    twice = sorted(case for case, count in Counter(ids).items() if count > 1)
    if twice:
        raise ValueError(f"duplicate case ids: {twice[:5]}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    return sorted(ids, key=lambda case: (case_key(case, seed), case))
