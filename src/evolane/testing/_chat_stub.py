"""A real HTTP server on 127.0.0.1 that speaks the chat-completions API, for tests and
benchmarks of the model backends (never a mocked SDK).

Run it in a background thread (`ChatStub`) or as a process::

    python -m evolane.testing._chat_stub --port-file F [--script S.json] [--record R.jsonl]

It answers ``POST /v1/chat/completions`` as its `StubScript` says: a fixed latency, 429s
(a seeded fraction or the first N) with ``Retry-After``, a hang until the client leaves,
scripted contents (by a substring of the last user message, or a queue) and usage numbers.
It records every request and the most requests it had in flight at once.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import random
import select
import signal
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

POLL_INTERVAL = 0.02
"""How often a waiting answer checks whether its client left (seconds)."""
DEFAULT_CONTENT = '{"score": 1.0, "reason": "stub"}'


@dataclass
class StubRule:
    """Answer ``content`` when the last user message contains ``match`` ("" matches all);
    ``times``: how many requests it answers before it is used up (None: all)."""

    match: str
    content: str
    times: int | None = None


@dataclass
class StubScript:
    """How the stub answers (read for each request: a test may change it between calls)."""

    latency: float = 0.0
    rate_limit_fraction: float = 0.0
    rate_limit_count: int = 0
    rate_limit_after: int | None = None
    """Every request after the first N is answered 429 (a storm that starts mid-run)."""
    retry_after: float = 0.0
    hang: bool = False
    hang_after: int | None = None
    """Every request after the first N hangs (an endpoint that stops answering mid-run)."""
    hang_on: str = ""
    """A request whose last user message holds this text hangs (a model an output keeps
    writing)."""
    fail_count: int = 0
    """The first N requests (after any 429s) are answered ``fail_status``."""
    fail_status: int = 500
    echo_auth: bool = False
    """A scripted failure's message repeats the request's Authorization header (as some
    proxies do)."""
    retry_after_text: str | None = None
    """The 429s' ``Retry-After`` header as written (no ``retry-after-ms``): e.g. "nan"."""
    raw_body: str | None = None
    """Answer 200 with this body (not a completion, not even JSON)."""
    drip: float = 0.0
    """Seconds between the bytes of an answer's body (a server that sends it slowly)."""
    flood: int = 0
    """Answer 200 with a body this many bytes long, sent without a length until the client
    leaves (a server gone wrong); `StubStats.flooded` counts the bytes it got out."""
    gzip: bool = False
    """Answer with a gzip-compressed body (``Content-Encoding: gzip``) whatever the request
    asked (a server or proxy that ignores ``Accept-Encoding``)."""
    refuse: str = ""
    """Answer ``refuse_status`` to a request whose last user message holds this text (a
    firewall or guardrail in front of the model, blocking what a request says)."""
    refuse_status: int = 403
    """(429: with the 429s' ``Retry-After``, as a rate limit on a request's size.)"""
    rules: list[StubRule] = field(default_factory=list)
    contents: list[str] = field(default_factory=list)
    """A queue of contents, answered in order before the rules and the default."""
    default_content: str = DEFAULT_CONTENT
    grade: list[str] | None = None
    """Answer a judge request (after the rules) like a competent judge (`grade_request`):
    ``[]`` scores 1 when the output's ``output.json`` equals the case's ``expected_output``;
    field names score the share of those fields that are equal in both."""
    prompt_tokens: int = 10
    completion_tokens: int = 5
    cached_tokens: int = 0
    seed: int = 0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StubScript:
        """A script from its JSON form (``rules`` as a list of objects)."""
        values = dict(data)
        values["rules"] = [StubRule(**rule) for rule in values.get("rules", [])]
        return cls(**values)


@dataclass
class StubStats:
    """What the stub saw."""

    requests: int = 0
    answered: int = 0
    rate_limited: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    disconnects: int = 0
    """Requests whose client left before the answer (a hang or latency cut short)."""
    flooded: int = 0
    """Bytes of flood bodies (`StubScript.flood`) written before their clients left."""
    bodies: list[dict[str, Any]] = field(default_factory=list)
    cut: list[dict[str, Any]] = field(default_factory=list)
    """The bodies of those requests (what a client sent and got no answer to)."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the client's pool reuses connections
    disable_nagle_algorithm = True  # else headers and body wait on a delayed ACK (40 ms)
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw)
        except ValueError:
            self._send(400, {"error": {"message": "not JSON"}})
            return
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send(404, {"error": {"message": f"no route {self.path}"}})
            return
        stub = self.server.stub
        script, limited, failed, late = stub.admit(body)
        try:
            if limited:
                headers = {"Retry-After": str(script.retry_after)}
                headers["retry-after-ms"] = str(int(script.retry_after * 1000))
                if script.retry_after_text is not None:
                    headers = {"Retry-After": script.retry_after_text}
                self._send(429, {"error": {"message": "rate limited", "type": "rate"}}, headers)
                return
            if script.refuse and script.refuse in _last_user(body):
                status = script.refuse_status
                pause = {"Retry-After": str(script.retry_after)} if status == 429 else {}
                self._send(status, {"error": {"message": "blocked by policy"}}, pause)
                return
            if failed:
                said = "scripted failure"
                if script.echo_auth:
                    said += f": {self.headers.get('Authorization')} is not a valid key"
                self._send(script.fail_status, {"error": {"message": said}})
                return
            if script.flood:
                self._flood(script.flood)
                return
            hung = script.hang or (script.hang_on and script.hang_on in _last_user(body))
            wait = float("inf") if hung or late else script.latency
            if not self._wait(wait):
                stub.note_disconnect(body)
                return
            content = stub.content_for(body)
            answer = script.raw_body if script.raw_body is not None else None
            self._send(
                200,
                _completion(body, content, script),
                raw=answer,
                drip=script.drip,
                compress=script.gzip,
            )
            stub.note_answered()
        finally:
            stub.leave()

    def _flood(self, size: int) -> None:
        """A 200 whose body (a completion's start, then filler) ends with the connection."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        chunk, sent = b'{"choices": [{"message": {"content": "' + b"x" * (64 << 10), 0
        try:
            while sent < size and not self.server.closing.is_set():
                self.wfile.write(chunk)
                sent += len(chunk)
        except OSError:
            pass
        finally:
            with self.server.stub._lock:
                self.server.stub.stats.flooded += sent

    def _wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` (inf: until the server closes); False when the client left."""
        end = time.monotonic() + seconds
        while not self.server.closing.is_set():
            left = end - time.monotonic()
            if left <= 0:
                return True
            readable, _, _ = select.select([self.connection], [], [], min(left, POLL_INTERVAL))
            if readable:
                try:
                    if self.connection.recv(1, socket.MSG_PEEK) == b"":
                        return False
                except OSError:
                    return False
        return False

    def _send(
        self,
        status: int,
        value: Any,
        headers: dict[str, str] | None = None,
        *,
        raw: str | None = None,
        drip: float = 0.0,
        compress: bool = False,
    ) -> None:
        data = raw.encode() if raw is not None else json.dumps(value).encode()
        data = gzip.compress(data) if compress else data
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if compress:
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(data)))
        for name, text in (headers or {}).items():
            self.send_header(name, text)
        self.end_headers()
        with contextlib.suppress(OSError):
            if drip <= 0:
                self.wfile.write(data)
                return
            for index in range(len(data)):  # ends when the client leaves (a write fails)
                self.wfile.write(data[index : index + 1])
                self.wfile.flush()
                if self.server.closing.wait(drip):
                    return


def _last_user(body: dict[str, Any]) -> str:
    """The text of a request's last user message ("" when it has none)."""
    last = ""
    for message in body.get("messages") or []:
        if isinstance(message, dict) and message.get("role") == "user":
            last = str(message.get("content", ""))
    return last


def _completion(body: dict[str, Any], content: str, script: StubScript) -> dict[str, Any]:
    return {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "stub"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": script.prompt_tokens,
            "completion_tokens": script.completion_tokens,
            "total_tokens": script.prompt_tokens + script.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": script.cached_tokens},
        },
    }


_CASE, _OUTPUT, _ANSWER = "The case:\n", "\n\nThe agent's output", "--- output file: output.json"
_END = "\n<<<END OUTPUT "


def grade_request(message: str, fields: list[str]) -> str | None:
    """The verdict on a built-in judge's request (its case and output excerpts): ``output.json``
    against the case's ``expected_output``, whole (no ``fields``) or by ``fields``; None when
    ``message`` is not a judge request."""
    case_at, output_at = message.find(_CASE), message.find(_OUTPUT)
    if case_at < 0 or output_at < case_at:
        return None
    try:
        case = json.loads(message[case_at + len(_CASE) : output_at])
    except ValueError:
        return None
    answer_at = message.find(_ANSWER, output_at)
    if answer_at < 0 or not isinstance(case, dict):
        return json.dumps({"score": 0.0, "reason": "no output.json"})
    text = message[message.find("\n", answer_at) + 1 :]
    text = text.split("\n--- output file: ", 1)[0].rsplit(_END, 1)[0]
    try:
        answer = json.loads(text)
    except ValueError:
        return json.dumps({"score": 0.0, "reason": "output.json is not JSON"})
    expected = case.get("expected_output")
    if not fields:
        score = float(answer == expected)
    elif not isinstance(answer, dict) or not isinstance(expected, dict):
        score = 0.0
    else:
        score = sum(answer.get(f) == expected.get(f) for f in fields) / len(fields)
    return json.dumps({"score": score, "reason": f"{score:.2f} of the fields match"})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, stub: ChatStub, port: int) -> None:
        self.stub = stub
        self.closing = threading.Event()
        super().__init__(("127.0.0.1", port), _Handler)


class ChatStub:
    """The stub server, started with `start` (or ``with ChatStub() as stub``), served from a
    background thread; ``base_url`` is what an `Endpoint` points at."""

    def __init__(self, script: StubScript | None = None, record: Path | None = None) -> None:
        self.script = script or StubScript()
        self.record = record
        self.stats = StubStats()
        self._lock = threading.Lock()
        self._rng = random.Random(self.script.seed)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._server is not None, "the stub is not started"
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, port: int = 0) -> ChatStub:
        """Listen on 127.0.0.1:``port`` (0: a free one) and serve from a daemon thread."""
        self._server = _Server(self, port)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; waiting answers end (their clients see the connection close)."""
        if self._server is not None:
            self._server.closing.set()
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> ChatStub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def admit(self, body: dict[str, Any]) -> tuple[StubScript, bool, bool, bool]:
        """Count a request in; whether it is to be answered 429, whether with a scripted
        failure, and whether it comes after `StubScript.hang_after`."""
        with self._lock:
            script, stats = self.script, self.stats
            stats.requests += 1
            stats.bodies.append(body)
            stats.in_flight += 1
            stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
            limited = False
            if script.rate_limit_count > 0:
                script.rate_limit_count -= 1
                limited = True
            elif script.rate_limit_after is not None:
                limited = stats.requests > script.rate_limit_after
            elif script.rate_limit_fraction > 0:
                limited = self._rng.random() < script.rate_limit_fraction
            stats.rate_limited += limited
            failed = not limited and script.fail_count > 0
            script.fail_count -= failed
            if self.record is not None:
                with self.record.open("a") as out:
                    out.write(json.dumps({"body": body, "rate_limited": limited}) + "\n")
            late = script.hang_after is not None and stats.requests > script.hang_after
            return script, limited, failed, late

    def content_for(self, body: dict[str, Any]) -> str:
        """The scripted content for a request: the queue first, then the first rule whose
        substring is in the last user message, then the default."""
        last = _last_user(body)
        with self._lock:
            if self.script.contents:
                return self.script.contents.pop(0)
            for rule in self.script.rules:
                if rule.match in last and (rule.times is None or rule.times > 0):
                    if rule.times is not None:
                        rule.times -= 1
                    return rule.content
            fields = self.script.grade
            graded = grade_request(last, fields) if fields is not None else None
            return graded if graded is not None else self.script.default_content

    def note_answered(self) -> None:
        with self._lock:
            self.stats.answered += 1

    def note_disconnect(self, body: dict[str, Any] | None = None) -> None:
        """Count a request whose client left before its answer (``body``: that request)."""
        with self._lock:
            self.stats.disconnects += 1
            if body is not None:
                self.stats.cut.append(body)

    def leave(self) -> None:
        with self._lock:
            self.stats.in_flight -= 1

    def snapshot(self) -> dict[str, Any]:
        """The stats without the request bodies."""
        with self._lock:
            return {k: v for k, v in asdict(self.stats).items() if k not in ("bodies", "cut")}


def main(argv: list[str] | None = None) -> None:
    """Serve until SIGTERM or SIGINT; the port is written to ``--port-file`` once listening."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--script", type=Path)
    parser.add_argument("--record", type=Path, help="append one JSON line per request")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    script = StubScript()
    if args.script is not None:
        script = StubScript.from_dict(json.loads(args.script.read_text()))
    stub = ChatStub(script, record=args.record).start(args.port)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    tmp = args.port_file.with_name(args.port_file.name + ".tmp")
    tmp.write_text(str(stub.port))
    os.replace(tmp, args.port_file)
    done.wait()
    stub.stop()


if __name__ == "__main__":
    main()
