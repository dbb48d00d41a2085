"""Where things live in a store directory: `StoreLayout` (the paths of its runs, campaigns
and objects), the ids that may name a run's or campaign's folder (`check_id`, `new_id`) and
whether a process holds a run now (`run_is_live`). Light on purpose: it reads no record, so
``evolane runs`` on an empty store, ``fsck`` and an unknown run's ``report`` load no model of
a run (`evolane.campaign._runs` holds those)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from evolane.inputs import InputError
from evolane.store import BlobStore

_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_id(value: str, what: str = "run") -> str:
    """``value`` when it can name a run's (or campaign's) folder: one path component of
    letters, digits, ``.``, ``_`` and ``-``, starting with a letter or digit, at most 128
    characters; else `InputError` (one line): an id never reaches outside the store."""
    if not _ID_RE.fullmatch(value):
        raise InputError(
            f"{value[:80]!r} is not a {what} id (letters, digits, '.', '_' and '-', "
            "starting with a letter or digit, at most 128 characters)"
        )
    return value


def new_id(prefix: str = "") -> str:
    """A sortable, unique id: ``20261129-204211-3f9a1c``."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return f"{prefix}{stamp}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class StoreLayout:
    """Paths inside the store directory (``.evolane/`` by default)."""

    root: Path

    @property
    def objects(self) -> Path:
        return self.root / "objects"

    @property
    def sandbox(self) -> Path:
        return self.root / "sandbox"

    def blobs(self) -> BlobStore:
        """The content-addressed object store (``objects/sha256/ab/<hex>``)."""
        return BlobStore(self.root)

    def run_dir(self, run_id: str) -> Path:
        """``runs/<run_id>``; `InputError` for an id that is not one (`check_id`)."""
        return self.root / "runs" / check_id(run_id, "run")

    def campaign_file(self, campaign_id: str) -> Path:
        """``campaigns/<id>/campaign.json``; `InputError` for an id that is not one."""
        return self.root / "campaigns" / check_id(campaign_id, "campaign") / "campaign.json"

    def run_ids(self) -> list[str]:
        """Every run with a ``run.json`` (of any kind: one that is not a file is refused
        where it is read, not taken for an unknown run), by id. A folder whose name is no
        run id (`check_id`) is none: evolane never makes one (`evolane fsck` names it)."""
        return self._ids("runs", "run.json")[0]

    def campaign_ids(self) -> list[str]:
        """Every campaign with a ``campaign.json``, by id (as `run_ids`)."""
        return self._ids("campaigns", "campaign.json")[0]

    def misnamed(self) -> list[Path]:
        """The run and campaign folders (holding a ``run.json`` or ``campaign.json``) whose
        names are no id: no command reads them (found by review: a copy named ``bad name``,
        or a name not UTF-8, made ``fsck`` and ``report`` fail with a traceback)."""
        return [*self._ids("runs", "run.json")[1], *self._ids("campaigns", "campaign.json")[1]]

    def _ids(self, kind: str, record: str) -> tuple[list[str], list[Path]]:
        """The ids of the folders of ``kind`` holding ``record``, and those named by no id."""
        ids, misnamed = [], []
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            for entry in os.scandir(self.root / kind):
                if not os.path.lexists(os.path.join(entry.path, record)):
                    continue
                if _ID_RE.fullmatch(entry.name):
                    ids.append(entry.name)
                else:
                    misnamed.append(Path(entry.path))
        return sorted(ids), sorted(misnamed)


def run_is_live(layout: StoreLayout, run_id: str) -> bool:
    """Whether a process has run ``run_id`` open right now (it holds its journal's lock).

    A probe only: a shared lock, released at once, so probes never exclude each other; a
    store whose locks cannot be probed (NFS without lock support: ENOLCK, EBADF) counts as
    live, so ``runs`` and ``watch`` never call a run killed, nor crash, on a guess."""
    journal = layout.run_dir(run_id) / "journal.jsonl"
    try:
        fd = os.open(journal, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO: no wait
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:  # EWOULDBLOCK: a live run holds it; anything else: cannot tell
        return True
    finally:
        os.close(fd)  # the probe's lock goes with its descriptor
    return False
