"""The built-in model client: one chat-completions call to an OpenAI-compatible endpoint
(the official ``openai`` SDK, extra ``evolane[llm]``), shared by the LLM judge and optimizer.

Retries (decided here, once): the SDK's own retries are off (``max_retries=0``) so that our
AIMD limiter sees every 429. A 429 halves the endpoint's limit and is retried without
counting against ``Endpoint.retries``, bounded by the deadline (and by `RATE_LIMIT_TRIES`): a
positive ``Retry-After`` pauses every new caller of the endpoint for that long (capped); without
one (absent, 0 or negative) the call itself backs off exponentially (`rate_limit_backoff`). A
transient failure (connection error, request timeout, 408, 409, 5xx) is retried
``Endpoint.retries`` times with a short backoff. Any other HTTP error is raised at once as
`ModelError`. The API key is read from the environment for each request and is never stored
in evolane's objects, files or messages; the credentials a ``base_url`` may carry
(``user:pass@``) are taken out of every message (`redact`).

An answer without a ``usage`` field is metered as unknown (``"partial": true``, no counts),
never as 0 tokens; `Spend` meters the calls of one backend invocation, a call cut off or
failed after sending included (see `evolane.lanes.usage_document`).
"""

from __future__ import annotations

import contextlib
import email.utils
import hashlib
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import trio

from evolane.lanes._backends import BackendCall
from evolane.lanes._llm_limit import AdaptiveLimiter, LimiterSettings, limiter_for
from evolane.lanes._usage import usage_document
from evolane.store import StoreError, read_regular_file, write_bytes_atomic

EXTRA_HINT = "the llm backends need the extra: pip install 'evolane[llm]'"
RATE_LIMIT_TRIES = 100
"""429 answers one call accepts before it gives up (the deadline usually ends it first)."""
RATE_LIMIT_BACKOFF = 0.05
MAX_RATE_LIMIT_BACKOFF = 4.0
"""A 429 without a positive ``Retry-After``: the n-th waits about
``min(RATE_LIMIT_BACKOFF * 2**(n-1), MAX_RATE_LIMIT_BACKOFF)`` (half to all of it)."""
RETRY_INTERVAL = 0.25
MAX_RETRY_INTERVAL = 4.0
"""A transient failure's n-th retry waits ``min(RETRY_INTERVAL * 2**n, MAX_RETRY_INTERVAL)``."""
CACHE_ENTRY_BYTES = 4 << 20
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
SDK_DEFAULT_URL = "sdk-default"  # the limiter key of an endpoint without a base_url


_USERINFO = re.compile(r"(?<=://)[^/\s]*@")  # greedy: a password may hold an "@"


def redact(text: str) -> str:
    """``text`` with the credentials of every URL in it (``scheme://user:pass@``) hidden."""
    return _USERINFO.sub("***@", text)


class ModelError(RuntimeError):
    """A model call that failed for good (HTTP error, retries spent, deadline passed); its
    message never holds a URL's credentials. ``sent``: whether a request may have reached
    the endpoint (and may be billed)."""

    def __init__(self, message: str, *, sent: bool = True) -> None:
        super().__init__(redact(message))
        self.sent = sent


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


@dataclass(frozen=True)
class ChatAnswer:
    """A model's answer and its usage document (see `usage_document`)."""

    text: str
    usage: dict[str, Any]


COUNTS = ("input_tokens", "output_tokens", "cached_input_tokens")


def _count(document: dict[str, Any], key: str) -> int | None:
    value = document.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def add_usage(total: dict[str, Any] | None, more: dict[str, Any]) -> dict[str, Any]:
    """Two usage documents summed: the counts either one has are added, and the sum is
    ``partial`` when either is (or lacks its input or output count: an answer whose usage
    was not reported); ``cached`` only when both answers came from the cache."""
    if total is None:
        return dict(more)
    both = (total, more)
    sums = []
    for key in COUNTS:
        values = [value for value in (_count(d, key) for d in both) if value is not None]
        sums.append(sum(values) if values else None)
    partial = any(
        d.get("partial") is True or _count(d, "input_tokens") is None
        or _count(d, "output_tokens") is None
        for d in both
    )  # fmt: skip
    model = total.get("model") or more.get("model")
    return answer_usage(
        str(model or ""),
        *sums,
        cached=bool(total.get("cached") and more.get("cached")),
        partial=partial,
    )


def answer_usage(
    model: str,
    inputs: int | None = 0,
    outputs: int | None = 0,
    cached_input: int | None = 0,
    *,
    cached: bool,
    partial: bool = False,
) -> dict[str, Any]:
    """The usage document of model answers: the counts given (0 when none was used; None:
    unknown, left out) and ``partial`` when some spend is not counted in it."""
    document = usage_document(
        inputs,
        outputs,
        cached_input_tokens=cached_input,
        model=model,
        cached=cached,
        partial=partial,
    )
    assert document is not None  # counts given or partial: never empty
    return {**document, "cached": cached}


def write_usage(call: BackendCall, usage: dict[str, Any]) -> None:
    """Meter ``usage`` in ``call.usage_file`` (for a backend about to raise: `run_backend`
    writes the usage of a returned value only)."""
    if call.usage_file is not None:
        call.usage_file.write_bytes(orjson.dumps(usage))


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
        raise ModelError(EXTRA_HINT, sent=False) from error
    try:
        clients = _CLIENTS.get()
    except LookupError:
        clients = {}
        _CLIENTS.set(clients)
    name = (endpoint.key, endpoint.api_key_env)
    if name not in clients:

        async def key() -> str:  # read for each request: the client holds no key
            return api_key(endpoint)

        timeout = openai.NOT_GIVEN if endpoint.timeout is None else endpoint.timeout
        clients[name] = openai.AsyncOpenAI(
            base_url=endpoint.base_url, api_key=key, max_retries=0, timeout=timeout
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


def cache_key(
    endpoint: Endpoint, body: dict[str, Any], seed: int, sample: int, attempt: int
) -> str:
    """sha256 of the whole request, the endpoint, the unit's seed, the sample and attempt."""
    material = {
        "endpoint": endpoint.key,
        "body": body,
        "seed": seed,
        "sample": sample,
        "attempt": attempt,
    }
    return hashlib.sha256(orjson.dumps(material, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _cache_path(cache_dir: Path, key: str) -> Path:
    return cache_dir / key[:2] / f"{key}.json"


def _cache_read(cache_dir: Path, key: str) -> str | None:
    try:
        entry = orjson.loads(read_regular_file(_cache_path(cache_dir, key), CACHE_ENTRY_BYTES))
    except (OSError, StoreError, orjson.JSONDecodeError):
        return None  # absent, or damaged: asked again and rewritten
    text = entry.get("text") if isinstance(entry, dict) else None
    return text if isinstance(text, str) else None


def _cache_write(cache_dir: Path, key: str, text: str) -> None:
    path = _cache_path(cache_dir, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, orjson.dumps({"text": text}))


async def chat(
    endpoint: Endpoint,
    messages: list[dict[str, str]],
    *,
    seed: int,
    sample: int,
    deadline: float,
    attempt: int = 0,
    cache_if: Callable[[str], object] | None = None,
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
    ends the request in flight. A cached answer costs 0 tokens and says ``"cached": true``."""
    body = request_body(endpoint, messages, seed, sample, attempt)
    key = cache_key(endpoint, body, seed, sample, attempt) if endpoint.cache_dir else ""
    if endpoint.cache_dir is not None:
        text = await trio.to_thread.run_sync(_cache_read, endpoint.cache_dir, key)
        if text is not None:
            return ChatAnswer(text, answer_usage(endpoint.model, cached=True))
    client = _client(endpoint)
    api_key(endpoint)  # a missing key is one clear error, before any request
    limiter = limiter_for(
        endpoint.key, LimiterSettings(endpoint.initial_concurrency, endpoint.max_concurrency)
    )
    answer = None
    with trio.move_on_at(deadline):
        answer = await _ask(client, limiter, endpoint, body, deadline)
    if answer is None:
        raise ModelError(f"no answer from {endpoint.model} by the deadline")
    if endpoint.cache_dir is not None and _acceptable(cache_if, answer.text):
        with contextlib.suppress(OSError):
            await trio.to_thread.run_sync(_cache_write, endpoint.cache_dir, key, answer.text)
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
    client: Any, limiter: AdaptiveLimiter, endpoint: Endpoint, body: dict[str, Any], deadline: float
) -> ChatAnswer:
    """The retry loop of one call (see the module docstring)."""
    import openai

    failures = rate_limits = 0
    while True:
        failure: Exception | None = None
        retry_after: float | None = None
        async with limiter.slot() as ticket:
            timeout = _request_timeout(endpoint, deadline)
            options = {} if timeout is None else {"timeout": timeout}
            try:
                response = await client.chat.completions.create(**body, **options)
            except openai.RateLimitError as error:
                rate_limits += 1
                retry_after = _retry_after(error.response.headers)
                limiter.rate_limited(ticket, retry_after)
                if rate_limits >= RATE_LIMIT_TRIES:
                    raise ModelError(_describe(endpoint, error, "rate limited")) from None
            except openai.APIError as error:
                failure = error
            else:
                limiter.succeeded()
                return _answer(endpoint, response)
        if failure is None:  # a 429: a positive Retry-After pauses the limiter, else back off
            if retry_after is None or retry_after <= 0:
                pause = rate_limit_backoff(int(body["seed"]), rate_limits)
                await trio.sleep(min(pause, max(0.0, deadline - trio.current_time())))
            continue
        if isinstance(failure, openai.APITimeoutError) and trio.current_time() >= deadline:
            await trio.sleep_until(deadline)  # the deadline's own cancellation ends the call
        if not _transient(openai, failure) or failures >= endpoint.retries:
            raise ModelError(_describe(endpoint, failure, "failed"))
        failures += 1
        await trio.sleep(min(RETRY_INTERVAL * 2 ** (failures - 1), MAX_RETRY_INTERVAL))


def rate_limit_backoff(seed: int, tries: int) -> float:
    """Seconds a call waits after its ``tries``-th 429 that gave no positive ``Retry-After``:
    exponential from `RATE_LIMIT_BACKOFF`, capped at `MAX_RATE_LIMIT_BACKOFF`, with a jitter
    (half to all of it) drawn from the request's seed and the try, so calls spread out."""
    step = min(RATE_LIMIT_BACKOFF * 2 ** max(0, tries - 1), MAX_RATE_LIMIT_BACKOFF)
    digest = hashlib.sha256(f"{seed}:{tries}".encode()).digest()
    return step * (0.5 + 0.5 * int.from_bytes(digest[:4], "big") / 2**32)


def _request_timeout(endpoint: Endpoint, deadline: float) -> float | None:
    left = deadline - trio.current_time()
    timeout = min(endpoint.timeout if endpoint.timeout is not None else math.inf, left)
    return None if math.isinf(timeout) else max(timeout, 0.001)


def _transient(openai: Any, error: Exception | None) -> bool:
    """A connection error, a request timeout, 408, 409 or 5xx: worth asking again."""
    if isinstance(error, openai.APIConnectionError):
        return True
    status = getattr(error, "status_code", None)
    return isinstance(status, int) and (status in (408, 409) or status >= 500)


def _retry_after(headers: Any) -> float | None:
    """Seconds the server asks callers to wait: ``retry-after-ms``, or ``retry-after`` as
    seconds or an HTTP date; None when it says nothing usable."""
    try:
        if headers.get("retry-after-ms") is not None:
            return float(headers["retry-after-ms"]) / 1000
        value = headers.get("retry-after")
        if value is not None:
            try:
                return float(value)
            except ValueError:
                when = email.utils.parsedate_to_datetime(value).timestamp()
                return max(0.0, when - time.time())
    except (ValueError, TypeError):
        pass
    return None


def _describe(endpoint: Endpoint, error: Exception, what: str) -> str:
    status = getattr(error, "status_code", None)
    where = endpoint.base_url or "the OpenAI API"
    head = f"{endpoint.model} at {where} {what}"
    head += f" (HTTP {status})" if status is not None else f" ({type(error).__name__})"
    return redact(f"{head}: {redact(str(error))[:300]}")  # hidden before the cut


def _answer(endpoint: Endpoint, response: Any) -> ChatAnswer:
    """The first choice's text and the API's usage as a usage document; an answer that
    reports no input or output count is metered as unknown (``partial``, no counts)."""
    choices = getattr(response, "choices", None) or []
    text = (choices[0].message.content if choices else None) or ""
    usage = getattr(response, "usage", None)
    inputs = _token_count(getattr(usage, "prompt_tokens", None))
    outputs = _token_count(getattr(usage, "completion_tokens", None))
    if inputs is None or outputs is None:
        return ChatAnswer(
            text, answer_usage(endpoint.model, None, None, None, cached=False, partial=True)
        )
    details = getattr(usage, "prompt_tokens_details", None)
    cached_input = _token_count(getattr(details, "cached_tokens", None)) or 0
    usage_doc = answer_usage(endpoint.model, inputs, outputs, cached_input, cached=False)
    return ChatAnswer(text, usage_doc)


def _token_count(value: Any) -> int | None:
    """A token count the API reported (None: absent or not a count)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        return None
    return int(value) if math.isfinite(value) else None


@dataclass
class Spend:
    """The usage of one backend invocation's model calls, as they come (`ask`): the answers'
    usage summed, and whether a call ended without its answer (cut by the deadline,
    cancelled, or failed after sending: a request the provider may bill), which makes the
    `document` ``partial``."""

    model: str
    total: dict[str, Any] | None = None
    unanswered: bool = False

    async def ask(
        self, endpoint: Endpoint, messages: list[dict[str, str]], **options: Any
    ) -> ChatAnswer:
        """`chat` with ``options``, its answer's usage (or its lack of one) metered."""
        try:
            answer = await chat(endpoint, messages, **options)
        except ModelError as error:
            self.unanswered = self.unanswered or error.sent
            raise
        except BaseException:
            self.unanswered = True
            raise
        self.total = add_usage(self.total, answer.usage)
        return answer

    def document(self) -> dict[str, Any]:
        """The usage document of the calls so far (no counts when none answered and one was
        cut off: unknown, not 0)."""
        if self.total is None:
            if self.unanswered:
                return answer_usage(self.model, None, None, None, cached=False, partial=True)
            return answer_usage(self.model, cached=False)
        if self.unanswered:
            return {**self.total, "partial": True, "cached": False}
        return dict(self.total)
