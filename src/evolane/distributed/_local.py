"""The LocalCluster evolane owns for ``--cluster local:N``: quiet, and closed to every
process without its credentials (a command may reach 127.0.0.1)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from evolane.distributed._spec import EXTRA_HINT, ClusterError, ClusterSpec
from evolane.sandbox import LEASE_VARIABLE

_QUIET = {
    # Workers here only run sandboxed subprocesses: sampling their stacks every 10 ms and
    # checking the event loop every 20 ms costs CPU the replays need on a small machine.
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "500ms",
    "distributed.admin.system-monitor.interval": "2s",
    "distributed.admin.system-monitor.gil.enabled": False,
    "distributed.worker.memory.monitor-interval": "1s",
    # No HTTP server answers on 127.0.0.1 either: the scheduler's and workers' plain HTTP
    # routes showed the cluster, its task keys (unit ids), logs and stacks to any command.
    "distributed.scheduler.http.routes": [],
    "distributed.worker.http.routes": [],
}


SCRATCH_FOLDER = "dask-scratch-space"
"""The name Dask gives every server's local directory (it appends it when missing)."""


def forget_scratch_folders() -> None:
    """Take the Dask servers' local directories off ``sys.path``, where each server puts
    its own (for ``upload_file``) and a worker process inherits its parent's.

    A confined command is shown the folders on ``sys.path`` (the interpreter's packages):
    every replay on a worker was shown the scratch space of every worker (other units'
    folders: their cases, candidates and outputs, live) and the scheduler's folder in
    ``/tmp``, and the driver's optimizer and judges the same (found by review)."""
    sys.path[:] = [entry for entry in sys.path if SCRATCH_FOLDER not in entry]


def local_cluster(spec: ClusterSpec, directory: Path, lease: str) -> Any:
    """A LocalCluster of ``spec.workers`` single-threaded worker processes, reachable only
    with this process's credentials (`_private_security`): no dashboard, nothing else."""
    import dask
    from distributed import LocalCluster

    security = _private_security()
    directory.mkdir(parents=True, exist_ok=True)
    with dask.config.set(_QUIET):  # the worker processes get this configuration too
        cluster = LocalCluster(
            n_workers=spec.workers,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            protocol="tls://",
            security=security,
            dashboard_address=None,
            # Their HTTP servers (no routes: `_QUIET`) on a free port of the loopback only:
            # the scheduler's took 8787 on every address, and warned on stderr when another
            # cluster had it ("Port 8787 is already in use", found in two test workers).
            worker_dashboard_address="127.0.0.1:0",
            silence_logs=logging.ERROR,
            local_directory=str(directory),
            scheduler_kwargs={
                "allowed_failures": 0,
                "dashboard": False,
                "dashboard_address": "127.0.0.1:0",
            },
            env={LEASE_VARIABLE: lease},
        )
    forget_scratch_folders()  # the scheduler's and the nannies' (here, in the driver)
    return cluster


def _private_security() -> Any:
    """Mutual TLS with a key and certificate made for this cluster alone, held in memory.

    A plain ``tcp://`` scheduler on 127.0.0.1 runs any function any local process sends it
    (``Client.run``) as evolane's user: a replay with network access (``process``, or
    ``confined`` with ``--network``) found it and ran code as root outside every sandbox
    (found by review). Without the key, which never touches the disk, a connection fails
    its handshake."""
    try:
        from distributed.security import Security

        return Security.temporary()
    except ImportError as error:  # the ``cryptography`` package makes the key
        raise ClusterError(f"a local Dask cluster needs cryptography: {EXTRA_HINT}") from error
