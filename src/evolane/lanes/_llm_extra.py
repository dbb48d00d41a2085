"""Whether the built-in model backends can run here: the ``evolane[llm]`` extra (the
``openai`` SDK, recent enough) is installed."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re

LLM_EXTRA_HINT = "the llm backends need the extra (openai>=1.106): pip install 'evolane[llm]'"
OPENAI_FLOOR = (1, 106)
"""The first openai release that takes the API key as an async callable, as `_client` gives
it (an older one failed every call: 'no running event loop')."""


def llm_available() -> bool:
    """True when the ``openai`` package can be imported and is at least `OPENAI_FLOOR` (the
    ``evolane[llm]`` extra)."""
    if importlib.util.find_spec("openai") is None:
        return False
    try:
        version = importlib.metadata.version("openai")
    except importlib.metadata.PackageNotFoundError:  # importable without metadata: try it
        return True
    release = re.match(r"(\d+)\.(\d+)", version)
    return release is None or (int(release[1]), int(release[2])) >= OPENAI_FLOOR
