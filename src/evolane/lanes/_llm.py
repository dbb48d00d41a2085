"""The built-in model client: one chat-completions call to an OpenAI-compatible endpoint
(the official ``openai`` SDK, extra ``evolane[llm]``), shared by the LLM judge and optimizer.

Retries (decided here, once): the SDK's own retries are off (``max_retries=0``) so that our
AIMD limiter sees every 429. A 429 halves the endpoint's limit and is retried without
counting against ``Endpoint.retries``, bounded by the deadline (and by `RATE_LIMIT_TRIES`): a
positive ``Retry-After`` pauses every new caller of the endpoint for that long (capped); without
one (absent, 0 or negative) the call itself backs off exponentially (`rate_limit_backoff`). A
transient failure (connection error, request timeout, 408, 409, 5xx) is retried
``Endpoint.retries`` times with a short backoff. Any other HTTP error is raised at once as
`ModelError`. A wait for the endpoint (a pause, a backoff, a retry's interval, a place its
limit holds back after 429s) that would not end `wait_reserve` before the deadline ends the
call at once, as the endpoint's failure: cut by the deadline, a 429 storm was a timeout of
the judge, counted against a candidate (found by review). A request sent and cut by the
deadline stays a timeout: how long a model writes depends on what it reads. The API key is
read from the environment for each request and is never stored in evolane's objects, files
or messages; the credentials a ``base_url`` may carry (``user:pass@``) are taken out of every
message (`redact`).

An answer without a usable ``usage`` field (absent, negative, past belief) is metered by the
size of its request and answer (`text_tokens`: an estimate that errs high), never as 0
tokens; `Spend` meters the calls of one backend invocation, and every request of them cut
off or failed after sending (a retried one too) at least at its input (see
`evolane.lanes.usage_document`). The API key is hidden in every error message and answer
text a server sends back.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import trio

from evolane.lanes._llm_cache import cache_key, cache_read, cache_write
from evolane.lanes._llm_extra import LLM_EXTRA_HINT
from evolane.lanes._llm_http import capped_http_client
from evolane.lanes._llm_limit import AdaptiveLimiter, LimiterSettings, NoSlot, limiter_for
from evolane.lanes._llm_retry import (
    RATE_LIMIT_TRIES,
    MalformedResponse,
    RequestTimedOut,
    completion_problem,
    rate_limit_backoff,
    retry_after,
    retry_interval,
    transient,
    wait_reserve,
)
from evolane.lanes._llm_usage import (
    answer_usage,
    request_tokens,
    text_tokens,
    token_count,
)

LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
SDK_DEFAULT_URL = "sdk-default"  # the limiter key of an endpoint without a base_url


_USERINFO = re.compile(r"(?<=://)[^/\s]*@")  # greedy: a password may hold an "@"


def redact(text: str) -> str:
    """``text`` with the credentials of every URL in it (``scheme://user:pass@``) hidden."""
    return _USERINFO.sub("***@", text)


class ModelError(RuntimeError):
    """A model call that failed for good (HTTP error, retries spent, deadline passed); its
    message never holds a URL's credentials. ``sent``: whether a request may have reached
    the endpoint (and may be billed). ``endpoint_failed``: nothing the request held could
    have caused it (the endpoint, the network, the key or the setup failed), so a lane
    counts it as an infrastructure failure, never against the candidate (`ENDPOINT_EXIT`);
    False for what a request's content may cause: an HTTP 400, 413, 415 or 422 (a content
    filter, a context too long) and a timeout (a model told to write at length).
    ``timed_out``: no whole answer in time (cut at its timeout or the deadline, an HTTP 408:
    `evolane.lanes.llm_judge`'s canary tells the output's doing from a hung endpoint)."""

    def __init__(
        self,
        message: str,
        *,
        sent: bool = True,
        endpoint_failed: bool = True,
        timed_out: bool = False,
    ) -> None:
        super().__init__(redact(message))
        self.sent = sent
        self.endpoint_failed = endpoint_failed
        self.timed_out = timed_out


CONTENT_STATUSES = frozenset({400, 413, 415, 422})
"""HTTP statuses a request's content may cause (the rest of 4xx and 5xx are the endpoint's)."""


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible chat model: where it is and how to call it."""

    model: str
    base_url: str | None = None
    """None: the SDK's default (``OPENAI_BASE_URL`` or api.openai.com)."""
    api_key_env: str = "OPENAI_API_KEY"
    """The NAME of the variable holding the key (read at call time; a local server needs none)."""
    temperature: float | None = None
    max_tokens: int | None = None
    timeout: float | None = None
    """Seconds one request may take (also cut to the time left to the deadline)."""
    retries: int = 2
    """Retries of a transient failure (not of a 429: see the module docstring)."""
    cache_dir: Path | None = None
    """Answers are kept here by request, seed and sample, and replayed at no cost."""
    initial_concurrency: int = 8
    max_concurrency: int = 64
    """The AIMD limit of the endpoint's calls in flight starts and tops out here."""

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ValueError(f"retries must be 0 or more, not {self.retries}")
        if not 1 <= self.initial_concurrency <= self.max_concurrency:
            raise ValueError("need 1 <= initial_concurrency <= max_concurrency")
        if self.timeout is not None and self.timeout <= 0:
            raise ValueError(f"timeout must be positive, not {self.timeout}")

    @property
    def key(self) -> str:
        """The endpoint's identity for the shared limiter: its base URL (credentials hidden:
        the key is shown in the live view)."""
        return redact(self.base_url) if self.base_url else SDK_DEFAULT_URL

    @property
    def answered_by(self) -> str:
        """Where the answers come from, in a cache key: the base URL, else the one the SDK
        takes (``OPENAI_BASE_URL``, read as it makes the client): found by review, a run
        without ``--llm-base-url`` was served, after ``OPENAI_BASE_URL`` changed, the
        answers another server had given."""
        url = self.base_url or os.environ.get("OPENAI_BASE_URL", "")
        return redact(url) if url else SDK_DEFAULT_URL


@dataclass(frozen=True)
class ChatAnswer:
    """A model's answer and its usage document (see `usage_document`)."""

    text: str
    usage: dict[str, Any]


def api_key(endpoint: Endpoint) -> str:
    """The key from ``endpoint.api_key_env``; a local server without one gets a dummy key."""
    value = os.environ.get(endpoint.api_key_env)
    if value:
        return value
    host = urlsplit(endpoint.base_url).hostname if endpoint.base_url else None
    if host in LOCAL_HOSTS:
        return "none"
    where = endpoint.base_url or "the OpenAI API"
    raise ModelError(
        f"the environment variable {endpoint.api_key_env} is not set: it must hold the API key "
        f"for {where} (model {endpoint.model})",
        sent=False,
    )


_CLIENTS: trio.lowlevel.RunVar[dict[tuple[str, str], Any]] = trio.lowlevel.RunVar("llm_clients")


def _client(endpoint: Endpoint) -> Any:
    """The SDK client of ``endpoint``: one per base URL and key variable in each trio run
    (its connection pool belongs to the run's event loop)."""
    try:
        import openai
    except ImportError as error:
        raise ModelError(LLM_EXTRA_HINT, sent=False) from error
    try:
        clients = _CLIENTS.get()
    except LookupError:
        clients = {}
        _CLIENTS.set(clients)
    name = (endpoint.answered_by, endpoint.api_key_env)
    if name not in clients:

        async def key() -> str:  # read for each request: the client holds no key
            return api_key(endpoint)

        timeout = openai.NOT_GIVEN if endpoint.timeout is None else endpoint.timeout
        clients[name] = openai.AsyncOpenAI(
            base_url=endpoint.base_url,
            api_key=key,
            max_retries=0,
            timeout=timeout,
            http_client=capped_http_client(openai),
        )
    return clients[name]


def api_seed(seed: int, sample: int, attempt: int) -> int:
    """The ``seed`` sent to the API: distinct per sample and attempt (else a seeded model
    would answer every sample alike), stable across runs, within 31 bits."""
    digest = hashlib.sha256(f"{seed}:{sample}:{attempt}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def request_body(
    endpoint: Endpoint, messages: list[dict[str, str]], seed: int, sample: int, attempt: int
) -> dict[str, Any]:
    """What is sent for one call (also what its cache key hashes)."""
    body: dict[str, Any] = {
        "model": endpoint.model,
        "messages": messages,
        "seed": api_seed(seed, sample, attempt),
    }
    if endpoint.temperature is not None:
        body["temperature"] = endpoint.temperature
    if endpoint.max_tokens is not None:
        body["max_tokens"] = endpoint.max_tokens
    return body


async def chat(
    endpoint: Endpoint,
    messages: list[dict[str, str]],
    *,
    seed: int,
    sample: int,
    deadline: float,
    attempt: int = 0,
    cache_if: Callable[[str], object] | None = None,
    unanswered: Callable[[], object] | None = None,
    past_pause: bool = False,
) -> ChatAnswer:
    """Ask ``endpoint`` once (``sample``: which of several answers to the same question,
    ``attempt``: which retry of a rejected answer; both are part of the cache key and of the
    API seed, so repeated samples never collapse into one).

    With ``endpoint.cache_dir``, a new answer is kept there unless ``cache_if(text)`` raises
    (an answer its caller rejects is asked afresh next time); a cache that cannot be written
    is skipped, the answer still returned.

    ``deadline`` is on the trio clock (``math.inf``: none). Raises `ModelError` when the call
    fails for good or no answer came by the deadline (when an enclosing cancel scope has the
    same deadline, that scope's cancellation is what ends the call). A trio cancellation
    ends the request in flight. A cached answer costs 0 tokens and says ``"cached": true``.

    ``unanswered()`` is called once for every request that may have reached the endpoint
    and got no answer (failed, cut at its timeout or the deadline, cancelled; not a 429, nor
    one whose connection was never made), a retried one too: the caller meters what a
    provider may bill for it (found by review: a request cut at ``--llm-timeout`` and
    asked again, or a 5xx retried, was charged nothing).

    ``past_pause``: the first request goes out at once, past any ``Retry-After`` pause of
    the endpoint (one probe of whether it answers: `evolane.lanes.llm_judge`'s canary)."""
    body = request_body(endpoint, messages, seed, sample, attempt)
    key = cache_key(endpoint.answered_by, body, seed, sample, attempt) if endpoint.cache_dir else ""
    if endpoint.cache_dir is not None:
        text = await trio.to_thread.run_sync(cache_read, endpoint.cache_dir, key)
        if text is not None:
            return ChatAnswer(text, answer_usage(endpoint.model, cached=True))
    client = _client(endpoint)
    api_key(endpoint)  # a missing key is one clear error, before any request
    limiter = limiter_for(
        endpoint.key, LimiterSettings(endpoint.initial_concurrency, endpoint.max_concurrency)
    )
    answer = None
    with trio.move_on_at(deadline):
        answer = await _ask(client, limiter, endpoint, body, deadline, unanswered, past_pause)
    if answer is None:  # a slow answer may be the content's doing: not the endpoint's
        said = f"no answer from {endpoint.model} by the deadline"
        raise ModelError(said, endpoint_failed=False, timed_out=True)
    if endpoint.cache_dir is not None and _acceptable(cache_if, answer.text):
        with contextlib.suppress(OSError):
            await trio.to_thread.run_sync(cache_write, endpoint.cache_dir, key, answer.text)
    return answer


def _acceptable(check: Callable[[str], object] | None, text: str) -> bool:
    if check is None:
        return True
    try:
        check(text)
    except Exception:
        return False
    return True


async def _ask(
    client: Any,
    limiter: AdaptiveLimiter,
    endpoint: Endpoint,
    body: dict[str, Any],
    deadline: float,
    unanswered: Callable[[], object] | None = None,
    past_pause: bool = False,
) -> ChatAnswer:
    """The retry loop of one call (see the module docstring); ``unanswered`` and
    ``past_pause`` as `chat`'s."""
    import openai

    by = deadline - wait_reserve(deadline)  # a wait for the endpoint must end by then
    failures = rate_limits = 0
    sent = False  # a request may have reached the endpoint unanswered (not a 429)
    while True:
        pause: float | None = None
        first = past_pause and not (failures or rate_limits)
        try:
            async with limiter.slot(by, past_pause=first) as ticket:
                timeout = _request_timeout(endpoint, deadline)
                response, failure = None, None
                try:
                    response, failure = await _request(client, body, timeout)
                finally:  # a failure, a timeout, a cancellation: a request the provider may bill
                    limited = isinstance(failure, openai.RateLimitError)
                    if response is None and not limited and _reached(failure):
                        sent = True
                        if unanswered:
                            unanswered()
                if response is not None:
                    limiter.succeeded()
                    return _answer(endpoint, response, body)
                if isinstance(failure, openai.RateLimitError):
                    rate_limits += 1
                    pause = retry_after(failure.response.headers)
                    limiter.rate_limited(ticket, pause)
        except NoSlot as busy:
            raise _rate_limited(endpoint, f"no place: {busy}", sent) from None
        if isinstance(failure, openai.RateLimitError):  # a positive Retry-After pauses the
            if rate_limits >= RATE_LIMIT_TRIES:  # limiter, else this call backs off
                raise _rate_limited(endpoint, f"{rate_limits} answers 429", sent)
            if pause is None or pause <= 0:
                backoff = rate_limit_backoff(int(body["seed"]), rate_limits)
                if trio.current_time() + backoff >= by:
                    raise _rate_limited(endpoint, f"a backoff of {backoff:.2f} s", sent)
                await trio.sleep(backoff)
            continue
        assert failure is not None
        timed_out = isinstance(failure, openai.APITimeoutError | RequestTimedOut)
        if timed_out and trio.current_time() >= deadline:
            await trio.sleep_until(deadline)  # the deadline's own cancellation ends the call
        wait = retry_interval(failures)  # a retry that would come too late is not made
        if not transient(openai, failure) or failures >= endpoint.retries:
            raise _failed(endpoint, failure)
        if trio.current_time() + wait >= by:
            raise _failed(endpoint, failure)
        failures += 1
        await trio.sleep(wait)


async def _request(
    client: Any, body: dict[str, Any], timeout: float | None
) -> tuple[Any, Exception | None]:
    """One request: its response, or what ended it without one (an ``openai.APIError``, a
    429 included, a body that is not a completion, no whole answer within ``timeout``)."""
    import openai

    options = {} if timeout is None else {"timeout": timeout}
    # the SDK's timeout bounds each read: a server dripping bytes held a request to the
    # phase's deadline (found by review); this scope bounds the whole request
    with trio.move_on_after(math.inf if timeout is None else timeout):
        try:
            response = await client.chat.completions.create(**body, **options)
        except openai.APIError as error:
            return None, error
        except ModelError:  # evolane's own (the key, read for each request)
            raise
        except Exception as error:  # not JSON (or nested past parsing), too much, compressed
            said = str(error) or type(error).__name__
            return None, MalformedResponse(f"the answer is not a chat completion: {said}")
        problem = completion_problem(response)
        if problem is not None:
            return None, MalformedResponse(f"the answer is not a chat completion: {problem}")
        return response, None
    return None, RequestTimedOut(f"no whole answer within {timeout} s")


def _request_timeout(endpoint: Endpoint, deadline: float) -> float | None:
    left = deadline - trio.current_time()
    timeout = min(endpoint.timeout if endpoint.timeout is not None else math.inf, left)
    return None if math.isinf(timeout) else max(timeout, 0.001)


_NOT_CONNECTED = frozenset({"ConnectError", "ConnectTimeout"})
"""The HTTP client's errors (by name: the SDK's client library varies) of a request whose
connection was never made."""


def _reached(error: Exception | None) -> bool:
    """Whether a request that got no answer may have reached the endpoint: not when its
    connection was never made (refused, or no connection by its timeout)."""
    cause = error.__cause__ if error is not None else None
    return type(cause).__name__ not in _NOT_CONNECTED


def _rate_limited(endpoint: Endpoint, what: str, sent: bool) -> ModelError:
    """The endpoint's failure of a call that its rate limit kept from an answer in time
    (``sent``: a request of it got no answer otherwise than by a 429)."""
    where = endpoint.base_url or "the OpenAI API"
    said = f"{endpoint.model} at {where} rate limited (HTTP 429): no answer by the deadline"
    said += f" ({what})"
    return ModelError(said, sent=sent)


def without_key(endpoint: Endpoint, text: str) -> str:
    """``text`` with the endpoint's API key hidden wherever it appears (a server or proxy
    may echo it in an error or an answer: found by review, it reached report.json)."""
    key = os.environ.get(endpoint.api_key_env) or ""
    return text.replace(key, "***") if len(key) >= 8 else text


def _describe(endpoint: Endpoint, error: Exception, what: str) -> str:
    status = getattr(error, "status_code", None)
    where = endpoint.base_url or "the OpenAI API"
    head = f"{endpoint.model} at {where} {what}"
    head += f" (HTTP {status})" if status is not None else f" ({type(error).__name__})"
    said = without_key(endpoint, redact(str(error)))  # hidden before the cut
    return redact(f"{head}: {said[:300]}")


def _failed(endpoint: Endpoint, error: Exception) -> ModelError:
    """The `ModelError` of a call that failed for good with ``error``: the endpoint's
    failure unless the request's content may have caused it (a `CONTENT_STATUSES` answer, or
    a timeout: how long a model writes depends on what it reads, and an output can ask it to
    write at length, found by review)."""
    status = getattr(error, "status_code", None)
    import openai

    slow = isinstance(error, openai.APITimeoutError | RequestTimedOut) or status == 408
    return ModelError(
        _describe(endpoint, error, "failed"),
        sent=_reached(error),
        endpoint_failed=not slow and status not in CONTENT_STATUSES,
        timed_out=slow,
    )


def _answer(endpoint: Endpoint, response: Any, body: dict[str, Any]) -> ChatAnswer:
    """The first choice's text (the API key hidden) and the API's usage as a usage document;
    an answer that reports no usable input or output count (or 0 input tokens, or 0 output
    tokens for some text) is metered by `text_tokens` of the request and the answer (found
    by review: metered as unknown, such answers cost 0, and no token or dollar ceiling ever
    stopped a run)."""
    choices = getattr(response, "choices", None) or []
    text = without_key(endpoint, (choices[0].message.content if choices else None) or "")
    usage = getattr(response, "usage", None)
    inputs = token_count(getattr(usage, "prompt_tokens", None))
    outputs = token_count(getattr(usage, "completion_tokens", None))
    # no request is 0 tokens, no text is (found by review: a server reporting zeros was
    # charged $0 a call, and no ceiling stopped the run)
    if not inputs or outputs is None or (outputs == 0 and text):
        estimated = answer_usage(
            endpoint.model, request_tokens(body), text_tokens(text), cached=False
        )
        return ChatAnswer(text, {**estimated, "estimated": True})
    details = getattr(usage, "prompt_tokens_details", None)
    cached_input = min(token_count(getattr(details, "cached_tokens", None)) or 0, inputs)
    usage_doc = answer_usage(endpoint.model, inputs, outputs, cached_input, cached=False)
    return ChatAnswer(text, usage_doc)
