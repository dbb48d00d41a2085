"""Replay lanes on Dask distributed, for campaigns that outgrow one machine (``evolane[dask]``).

``--cluster local`` keeps in-process lanes; ``local:N`` starts a LocalCluster of N
single-threaded worker processes owned by the run; ``dask://HOST:PORT`` uses an existing
scheduler (started with ``allowed-failures`` 0). Every unit runs on its worker through the
same sandbox as a local lane; Dask itself is imported only when a Dask cluster is asked for.
"""

from typing import TYPE_CHECKING

from evolane._lazy import lazy_exports

if TYPE_CHECKING:
    from evolane.distributed._driver import DaskCluster, open_cluster
    from evolane.distributed._lane import DaskReplayLane
    from evolane.distributed._spec import (
        ClusterError,
        ClusterSpec,
        check_cluster,
        dask_available,
        parse_cluster,
    )

__all__ = [
    "ClusterError",
    "ClusterSpec",
    "DaskCluster",
    "DaskReplayLane",
    "check_cluster",
    "dask_available",
    "open_cluster",
    "parse_cluster",
]

__getattr__ = lazy_exports(__name__)
