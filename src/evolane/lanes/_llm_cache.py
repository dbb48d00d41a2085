"""The response cache of the model client (``--llm-cache``): an answer kept by its whole
request, endpoint, unit seed, sample and attempt, read back at no cost."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import orjson

from evolane.store import StoreError, read_regular_file, write_bytes_atomic

CACHE_ENTRY_BYTES = 4 << 20
"""The largest cache entry read back (a bigger one is asked again)."""


def cache_key(endpoint: str, body: dict[str, Any], seed: int, sample: int, attempt: int) -> str:
    """sha256 of the whole request, the endpoint, the unit's seed, the sample and attempt."""
    material = {
        "endpoint": endpoint,
        "body": body,
        "seed": seed,
        "sample": sample,
        "attempt": attempt,
    }
    return hashlib.sha256(orjson.dumps(material, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _cache_path(cache_dir: Path, key: str) -> Path:
    return cache_dir / key[:2] / f"{key}.json"


def cache_read(cache_dir: Path, key: str) -> str | None:
    """The answer kept under ``key`` (None: absent or damaged)."""
    try:
        entry = orjson.loads(read_regular_file(_cache_path(cache_dir, key), CACHE_ENTRY_BYTES))
    except (OSError, StoreError, orjson.JSONDecodeError):
        return None  # absent, or damaged: asked again and rewritten
    text = entry.get("text") if isinstance(entry, dict) else None
    return text if isinstance(text, str) else None


def cache_write(cache_dir: Path, key: str, text: str) -> None:
    """Keep ``text`` under ``key`` (atomically)."""
    path = _cache_path(cache_dir, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, orjson.dumps({"text": text}))
