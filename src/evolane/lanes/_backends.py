"""In-process backends: a replay, judge or optimizer that is an async Python callable instead
of a command, for an agent that wants to replay inside its own process.

A backend gets a `BackendCall` (the same files a command would get: the case, the candidate
tree, a workspace, an output directory, or the optimizer's workdir and prompt) and runs under
the unit's deadline and stop event; trio cancellation cancels it. What it returns or raises
is turned into the same `ProcessOutcome` a command would produce, so every lane keeps one
code path for collecting results:

- replay: return ``None`` or ``{"tokens": int, "cost_usd": float}`` (written as usage.json);
  write the answer to ``call.output_dir / "output.json"`` (or return it as ``{"output": ...}``).
- judge: return a score in [0, 1] or a verdict dict with ``"score"``.
- optimizer: edit ``call.workdir`` in place; return a one-line summary (or ``None``), or
  ``{"summary": str}``.

Any role may return a dict with ``"usage"``: a usage document (``tokens``, ``cost_usd``, or
``model`` with ``input_tokens``/``output_tokens``/``cached_input_tokens``, and ``cached``),
written to ``call.usage_file`` as a command would write ``$EVOLANE_USAGE_FILE``.

An exception is the backend's own failure (like a non-zero exit), never a score.
"""

from __future__ import annotations

import inspect
import math
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import trio

from evolane.actors import is_crash
from evolane.sandbox import ProcessOutcome, Stop, StreamCapture, cut_by
from evolane.supervisors import leaf_exceptions

CAPTURE_BYTES = 16 << 10


@dataclass(frozen=True)
class BackendCall:
    """What one backend invocation may read and write (paths are fresh per unit)."""

    role: str  # replay | judge | optimizer
    workspace: Path
    seed: int
    env: dict[str, str] = field(default_factory=dict)
    case: dict[str, Any] | None = None
    candidate: Path | None = None
    output_dir: Path | None = None
    workdir: Path | None = None
    prompt: dict[str, Any] | None = None
    context_dir: Path | None = None
    usage_file: Path | None = None
    """Where the call's usage document goes (the command's ``$EVOLANE_USAGE_FILE``)."""
    attempt: int = 1
    """The lane's attempt at this job (a judge retried after a failure asks afresh)."""


Backend = Callable[[BackendCall], Awaitable[Any]]
"""An in-process replay, judge or optimizer: ``async def backend(call: BackendCall) -> ...``."""


def _capture(data: bytes) -> StreamCapture:
    return StreamCapture(
        head=data[:CAPTURE_BYTES],
        tail=data[-CAPTURE_BYTES:] if len(data) > CAPTURE_BYTES else b"",
        total_bytes=len(data),
        truncated=len(data) > CAPTURE_BYTES,
    )


def _plain(value: Any) -> Any:
    """What orjson cannot write of a backend's value: a `float` or `int` subclass (a score
    computed with a library's own float type) as the plain number it is."""
    if isinstance(value, float):
        return float(value)
    if isinstance(value, int):
        return int(value)
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")


def _dumps(value: Any) -> bytes:
    """``value`` as JSON, numpy scalars and arrays included (a judge's ``np.mean(...)`` is a
    score: found by review, it failed every judgement with "Type is not JSON serializable:
    numpy.float64")."""
    return orjson.dumps(value, default=_plain, option=orjson.OPT_SERIALIZE_NUMPY)


def _verdict_line(verdict: dict[str, Any]) -> bytes:
    """A judge backend's verdict as the one line a judge command prints; one longer than the
    output kept (`CAPTURE_BYTES`: a long rationale) keeps its score and says how long it was
    (found by review: the score was lost, the unit failed as "the judge printed over 16384
    bytes", which an in-process judge never did)."""
    score = verdict.get("score")
    if isinstance(score, float) and not math.isfinite(score):  # JSON has none: orjson says null
        verdict = {**verdict, "score": str(float(score))}  # refused, named: "nan", "-inf"
    line = _dumps(verdict)
    if len(line) <= CAPTURE_BYTES:
        return line
    return _dumps({"score": verdict.get("score"), "verdict_bytes": len(line)})


def _stdout_for(call: BackendCall, value: Any) -> bytes:
    """What a command in the backend's place would have printed (and its usage file)."""
    if isinstance(value, dict) and isinstance(value.get("usage"), dict):
        if call.usage_file is not None:
            call.usage_file.write_bytes(_dumps(value["usage"]))
        value = {k: v for k, v in value.items() if k != "usage"}
        if call.role == "optimizer":
            value = value.get("summary")
    if call.role == "judge":
        return _verdict_line(value if isinstance(value, dict) else {"score": value})
    if call.role == "replay":
        if isinstance(value, dict) and "output" in value and call.output_dir is not None:
            (call.output_dir / "output.json").write_bytes(_dumps(value["output"]))
        if isinstance(value, dict) and {"tokens", "cost_usd"} <= value.keys():
            usage = {"tokens": value["tokens"], "cost_usd": value["cost_usd"]}
            if call.output_dir is not None:
                (call.output_dir / "usage.json").write_bytes(_dumps(usage))
        return b""
    return (str(value) + "\n").encode() if value is not None else b""


ENDPOINT_EXIT = 75
"""The exit code of a backend whose error says its endpoint failed (``endpoint_failed``,
as `ModelError` does): EX_TEMPFAIL. Only an in-process backend's: a command's exit code
may be the candidate's own."""


def _own_leaf(error: BaseException) -> bool:
    """Whether one exception (no group) is the backend's own failure: an exception, a
    ``sys.exit`` or any other `BaseException` an actor would count as its crash
    (`actors.is_crash`); a cancellation, a ``KeyboardInterrupt`` or a ``GeneratorExit`` is
    not."""
    return is_crash(error) and not isinstance(error, GeneratorExit)


def _own_failure(error: BaseException) -> bool:
    """Whether ``error`` is the backend's own failure (`_own_leaf`), or a group of nothing
    else (a ``sys.exit`` in a task of the backend's own nursery comes out as a
    `BaseExceptionGroup`, which hung the run as a bare one did: found by review)."""
    return all(_own_leaf(leaf) for leaf in leaf_exceptions(error))


def _stop_of(error: BaseException) -> BaseException:
    """What of ``error``, no failure of the backend, goes on: a group whose other leaves
    are only cancellations is cut to them (found by review: a backend whose task's cleanup
    raised as the deadline or a stop cancelled it left run_backend as an ExceptionGroup
    once the cancel scope took its Cancelled, a lane crash owned by the framework, not a
    timed-out or cancelled unit); anything else (a ``KeyboardInterrupt`` inside) as it is."""
    if not isinstance(error, BaseExceptionGroup):
        return error
    rest = error.subgroup(lambda e: not isinstance(e, BaseExceptionGroup) and not _own_leaf(e))
    if rest is None or not all(isinstance(e, trio.Cancelled) for e in leaf_exceptions(rest)):
        return error
    return rest


def _exit_code(error: BaseException) -> int:
    """The exit code a backend's error stands for: a ``sys.exit(N)`` (``argparse`` on bad
    arguments; the first in a group) its N, or 1 when N is 0 or no number (an exception is
    a failure, never a success); `ENDPOINT_EXIT` when the error says its endpoint failed;
    else 1."""
    exits = [leaf for leaf in leaf_exceptions(error) if isinstance(leaf, SystemExit)]
    if exits:
        code = exits[0].code
        return code if isinstance(code, int) and not isinstance(code, bool) and code else 1
    return ENDPOINT_EXIT if getattr(error, "endpoint_failed", False) is True else 1


BLOCKED_PAST = 1.0
"""Seconds past its deadline an in-process backend must have run without yielding before
its timeout is said to be its blocking of the event loop (`blocked_words`)."""


async def run_backend(
    backend: Backend, call: BackendCall, deadline: float, stop: Stop
) -> ProcessOutcome:
    """Run ``backend`` under ``deadline`` (trio clock) and ``stop``; never raises for the
    backend's own errors, ``sys.exit`` and any other `BaseException` an actor would count as
    its crash included (`actors.is_crash`: they become an exit code, `_exit_code`, with the
    error as stderr, owned by the task as an exception is, not a lane crash)."""
    started = time.monotonic()
    status, code, out, err, error = "exited", 0, b"", b"", ""
    returned = None  # trio's clock when the backend returned or raised its own error
    with trio.move_on_at(deadline) as timer:
        async with cut_by(stop):
            try:
                value = await _awaited(backend, call)
                returned = trio.current_time()
                out = _stdout_for(call, value)
            except BaseException as failure:  # the backend's failure, like a command's
                if not _own_failure(failure):
                    stop_of = _stop_of(failure)
                    if stop_of is failure:
                        raise
                    raise stop_of from None  # the cancel scopes above take it
                returned = trio.current_time()
                code = _exit_code(failure)
                leaves = leaf_exceptions(failure)  # a group's: what its tasks raised
                said = "".join(line for e in leaves for line in traceback.format_exception_only(e))
                err = said.encode()[-CAPTURE_BYTES:]
    if timer.cancelled_caught:
        status, code = "timed_out", None
        if returned is not None and returned > deadline + BLOCKED_PAST:
            error = blocked_words(returned - deadline)
    elif stop.is_set() and not out and code == 0:
        status, code = "cancelled", None
    return ProcessOutcome(
        status=status,  # type: ignore[arg-type]
        exit_code=code,
        wall_seconds=time.monotonic() - started,
        stdout=_capture(out),
        stderr=_capture(err),
        error=error,
    )


async def _awaited(backend: Backend, call: BackendCall) -> object:
    """What ``backend(call)`` gives, awaited; a `TypeError` naming the mistake when it gives
    no awaitable (a plain ``def`` backend: found by review, every unit failed with "object
    NoneType can't be used in 'await' expression", which named neither the backend nor the
    fix). A ``lambda call: coro(call)`` still passes: what it returns is awaitable."""
    pending = backend(call)
    if not inspect.isawaitable(pending):
        name = getattr(backend, "__qualname__", None) or type(backend).__name__
        raise TypeError(
            f"the in-process backend {name} returned {type(pending).__name__}, not an "
            "awaitable: define it with `async def` (a plain function would block the event "
            "loop; run blocking work through trio.to_thread.run_sync inside it)"
        )
    return await pending


def blocked_words(over: float) -> str:
    """Why an in-process backend outlived its deadline: it ran ``over`` seconds past it
    without once yielding to the event loop, so nothing could stop it, and no deadline, view
    or other lane of the run could act meanwhile (found by review: a backend that called
    ``time.sleep(40)`` under a 10 s deadline was said to be `killed at the deadline after
    40.0s`)."""
    return (
        f"ran {over:.1f}s past its deadline without yielding to the event loop (a blocking "
        "call in an async backend: time.sleep, a synchronous client; run it through "
        "trio.to_thread.run_sync): the whole run stood still meanwhile"
    )
