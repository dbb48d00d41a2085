"""The built-in LLM optimizer: an in-process optimizer backend that shows a chat model the
prompt (as text) and the target's text files, and applies the edits it answers with
(`evolane.lanes._llm_edits`: whole files or search/replace blocks, all or none).

An answer whose edits cannot be parsed or applied is shown its error and asked again
(`EDIT_RETRIES` times); then the backend raises `EditError` naming the edit, which the lane
reports as the optimizer's failure. An answer without edits proposes nothing (the summary
says so). Every answer's tokens are metered, also when the backend raises; the usage says
``"partial": true`` when a call got no answer (cut by the deadline, cancelled, failed after
sending: the provider may bill it). A request with no whole answer in time is the
endpoint's failure when a short one gets none either (`_probe`, in time its requests keep
back before the deadline: `asks_by`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import trio

from evolane.lanes._backends import Backend, BackendCall
from evolane.lanes._llm import Endpoint, ModelError
from evolane.lanes._llm_edits import EDIT_FORMAT, EditError, apply_edits, parse_edits
from evolane.lanes._llm_files import folder_texts, render_texts
from evolane.lanes._llm_retry import asks_by
from evolane.lanes._llm_spend import Spend
from evolane.lanes._llm_usage import write_usage
from evolane.lanes._prompt_text import prompt_text

EDIT_RETRIES = 1
"""Asks again after an answer whose edits do not apply (with the error shown)."""
TARGET_FILES = 200
TARGET_FILE_BYTES = 32 << 10
TARGET_BYTES = 96 << 10
"""The model sees the target's text files within these bounds (a cut file says so)."""

OPTIMIZER_SYSTEM = (
    "You improve a target folder (an agent's skill, prompt or harness) so that it scores "
    "better on the failing cases without breaking the passing ones. Make small, focused "
    "edits. A file shown cut short must be edited with SEARCH/REPLACE, never rewritten whole.\n\n"
    + EDIT_FORMAT
)


def optimizer_messages(
    prompt: dict[str, Any], context_dir: Path | None, workdir: Path
) -> list[dict[str, str]]:
    """The chat messages for one proposal (reads bounded excerpts of both folders)."""
    files = folder_texts(
        workdir,
        max_files=TARGET_FILES,
        max_file_bytes=TARGET_FILE_BYTES,
        max_total_bytes=TARGET_BYTES,
    )
    user = (
        f"{prompt_text(prompt, context_dir)}\n\n"
        "The files of the target (paths relative to the folder you edit):\n"
        f"{render_texts(files, 'file') or '(the folder is empty)'}"
    )
    return [{"role": "system", "content": OPTIMIZER_SYSTEM}, {"role": "user", "content": user}]


PROBE = [{"role": "user", "content": "Answer with the one word: ok"}]
PROBE_ATTEMPT = 1_000_000
"""`_probe`'s request and its attempt number (part of the API seed)."""


async def _probe(
    endpoint: Endpoint, seed: int, deadline: float, spend: Spend, error: ModelError
) -> ModelError:
    """``error``, a proposal's request that got no whole answer in time, as the endpoint's
    failure when a short request (never from the cache, sent at once past any
    ``Retry-After`` pause) gets none by half the time left either: an endpoint that took
    the requests and never answered timed out every proposal, and the run ended
    ``finished``, its campaign ``complete``, having tried nothing, with no word of why
    (found by review). Answered: ``error`` as it was (a model slow on this proposal)."""
    now = trio.current_time()
    probe_deadline = now + (deadline - now) / 2 if math.isfinite(deadline) else deadline
    try:
        await spend.ask(
            replace(endpoint, cache_dir=None),
            PROBE,
            seed=seed,
            sample=0,
            deadline=probe_deadline,
            attempt=PROBE_ATTEMPT,
            past_pause=True,
        )
    except ModelError as probe:
        said = f"{error} (the endpoint did not answer a short request either: {probe})"
        return ModelError(said, sent=error.sent)
    return error


def _apply(workdir: Path, answer: str) -> str:
    """Apply the answer's edits; the one-line summary of what was done."""
    summary, edits = parse_edits(answer)
    if not edits:
        return f"no edits proposed{': ' + summary if summary else ''}"
    written = apply_edits(workdir, edits)
    return summary or f"edited {', '.join(written)}"[:200]


def llm_optimizer(endpoint: Endpoint) -> Backend:
    """An optimizer backend proposing with ``endpoint``'s model: it edits ``call.workdir``
    in place and returns ``{"summary": str, "usage": {...}}``; raises `EditError` when the
    edits cannot apply after `EDIT_RETRIES` more asks, `ModelError` when the model fails."""

    async def optimize(call: BackendCall) -> dict[str, Any]:
        assert call.workdir is not None, "an optimizer call has a workdir"
        workdir = call.workdir
        messages = await trio.to_thread.run_sync(
            optimizer_messages, call.prompt or {}, call.context_dir, workdir
        )
        deadline = trio.current_effective_deadline()
        spend = Spend(endpoint.model)
        try:
            for attempt in range(EDIT_RETRIES + 1):
                try:
                    answer = await spend.ask(
                        endpoint,
                        messages,
                        seed=call.seed,
                        sample=0,
                        deadline=asks_by(deadline),  # the rest is the probe's
                        attempt=attempt,
                        cache_if=parse_edits,  # an answer that does not parse is not kept
                    )
                except ModelError as error:
                    if not error.timed_out:
                        raise
                    raise await _probe(endpoint, call.seed, deadline, spend, error) from None
                try:
                    summary = await trio.to_thread.run_sync(_apply, workdir, answer.text)
                except EditError as error:
                    if attempt == EDIT_RETRIES:
                        raise
                    messages = [
                        *messages,
                        {"role": "assistant", "content": answer.text},
                        {
                            "role": "user",
                            "content": f"Nothing was applied: {error}. Answer again with the "
                            "complete set of edits, in the format given.",
                        },
                    ]
                    continue
                first_line = summary.splitlines()[0] if summary else ""
                return {"summary": first_line, "usage": spend.document()}
        except BaseException:
            if spend.total is not None or spend.unanswered:
                write_usage(call, spend.document())
            raise
        raise AssertionError("unreachable")

    return optimize
