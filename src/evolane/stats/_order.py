"""The seeded order in which a measurement reads its cases (DESIGN §6)."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable

import numpy as np


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
    if len(set(ids)) != len(ids):
        twice = sorted(case for case, count in Counter(ids).items() if count > 1)
        raise ValueError(f"duplicate case ids: {twice[:5]}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    keys = bytearray()  # every key in one buffer: no key object or tuple per case is kept
    for case in ids:
        keys += case_key(case, seed)
    words = np.frombuffer(bytes(keys), dtype=">u8").reshape(len(ids), 4)  # 32 bytes a key
    order = np.lexsort(words.T[::-1])  # by the first word, then the next, ...
    ordered = words[order]
    if (ordered[1:] == ordered[:-1]).all(axis=1).any():  # equal keys (practically never)
        return sorted(ids, key=lambda case: (case_key(case, seed), case))
    return [ids[index] for index in order]
