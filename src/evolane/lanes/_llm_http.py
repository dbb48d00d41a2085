"""The HTTP client under the model client's SDK: an answer's body is read up to
`MAX_RESPONSE_BYTES` and no further (found by review: a 300 MB body took a run from 100 MB
to 1 GB of memory, the SDK reading any body whole), and asked uncompressed, so the bytes
counted are the bytes kept: a compressed answer all the same is not read (found by review:
the cap counted the compressed bytes, and a 200 KB gzip body became a 200 MB answer, a
16 MiB one would be 16 GB)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from typing import Any

MAX_RESPONSE_BYTES = 16 << 20
"""The most bytes of one answer's body read (a chat completion is a few KiB to a few MiB)."""


class UnreadableResponse(Exception):
    """An answer whose body is not read (its connection is closed unread)."""


class ResponseTooLarge(UnreadableResponse):
    """An answer whose body is over `MAX_RESPONSE_BYTES`."""


UNCOMPRESSED = frozenset({"", "identity"})
"""The ``Content-Encoding`` values of a body read as it comes (the one evolane asks for)."""


def _too_large(size: int | str) -> ResponseTooLarge:
    return ResponseTooLarge(f"the answer's body is over {MAX_RESPONSE_BYTES} bytes ({size})")


async def _capped(stream: Any, limit: int) -> AsyncIterator[bytes]:
    seen = 0
    async for chunk in stream:
        seen += len(chunk)
        if seen > limit:
            raise _too_large(f"{seen} bytes read")
        yield chunk


async def _cap_body(response: Any) -> None:
    """A response hook (before the body is read): refuse a compressed body (its decoded size
    is not bounded by the bytes read) and a declared length over the cap, and wrap the
    body's stream so that reading past the cap raises `ResponseTooLarge`."""
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if encoding not in UNCOMPRESSED:
        raise UnreadableResponse(
            f"the answer is compressed ({encoding[:40]}) though asked uncompressed "
            "(Accept-Encoding: identity): its size would be bounded by nothing"
        )
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_RESPONSE_BYTES:
        raise _too_large(f"Content-Length {declared}")
    library = sys.modules[type(response).__module__.split(".")[0]]  # httpx, or its fork
    inner = response.stream

    class Capped(library.AsyncByteStream):  # type: ignore[name-defined,misc]
        def __aiter__(self) -> AsyncIterator[bytes]:
            return _capped(inner, MAX_RESPONSE_BYTES)

        async def aclose(self) -> None:
            await inner.aclose()

    response.stream = Capped()


def capped_http_client(openai: Any) -> Any:
    """An HTTP client for ``openai.AsyncOpenAI`` with the SDK's defaults, reading no answer
    past `MAX_RESPONSE_BYTES` and asking for uncompressed bodies."""
    return openai.DefaultAsyncHttpxClient(
        event_hooks={"response": [_cap_body]}, headers={"Accept-Encoding": "identity"}
    )
