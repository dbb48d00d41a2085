"""How a model call waits and retries (`evolane.lanes.chat`): the backoff after a 429, the
retry of a transient failure, the server's ``Retry-After``, and how long before its
deadline a wait for the endpoint must end (`wait_reserve`)."""

from __future__ import annotations

import email.utils
import hashlib
import math
import time
from typing import Any

import trio

RATE_LIMIT_TRIES = 100
"""429 answers one call accepts before it gives up (the deadline usually ends it first)."""
RATE_LIMIT_BACKOFF = 0.05
MAX_RATE_LIMIT_BACKOFF = 4.0
"""A 429 without a positive ``Retry-After``: the n-th waits about
``min(RATE_LIMIT_BACKOFF * 2**(n-1), MAX_RATE_LIMIT_BACKOFF)`` (half to all of it)."""
RETRY_INTERVAL = 0.25
MAX_RETRY_INTERVAL = 4.0
"""A transient failure's n-th retry waits ``min(RETRY_INTERVAL * 2**n, MAX_RETRY_INTERVAL)``."""
WAIT_RESERVE = 5.0
WAIT_RESERVE_SHARE = 0.25
"""A call's waits for the endpoint end this long before its deadline (`wait_reserve`)."""


def wait_reserve(deadline: float) -> float:
    """How long before ``deadline`` (trio clock) a call's waits for the endpoint must end:
    `WAIT_RESERVE`, or `WAIT_RESERVE_SHARE` of the time left when that is shorter. Room to
    report the endpoint's failure, and for the judge to ask its canary, before the deadline
    cuts the call: cut, a 429 storm was a timeout, counted against a candidate (found by
    review)."""
    return min(WAIT_RESERVE, WAIT_RESERVE_SHARE * max(0.0, deadline - trio.current_time()))


CANARY_RESERVE = 10.0
CANARY_RESERVE_SHARE = 0.25
"""A backend's requests end this long before its deadline (`CANARY_RESERVE`, or
`CANARY_RESERVE_SHARE` of the time left when that is shorter): room, after a timeout, to ask
whether the endpoint answers at all (the judge's canary, the optimizer's probe) and to
report the answer before the deadline cuts the call (`asks_by`)."""


def asks_by(deadline: float) -> float:
    """When (trio clock) a backend's requests must end for its canary to fit before
    ``deadline`` (see `CANARY_RESERVE`; ``math.inf`` stays so)."""
    left = max(0.0, deadline - trio.current_time())
    return deadline - min(CANARY_RESERVE, CANARY_RESERVE_SHARE * left)


def rate_limit_backoff(seed: int, tries: int) -> float:
    """Seconds a call waits after its ``tries``-th 429 that gave no positive ``Retry-After``:
    exponential from `RATE_LIMIT_BACKOFF`, capped at `MAX_RATE_LIMIT_BACKOFF`, with a jitter
    (half to all of it) drawn from the request's seed and the try, so calls spread out."""
    step = min(RATE_LIMIT_BACKOFF * 2 ** max(0, tries - 1), MAX_RATE_LIMIT_BACKOFF)
    digest = hashlib.sha256(f"{seed}:{tries}".encode()).digest()
    return step * (0.5 + 0.5 * int.from_bytes(digest[:4], "big") / 2**32)


def retry_interval(failures: int) -> float:
    """Seconds before the retry of a call's ``failures + 1``-th transient failure."""
    return min(RETRY_INTERVAL * 2**failures, MAX_RETRY_INTERVAL)


class RequestTimedOut(Exception):
    """A request with no whole answer within its timeout (a transient failure)."""


class MalformedResponse(Exception):
    """An answer that is not a chat completion at all (a transient failure)."""


def completion_problem(response: Any) -> str | None:
    """What makes a parsed answer no chat completion (None: it is one): no list of choices,
    a first choice without a message, a message whose content is neither text nor null. The
    SDK builds its objects from any JSON unchecked (found by review: ``{"choices": null}``
    and the like raised an AttributeError, counted against the candidate as its judge's
    failure, never retried)."""
    choices = getattr(response, "choices", None)
    if not isinstance(choices, list) or not choices:
        return "no choices"
    message = getattr(choices[0], "message", None)
    if message is None:
        return "no message in its first choice"
    content = getattr(message, "content", None)
    if content is not None and not isinstance(content, str):
        return f"its content is a {type(content).__name__}, not text"
    return None


def transient(openai: Any, error: Exception | None) -> bool:
    """A connection error, a request timeout, a body that is not a completion, 408, 409 or
    5xx: worth asking again."""
    if isinstance(error, openai.APIConnectionError | RequestTimedOut | MalformedResponse):
        return True
    status = getattr(error, "status_code", None)
    return isinstance(status, int) and (status in (408, 409) or status >= 500)


def retry_after(headers: Any) -> float | None:
    """Seconds the server asks callers to wait: ``retry-after-ms``, or ``retry-after`` as
    seconds or an HTTP date; None when it says nothing usable."""
    seconds = None
    try:
        if headers.get("retry-after-ms") is not None:
            seconds = float(headers["retry-after-ms"]) / 1000
        elif (value := headers.get("retry-after")) is not None:
            try:
                seconds = float(value)
            except ValueError:
                when = email.utils.parsedate_to_datetime(value).timestamp()
                seconds = max(0.0, when - time.time())
    except (ValueError, TypeError, OverflowError):
        return None
    # nan or inf says nothing usable (a nan made every call retry at once: found by review)
    return seconds if seconds is not None and math.isfinite(seconds) else None
