"""The seeded order in which a measurement reads its cases (DESIGN §6)."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable

import numpy as np

from evolane.stats._clusters import Clusters, cluster_members


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


def cluster_order(case_ids: Iterable[str], seed: int, clusters: Clusters | None) -> list[str]:
    """The cases in `case_order`, each cluster's cases kept together: exactly `case_order`
    when no two of them share a cluster (`clustered`).

    Early stop on clustered cases reads whole clusters one after another, so a cluster's cases
    must be read together. Each cluster keeps its cases in their `case_order`; the clusters
    come in the order of a seeded key of their own: sha256(seed, name) for a named cluster,
    the case's own `case_key` for a case of no cluster. A key depends on neither the
    cluster's size nor its cases, so the clusters are read in a seeded pseudo-random order
    independent of what they hold (ordering by a cluster's first case would read large
    clusters first: the smallest of more keys is smaller), which the sequential test's
    exchangeable order needs.
    """
    ordered = case_order(case_ids, seed)
    members = cluster_members(ordered, clusters)
    if members is None:
        return ordered

    def rank(key: tuple[int, str]) -> tuple[bytes, int, str]:
        named, name = key
        digest = _cluster_hash(name, seed) if named else case_key(name, seed)
        return digest, named, name

    return [case for key in sorted(members, key=rank) for case in members[key]]


def _cluster_hash(name: str, seed: int) -> bytes:
    """The sort key of the cluster ``name`` under ``seed`` (apart from every case's key)."""
    return hashlib.sha256(f"evolane-cluster-order\x00{seed}\x00{name}".encode()).digest()
