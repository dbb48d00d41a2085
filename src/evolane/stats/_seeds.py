"""Seeds derived from a run's seed: the same parts always give the same seed."""

from __future__ import annotations

import hashlib


def seed_for(*parts: object) -> int:
    """A seed in [0, 2**56) for whatever ``parts`` name (a run's seed first, then e.g. a case
    and a repetition): seven bytes of the SHA-256 of the parts joined with ``:``."""
    text = ":".join(str(part) for part in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:7], "big")
