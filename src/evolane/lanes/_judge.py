"""Judge lanes: score a replay output with a judge command, the case's verification
command, or an exact match against ``expected_output``. Every path has a timeout; a judge
that fails is an infrastructure outcome, retried, and never turned into a score of 0."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import trio

from evolane.inputs import (
    MAX_LINE_BYTES,
    VERIFICATION_PLACEHOLDERS,
    CommandTemplate,
    PriceTable,
    TemplateError,
)
from evolane.lanes._backends import ENDPOINT_EXIT, BackendCall, run_backend
from evolane.lanes._inproc import make_unit_dir, read_case, shared_tree, take_over
from evolane.lanes._program import judge_program_fault, verification_program_fault
from evolane.lanes._recycle import recycle_soon
from evolane.lanes._replay import CommandLane, excerpt, read_usage, run_lane_command
from evolane.lanes._replay_failure import (
    HOST_REFUSED,
    SPAWN_REFUSALS,
    refusal_wait,
    refused_by_host,
    spawn_refused,
)
from evolane.lanes._scratch import UnitScratch, replay_name
from evolane.lanes._usage import sum_usage
from evolane.messages import ArtifactRef, FailureEvent, JudgeJob, JudgeResult, Message, Usage
from evolane.sandbox import ProcessOutcome, UnitStop
from evolane.store import (
    BlobStore,
    BlobTooLargeError,
    FileEntry,
    NotRegularFileError,
    load_manifest,
    materialize_tree,
    read_regular_file,
)

MAX_ANSWER_BYTES = MAX_LINE_BYTES
"""Bytes of ``output.json`` the exact-match judge reads: an expected output comes from one
dataset line (at most `MAX_LINE_BYTES`), so a longer answer is scored 0 unread (a 150 MB
answer once took the judge from 62 to 820 MiB of memory)."""


FREE = Usage(tokens=0.0, cost_usd=0.0)
"""What an exact match or a verification command costs: no model is asked."""


@dataclass(frozen=True)
class _Verdict:
    score: float | None
    failure: FailureEvent | None = None
    detail: bytes = b""
    detail_ref: ArtifactRef | None = None  # already stored
    usage: Usage = FREE
    usage_complete: bool = True


JUDGE_ENDPOINT_FAILED = "judge_endpoint_failed"
"""A judge backend's model endpoint failed (HTTP 5xx, 401, retries or rate limits spent,
the network): nothing the candidate's output did, so such a unit is left out of the
comparison rather than scored 0 (`evolane.measure.unscored_counts_as_zero`)."""


def _limit(outcome: ProcessOutcome, what: str) -> _Verdict:
    """The failure of a judge (or verification) command that hit a limit: the run's
    (``limit_<names>``), or the host's pid limit alone (`HOST_REFUSED`: tried again after a
    wait, then the measurement stops, as for a replay; never a score of the output)."""
    if outcome.limits_hit == ("host_processes",):
        return _infra(HOST_REFUSED, f"{what}: {outcome.error}")
    return _infra(f"limit_{'_'.join(outcome.limits_hit)}", f"{what}: {outcome.error}")


SCORE_ROUNDING = 1e-9
"""How far outside [0, 1] a judge's score may lie and still be read, as the bound it rounds
to: a sum of weights is off by an ulp or two (nine checks worth 1/9 each sum to
1.0000000000000002). Found by review: such a score was refused as judge_bad_score, and a
refused judgement of a candidate's output counts 0, so its perfect answers scored as its
worst and the parent's were left out of the comparison."""


def unit_score(score: object) -> float | None:
    """``score`` as a score in [0, 1]: a number (not a bool) within `SCORE_ROUNDING` of the
    interval, clamped to it; None for anything else (NaN, infinities, 1.5, "1")."""
    if isinstance(score, bool) or not isinstance(score, int | float):
        return None
    if not -SCORE_ROUNDING <= score <= 1.0 + SCORE_ROUNDING:  # also refuses NaN
        return None
    return min(1.0, max(0.0, float(score)))


def _infra(code: str, message: str, spawn_errno: int | None = None) -> _Verdict:
    return _Verdict(
        None,
        FailureEvent(
            owner="infrastructure",
            stage="judge",
            code=code,
            message=message[:512],
            repairable=True,
            spawn_errno=spawn_errno,
        ),
    )


def parse_judge_output(stdout: bytes, *, complete: bool = True) -> _Verdict:
    """``{"score": float in [0, 1], ...}`` on stdout (the whole of it, or its last line).

    ``complete=False``: ``stdout`` is only the tail of a longer output (the capture keeps head
    and tail): its first line may be cut, so only the lines after it are read."""
    if complete:
        lines, candidates = stdout.splitlines(), [stdout]
    else:
        cut = stdout.find(b"\n")
        if cut < 0 or not stdout[cut + 1 :].strip():  # no whole line kept: its last is cut
            return _infra(
                "judge_output_too_long",
                f"the judge printed over {len(stdout)} bytes and its last line is longer than "
                "the tail kept of its output",
            )
        lines, candidates = stdout[cut + 1 :].splitlines(), []
    candidates += reversed([line for line in lines if line.strip()])
    for text in candidates:
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError:
            continue
        score = unit_score(data.get("score")) if isinstance(data, dict) else None
        if score is not None:
            return _Verdict(score, detail=text)
        return _infra(
            "judge_bad_score", f"the judge's score is not a number in [0, 1]: {excerpt(text)!r}"
        )
    return _infra("judge_not_json", f"the judge printed no JSON: {excerpt(stdout)!r}")


class JudgeLane(CommandLane):
    """Runs `JudgeJob`s; retries infrastructure failures ``settings.retries`` times, and a
    process the host refused `SPAWN_REFUSALS` times besides."""

    accepts = (JudgeJob,)

    async def receive(self, message: Message) -> JudgeResult:
        assert isinstance(message, JudgeJob)
        job = message
        started, deadline, stop = self.begin(job.unit_id, job.timeout_seconds)
        attempt, refusals, usage, complete = 0, 0, Usage(), True
        in_process = self.settings.backend is not None
        # The replay's own output folder, when its lane handed it over (first attempt only).
        handed = take_over(self.host, job.unit_id, job.output_ref) if in_process else None
        try:
            while True:
                attempt += 1
                if in_process:
                    first, handed = handed, None
                    source, verdict = (
                        "command",
                        await self._in_process(job, attempt, first, deadline, stop),
                    )
                else:
                    source, verdict = await self._attempt(job, attempt, deadline, stop)
                usage = sum_usage(usage, verdict.usage)
                complete = complete and verdict.usage_complete
                if verdict.failure is None or stop.is_set():
                    break
                if verdict.failure.code.startswith("limit_"):  # it would hit it again
                    break
                if refused_by_host(verdict.failure):  # the host's, for a moment or not: tried again
                    if refusals >= SPAWN_REFUSALS:  # as a replay's is, whatever the retries
                        break  # (found by review: with retries 0 one refusal stopped the run)
                    with trio.move_on_after(refusal_wait(refusals)):
                        await stop.wait()
                    refusals += 1
                    if stop.is_set():
                        break
                elif attempt - refusals > self.settings.retries:
                    break
                if trio.current_time() >= deadline:
                    break
        finally:
            self.stops.disarm(job.unit_id)
        detail_ref = verdict.detail_ref
        if verdict.detail and detail_ref is None:  # a thread hop only for a new blob
            detail_ref = self.store.stored(verdict.detail) or await trio.to_thread.run_sync(
                self.store.put_bytes, verdict.detail
            )
        status = (
            "cancelled"
            if stop.is_set() and verdict.failure
            else ("succeeded" if verdict.failure is None else "failed")
        )
        return JudgeResult(
            unit_id=job.unit_id,
            status=status,
            score=verdict.score,  # type: ignore[arg-type]
            source=source,
            failure=verdict.failure,
            detail_ref=detail_ref,  # type: ignore[arg-type]
            attempts=attempt,
            wall_seconds=trio.current_time() - started,
            usage=usage.model_copy(update={"wall_seconds": trio.current_time() - started}),
            usage_complete=complete,
        )

    async def _attempt(
        self, job: JudgeJob, attempt: int, deadline: float, stop: UnitStop
    ) -> tuple[str, _Verdict]:
        scratch = UnitScratch(self.host, self.store, replay_name(job) + "-judge", attempt)
        template = self.settings.template
        wants_candidate = template is not None and "candidate" in template.placeholders
        tree_ref = job.tree_ref if wants_candidate else None
        by_command = template is not None or self.settings.backend is not None
        try:
            case, matched = await trio.to_thread.run_sync(
                self._lay_out, scratch, job, tree_ref, not by_command
            )
            if by_command:
                return "command", await self._command(template, scratch, job, deadline, stop)
            if case.get("verification_command"):
                return "verification_command", await self._verification(
                    str(case["verification_command"]), scratch, job, deadline, stop
                )
            assert matched is not None
            return "exact_match", matched
        finally:
            self.host.remove_soon(scratch.dir)  # on the loop while small, else in a thread

    async def _in_process(
        self,
        job: JudgeJob,
        attempt: int,
        handed: Path | None,
        deadline: float,
        stop: UnitStop,
    ) -> _Verdict:
        """An in-process judge backend: the case read from the store, the replay's output
        folder as its lane left it (``handed``) or else laid out from the store, no other
        copy; the folder is removed afterwards, off the critical path."""
        assert self.settings.backend is not None
        scratch = UnitScratch(self.host, self.store, job.unit_id + "-judge", attempt)
        unit_dir = handed or scratch.dir
        try:
            case = read_case(self.store, job.case_ref)
            template = self.settings.template
            wants_candidate = template is not None and "candidate" in template.placeholders
            candidate = (
                await shared_tree(self.host, self.store, job.tree_ref) if wants_candidate else None
            )
            if handed is None:
                await trio.to_thread.run_sync(_lay_out_output, self.store, scratch, job)
            usage_file = unit_dir / "judge-usage.json"
            env = {
                "EVOLANE_SEED": str(job.seed),
                "EVOLANE_CASE_ID": job.case_id,
                "EVOLANE_USAGE_FILE": str(usage_file),
            }
            call = BackendCall(
                role="judge",
                workspace=unit_dir,
                seed=job.seed,
                env=env,
                case=case,
                candidate=candidate,
                output_dir=unit_dir / "out",
                usage_file=usage_file,
                attempt=attempt,
            )
            outcome = await run_backend(self.settings.backend, call, deadline, stop)
            verdict = command_verdict(outcome, backend=True)
            usage, complete = judge_usage(usage_file, outcome, self.settings.prices)
            return replace(verdict, usage=usage, usage_complete=complete)
        finally:
            recycle_soon(self.host, unit_dir)  # emptied for a next unit, or removed

    def _lay_out(
        self, scratch: UnitScratch, job: JudgeJob, tree_ref: ArtifactRef | None, no_command: bool
    ) -> tuple[dict[str, Any], _Verdict | None]:
        """In a thread: the case, and the exact-match verdict (detail stored) when that is how
        it is judged, read straight from the store when ``output.json`` is a plain file; else
        the unit's scratch directory for a command. One thread hop either way."""
        stored = orjson.loads(self.store.read_bytes(job.case_ref)) if no_command else None
        if stored is not None and not stored.get("verification_command"):
            answer = _stored_answer(self.store, job.output_ref)
            if answer is not None:
                return stored, self._with_detail(_exact_match(stored, answer))
        named = _names_case_file(self.settings.template, stored)
        case = scratch.prepare(job.case_ref, tree_ref, None, job.output_ref, case_file=named)
        if not no_command or case.get("verification_command"):
            return case, None
        answer = scratch.out / "output.json"  # laid out by us: its links stay inside
        verdict = _exact_match(
            case, partial(read_regular_file, answer, MAX_ANSWER_BYTES, follow_symlinks=True)
        )
        return case, self._with_detail(verdict)

    def _with_detail(self, verdict: _Verdict) -> _Verdict:
        if not verdict.detail:
            return verdict
        return replace(verdict, detail_ref=self.store.put_bytes(verdict.detail))

    async def _command(
        self,
        template: CommandTemplate | None,
        scratch: UnitScratch,
        job: JudgeJob,
        deadline: float,
        stop: UnitStop,
    ) -> _Verdict:
        """The judge command (or backend), its verdict priced by the usage it reported."""
        argv = template.render(scratch.placeholders(job.seed)) if template is not None else ()
        usage_file = scratch.usage_file("judge")
        env = {
            "EVOLANE_SEED": str(job.seed),
            "EVOLANE_CASE_ID": job.case_id,
            "EVOLANE_USAGE_FILE": str(usage_file),
        }
        outcome = await run_lane_command(
            self.host, self.settings, argv, scratch, "judge", env, deadline, stop
        )
        verdict = command_verdict(outcome)
        if outcome.status == "spawn_failed" and not spawn_refused(outcome.spawn_errno):
            fault = await trio.to_thread.run_sync(judge_program_fault, argv, scratch.candidate)
            verdict = verdict if fault is None else replace(verdict, failure=fault)
        usage, complete = await trio.to_thread.run_sync(
            judge_usage, usage_file, outcome, self.settings.prices
        )
        return replace(verdict, usage=usage, usage_complete=complete)

    async def _verification(
        self, command: str, scratch: UnitScratch, job: JudgeJob, deadline: float, stop: UnitStop
    ) -> _Verdict:
        try:
            template = _verification_template(command)
        except TemplateError as error:
            return _Verdict(
                None,
                FailureEvent(
                    owner="task", stage="judge", code="bad_verification", message=str(error)[:512]
                ),
            )
        argv = template.render(
            {k: v for k, v in scratch.placeholders(job.seed).items() if k in template.placeholders}
        )
        outcome = await run_lane_command(
            self.host, self.settings, argv, scratch, "verify", {}, deadline, stop
        )
        if outcome.status == "limit_exceeded":
            return _limit(outcome, "the verification command")
        if outcome.status == "spawn_failed":  # a program the replay wrote: the tree's doing
            made = await trio.to_thread.run_sync(verification_program_fault, argv, scratch.out)
            if made is not None:
                return _Verdict(None, made)
        if outcome.status in ("timed_out", "cancelled", "spawn_failed"):
            why = outcome.error or outcome.status
            return _infra(f"verification_{outcome.status}", why, outcome.spawn_errno)
        passed = outcome.ok
        return _Verdict(
            1.0 if passed else 0.0,
            detail=orjson.dumps(
                {"exit_code": outcome.exit_code, "stdout": excerpt(outcome.stdout.head)}
            ),
        )


def command_verdict(outcome: ProcessOutcome, backend: bool = False) -> _Verdict:
    """What a judge command's (or ``backend``'s) outcome says: a score, or an
    infrastructure failure; `JUDGE_ENDPOINT_FAILED` when a backend's endpoint failed."""
    if backend and outcome.exit_code == ENDPOINT_EXIT:
        return _infra(JUDGE_ENDPOINT_FAILED, f"the judge: {excerpt(outcome.stderr.head)}")
    if outcome.status == "limit_exceeded":
        return _limit(outcome, "the judge")
    if outcome.status in ("timed_out", "cancelled", "spawn_failed"):
        return _infra(
            f"judge_{outcome.status}", outcome.error or outcome.status, outcome.spawn_errno
        )
    if outcome.exit_code != 0:
        return _infra(
            f"judge_exit_{outcome.exit_code}",
            f"the judge failed: {excerpt(outcome.stderr.head)!r}",
        )
    stdout = outcome.stdout
    if stdout.truncated:  # the last-line rule holds for any size: read the tail
        return parse_judge_output(stdout.tail, complete=False)
    return parse_judge_output(stdout.head + stdout.tail)  # all of it: nothing was dropped


def _names_case_file(template: CommandTemplate | None, case: dict[str, Any] | None) -> bool:
    """Whether the judge's command (``template``, else ``case``'s verification command)
    names ``{case_file}``. None is laid out for one that does not: it may run the
    candidate's code or the replay's answer, which read the answers in it (found by review:
    ``python3 {output_dir}/solution.py`` printed ``../case.json``'s expected output)."""
    if template is not None:
        return "case_file" in template.placeholders
    command = case.get("verification_command") if case is not None else None
    if not isinstance(command, str):
        return False  # exact match: judged here, from the case row
    try:
        return "case_file" in _verification_template(command).placeholders
    except TemplateError:
        return True  # refused as bad_verification, as before


@functools.lru_cache(maxsize=256)
def _verification_template(command: str) -> CommandTemplate:
    """A case's verification command parsed (`TemplateError` when it is no template); kept,
    as a unit's judge reads it twice (`_names_case_file`, then to run it)."""
    return CommandTemplate.parse(command, role="verification", allowed=VERIFICATION_PLACEHOLDERS)


def _lay_out_output(store: BlobStore, scratch: UnitScratch, job: JudgeJob) -> None:
    """A fresh judge folder holding the replay's output (blocking I/O)."""
    make_unit_dir(scratch.dir)
    materialize_tree(store, job.output_ref, scratch.out, link=False, durable=False, writable=True)


def judge_usage(
    path: Path, outcome: ProcessOutcome, prices: PriceTable | None
) -> tuple[Usage, bool]:
    """What a judge used: its usage document (`read_usage`); none from a judge that
    succeeded says it spent nothing (a rule, not a model), none from one that failed or was
    stopped (deadline, cancel, limit) leaves it unknown (charged its reservation)."""
    if not os.path.lexists(path) and outcome.ok:
        return FREE.model_copy(update={"wall_seconds": outcome.wall_seconds}), True
    return read_usage(path, outcome, prices)


def _stored_answer(store: BlobStore, output_ref: ArtifactRef) -> Callable[[], bytes] | None:
    """How to read ``output.json`` of a replay's output tree from the store (None unless a
    plain file): an answer over `MAX_ANSWER_BYTES` is refused by its recorded size, unread."""
    entry = load_manifest(store, output_ref).get("output.json")
    if not isinstance(entry, FileEntry):
        return None

    def read() -> bytes:
        if entry.size > MAX_ANSWER_BYTES:
            raise BlobTooLargeError(f"output.json holds {entry.size} bytes")
        return store.read_bytes(entry.ref)

    return read


def _exact_match(case: dict[str, Any], read_answer: Callable[[], bytes]) -> _Verdict:
    if "expected_output" not in case:
        return _Verdict(
            None,
            FailureEvent(
                owner="task",
                stage="judge",
                code="no_judge",
                message="no judge command, no verification_command and no expected_output",
            ),
        )
    try:
        answer = orjson.loads(read_answer())
    except BlobTooLargeError as error:
        why = f"{error}, over the cap of {MAX_ANSWER_BYTES} bytes (MAX_ANSWER_BYTES): not read"
        return _Verdict(0.0, detail=orjson.dumps({"match": False, "error": why[:200]}))
    except (OSError, orjson.JSONDecodeError, NotRegularFileError) as error:
        return _Verdict(0.0, detail=orjson.dumps({"error": str(error)[:200]}))
    match = same_json(answer, case["expected_output"])
    return _Verdict(1.0 if match else 0.0, detail=orjson.dumps({"match": match}))


def same_json(answer: Any, expected: Any) -> bool:
    """Equal as JSON values: a boolean equals only a boolean (Python's ``True == 1`` let
    an answer ``true`` match an expected ``1``: found by review), numbers by value, arrays
    item by item, objects key by key. Iterative: an answer nests as deep as JSON allows."""
    pending = [(answer, expected)]
    while pending:
        mine, theirs = pending.pop()
        if isinstance(mine, bool) or isinstance(theirs, bool):
            if mine is not theirs:
                return False
        elif isinstance(mine, int | float) and isinstance(theirs, int | float):
            if mine != theirs:
                return False
        elif isinstance(mine, list) and isinstance(theirs, list):
            if len(mine) != len(theirs):
                return False
            pending.extend(zip(mine, theirs, strict=True))
        elif isinstance(mine, dict) and isinstance(theirs, dict):
            if mine.keys() != theirs.keys():
                return False
            pending.extend((mine[key], theirs[key]) for key in mine)
        elif type(mine) is not type(theirs) or mine != theirs:
            return False
    return True
