"""Where replay lanes run: ``local``, ``local:N`` or ``dask://HOST:PORT`` (no Dask import here)."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from typing import Literal

from evolane.inputs import InputError

EXTRA_HINT = "install the dask extra: pip install 'evolane[dask]'"
_ADDRESS = re.compile(r"^dask://(?P<host>[A-Za-z0-9_.\-]+|\[[0-9A-Fa-f:]+\]):(?P<port>\d{1,5})$")
_MAX_LOCAL_WORKERS = 256


class ClusterError(InputError):
    """A cluster that cannot be used: a bad ``--cluster`` value, no Dask, an unreachable or
    unsafe scheduler (one line; the CLI exits with code 2)."""


@dataclass(frozen=True)
class ClusterSpec:
    """A parsed ``--cluster`` value."""

    kind: Literal["local", "local_dask", "remote"]
    workers: int = 0
    address: str = ""

    @property
    def uses_dask(self) -> bool:
        """True for ``local:N`` and ``dask://``: replay lanes run on Dask workers."""
        return self.kind != "local"


def parse_cluster(text: str) -> ClusterSpec:
    """Parse ``local``, ``local:N`` (N >= 1) or ``dask://HOST:PORT``; raises `ClusterError`."""
    if text == "local":
        return ClusterSpec("local")
    if text.startswith("local:"):
        count = text.split(":", 1)[1]
        if not count.isdigit() or not 1 <= int(count) <= _MAX_LOCAL_WORKERS:
            raise ClusterError(f"--cluster {text}: expected local:N with 1 <= N <= 256")
        return ClusterSpec("local_dask", workers=int(count))
    if text.startswith("dask://"):
        match = _ADDRESS.match(text)
        if match is None or not 0 < int(match["port"]) < 65536:
            raise ClusterError(f"--cluster {text}: expected dask://HOST:PORT")
        return ClusterSpec("remote", address=f"tcp://{match['host']}:{match['port']}")
    raise ClusterError(f"--cluster {text}: choose local, local:N or dask://HOST:PORT")


def dask_available() -> bool:
    """True when ``distributed`` can be imported (the ``evolane[dask]`` extra is installed)."""
    return importlib.util.find_spec("distributed") is not None


def check_cluster(text: str) -> ClusterSpec:
    """`parse_cluster`, and for a Dask cluster also check that the extra is installed (a
    local one also needs ``cryptography`` for its TLS key: found by review, its absence
    failed the run only once it had started)."""
    spec = parse_cluster(text)
    if spec.uses_dask and not dask_available():
        raise ClusterError(f"--cluster {text}: {EXTRA_HINT}")
    if spec.kind == "local_dask" and importlib.util.find_spec("cryptography") is None:
        raise ClusterError(
            f"--cluster {text}: a local Dask cluster needs cryptography: {EXTRA_HINT}"
        )
    return spec
