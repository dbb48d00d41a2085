"""Clustered cases: cases that are not independent of one another (DESIGN §6).

The follow-up turns of one agent session share the session's chain, and an edit that fixes
one of them tends to fix the others; a dataset's family of variants of one task is alike.
Treating such cases as independent makes the standard error too small: simulated with no
true gain and sessions of 5 cases (intra-class correlation 0.9), the paired gate at k = 1
(level 0.159) accepted 38% of candidates and the confirmation at 0.05 confirmed 15-21%
(``tests/test_stats_clusters.py``). A case may therefore name its *cluster*; the gates with
an error level (paired, bootstrap), the confirmation and online control then take each
cluster's mean delta as one observation: the mean is the mean over clusters, the SE and the
bootstrap are over clusters, and ``min_cases`` and ``min_coverage`` count clusters. When no
two cases share a cluster, everything is exactly as without clusters.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Collection, Iterable, Mapping, Sequence

import numpy as np

Clusters = Mapping[str, str]
"""Per case id, the name of its cluster; a case not named is a cluster of its own."""


def cluster_key(case: str, clusters: Clusters) -> tuple[int, str]:
    """The cluster of ``case``: a named one, or the case alone (never equal to a named one)."""
    name = clusters.get(case)
    return (0, case) if name is None else (1, name)


def clustered(ids: Iterable[str], clusters: Clusters | None) -> bool:
    """Whether two of ``ids`` share a cluster (else every case is its own: nothing changes)."""
    if not clusters:
        return False
    seen: set[str] = set()
    for case in ids:
        name = clusters.get(case)
        if name is None:
            continue
        if name in seen:
            return True
        seen.add(name)
    return False


def count_clusters(ids: Iterable[str], clusters: Clusters | None) -> int:
    """How many clusters ``ids`` fall into."""
    return len({cluster_key(case, clusters or {}) for case in ids})


def planned_clusters(planned_ids: Collection[str], n_planned: int, clusters: Clusters) -> int:
    """The clusters of a plan of ``n_planned`` cases of which ``planned_ids`` are known: the
    clusters of those, and each case not known (never scored by either arm) one of its own."""
    return count_clusters(planned_ids, clusters) + max(0, n_planned - len(planned_ids))


def cluster_means(
    ids: list[str], arms: tuple[np.ndarray, ...], clusters: Clusters | None
) -> tuple[list[str], tuple[np.ndarray, ...]]:
    """The cases ``ids`` (with one value per case in each of ``arms``) averaged by cluster:
    the clusters' names in sorted order, and per arm each cluster's mean (a correctly
    rounded sum over its cases); ``ids`` and ``arms`` themselves when no two cases share a
    cluster."""
    if not clustered(ids, clusters):
        return ids, arms
    assert clusters is not None
    groups: dict[tuple[int, str], list[int]] = {}
    for index, case in enumerate(ids):
        groups.setdefault(cluster_key(case, clusters), []).append(index)
    keys = sorted(groups)

    def means(values: np.ndarray) -> np.ndarray:
        rows = [values[groups[key]].tolist() for key in keys]
        return np.array([math.fsum(row) / len(row) for row in rows], dtype=np.float64)

    return [name for _, name in keys], tuple(means(values) for values in arms)


def together(ids: Iterable[str], clusters: Clusters | None) -> list[str]:
    """``ids`` with each cluster's cases moved up to its first case (stable): the clusters
    in the order their first cases come, each one's cases in their order. ``ids`` as they
    are when no two share a cluster."""
    ids = list(ids)
    members = cluster_members(ids, clusters)
    return ids if members is None else [case for group in members.values() for case in group]


def cluster_members(
    ids: Iterable[str], clusters: Clusters | None
) -> dict[tuple[int, str], list[str]] | None:
    """Each cluster's cases in ``ids`` (in their order), by `cluster_key`, the clusters in
    the order their first cases come; None when no two of them share a cluster."""
    ids = list(ids)
    if not clustered(ids, clusters):
        return None
    assert clusters is not None
    members: dict[tuple[int, str], list[str]] = {}
    for case in ids:
        members.setdefault(cluster_key(case, clusters), []).append(case)
    return members


def cluster_ends(ids: Sequence[str], clusters: Clusters) -> array[int]:
    """Where each cluster of ``ids`` ends (the index after its last case), in order, for
    ``ids`` that keep each cluster's cases together (`together`, `stats.cluster_order`);
    ValueError when a cluster comes back after another one. One integer per cluster."""
    ends: array[int] = array("q")
    seen: set[tuple[int, str]] = set()
    previous: tuple[int, str] | None = None
    for index, case in enumerate(ids):
        key = cluster_key(case, clusters)
        if key != previous:
            if key in seen:
                raise ValueError(f"cluster {key[1]!r} is not read in one run of cases")
            seen.add(key)
            if previous is not None:
                ends.append(index)
            previous = key
    if previous is not None:
        ends.append(len(ids))
    return ends
