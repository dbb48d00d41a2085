"""What the read-only commands (``report``, ``runs``, ``watch``) share: the ``--store``
option, finding a run by its id or a prefix, and the formatting of their output (JSON,
times, numbers, a console that keeps ids whole)."""

from __future__ import annotations

import errno
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TextIO

import orjson
import typer
from rich.console import Console

from evolane.cli._exits import fail_usage

if TYPE_CHECKING:
    from evolane.campaign import StoreLayout

DEFAULT_STORE = Path(".evolane")
"""The store a command reads when ``--store`` is not given."""

StoreOption = Annotated[
    Path | None,
    typer.Option(
        "--store",
        help=(  # rich markup would take an unescaped [default: ...] for a style tag
            "The store directory \\[default: the store of the nearest evolane.toml, else .evolane]."
        ),
        show_default=False,
    ),
]


def store_of(store: Path | None) -> Path:
    """``--store`` when given, else the store the nearest ``evolane.toml`` (or
    ``[tool.evolane]``) names, as ``optimize`` reads it, else `DEFAULT_STORE`."""
    if store is not None:
        return store
    from evolane.cli._config import ConfigError, find_config, load_config

    try:
        path = find_config(Path.cwd())
        named = load_config(path).values.get("store") if path is not None else None
    except ConfigError as error:
        fail_usage(str(error))
    return Path(named) if named is not None else DEFAULT_STORE


def write_json(value: Any) -> None:
    """Print ``value`` as indented JSON on stdout. A path whose bytes are not UTF-8 (a store
    named so) is shown with U+FFFD for each such byte (found by review: ``runs --json``
    failed with a traceback, orjson refusing the undecodable bytes Python keeps in a str)."""
    option = orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE
    try:
        data = orjson.dumps(value, option=option)
    except TypeError:  # a str holding surrogates (os.fsdecode of a name that is not UTF-8)
        data = orjson.dumps(_as_unicode(value), option=option)
    stream = sys.stdout
    buffer = getattr(stream, "buffer", None)
    if buffer is None or (getattr(stream, "encoding", "") or "").lower() not in ("utf-8", "utf8"):
        stream.write(data.decode())
        return
    stream.flush()  # the bytes as they are: no decoded and re-encoded copies of a big listing
    buffer.write(data)
    buffer.flush()


def _as_unicode(value: Any) -> Any:
    """``value`` with every str made valid Unicode (an undecodable byte as U+FFFD)."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    if isinstance(value, dict):
        return {_as_unicode(key): _as_unicode(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_as_unicode(item) for item in value]
    return value


def stamp(seconds: float | None, spec: str = "%Y-%m-%d %H:%M:%S") -> str:
    """A local time of day for an epoch time, ``-`` when there is none, ``?`` for one no
    date can show (a damaged record's 1e308: found by hostile review, `evolane runs` and
    `evolane report` failed with a traceback on it, exit 1)."""
    if not seconds:
        return "-"
    try:
        return time.strftime(spec, time.localtime(seconds))
    except (OverflowError, OSError, ValueError):
        return "?"


@contextmanager
def reader_may_leave() -> Iterator[None]:
    """Output whose reader may stop reading (``evolane optimize ... | head``): a broken pipe
    ends the printing quietly and leaves the exit code to the command (the run's own code,
    DESIGN §10). rich's default (`Console.on_broken_pipe`) exits 1 at once, and a bare
    ``print`` raised `BrokenPipeError`, reported as an internal error (found by review)."""
    default = Console.on_broken_pipe
    Console.on_broken_pipe = _raise_broken_pipe  # type: ignore[method-assign]
    try:
        yield
    except BrokenPipeError:
        with suppress(OSError, ValueError):  # nothing more reaches the reader, not even
            devnull = os.open(os.devnull, os.O_WRONLY)  # the interpreter's last flush
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
    finally:
        Console.on_broken_pipe = default  # type: ignore[method-assign]


def _raise_broken_pipe(console: Console) -> None:
    console.quiet = True
    raise BrokenPipeError(errno.EPIPE, "the reader went away")


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal (False for one closed or without a descriptor)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def wide_console() -> Console:
    """A console; output that is not a terminal is not folded at 80 columns (ids stay whole)."""
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = max(console.width, 160)
    return console


def number(value: float | None, spec: str = ".3f") -> str:
    """``value`` formatted by ``spec``, ``-`` when there is none."""
    return "-" if value is None else format(value, spec)


def open_store(store: Path) -> StoreLayout:
    """The store's layout; a missing store is a usage error (exit 2)."""
    from evolane.campaign import StoreLayout

    if not store.is_dir():
        fail_usage(f"no evolane store at {store}")
    return StoreLayout(store)


def resolve_run(layout: StoreLayout, run_id: str) -> str:
    """The run named by ``run_id`` or by a prefix matching exactly one run (else exit 2)."""
    ids = layout.run_ids()
    if run_id in ids:
        return run_id
    matches = [known for known in ids if run_id and known.startswith(run_id)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        shown = ", ".join(matches[:5]) + (", ..." if len(matches) > 5 else "")
        fail_usage(
            f"run id prefix {run_id!r} matches {len(matches)} runs in {layout.root}: {shown}"
        )
    fail_usage(f"unknown run {run_id!r} in store {layout.root} (see `evolane runs`)")


def test_delta_text(test: Any, confirmation: Any | None) -> str:
    """A best's sealed test delta with the gate's bootstrap interval, named as such: beside
    a confirmation's verdict on the same cases (``confirmation``: one was made), an unnamed
    interval that excluded 0 read as a contradiction of "not confirmed" (found by review;
    the confirmation's own bound is in its sentence). A confirmed best's delta is said to be
    optimistic (`campaign.PUBLISHED_ON_TEST`): it was published because that delta was high."""
    verdict = ""
    if confirmation is not None:
        verdict = "; the confirmation is the verdict"
        if confirmation.decision == "confirmed":
            from evolane.campaign import PUBLISHED_ON_TEST

            verdict += f"; {PUBLISHED_ON_TEST}"
    return (
        f"{test.mean_delta:+.3f} over {test.n} cases (the gate's bootstrap interval "
        f"[{test.ci_low:+.3f}, {test.ci_high:+.3f}]{verdict})"
    )


def written_ago(path: Path) -> float:
    """Seconds since ``path`` was last written (0 when it cannot be told): how long ago a
    run wrote its newest event (a watcher that attached late shows the run's clock and its
    silence, not the time since it attached: found by review), or its run.json."""
    try:
        return max(0.0, time.time() - path.stat().st_mtime)
    except OSError:
        return 0.0


_OWN_STDOUT: list[TextIO] = []
"""The real stdout while `json_stdout_only` holds it for evolane's own lines."""


@contextmanager
def json_stdout_only(active: bool) -> Iterator[None]:
    """For the block (when ``active``: ``--progress jsonl``), whatever else prints to
    ``sys.stdout`` (a plugin, an observer, an in-process backend) goes to stderr, so stdout
    stays JSON lines; evolane writes its own to `own_stdout` (found by review: a plugin's
    print broke the stream for a program reading it)."""
    if not active:
        yield
        return
    _OWN_STDOUT.append(sys.stdout)
    try:
        with redirect_stdout(sys.stderr):
            yield
    finally:
        _OWN_STDOUT.pop()


def own_stdout() -> TextIO:
    """Where evolane's own output goes: the real stdout (see `json_stdout_only`)."""
    return _OWN_STDOUT[-1] if _OWN_STDOUT else sys.stdout
