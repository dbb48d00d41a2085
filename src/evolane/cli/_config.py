"""The configuration file of ``optimize``'s flags: ``evolane.toml`` (or ``[tool.evolane]`` in
``pyproject.toml``), found in the current folder or its parents as ruff and pytest find
theirs, or named by ``--config PATH``.

Keys are the flag names (``max-tokens`` or ``max_tokens``; a repeatable flag takes an
array); paths are relative to the file's folder. A flag given on the command line wins over
the file, which wins over an example's presets, which win over the defaults. Every value's
source is kept (`sources`) so that ``evolane config show`` and run.json can say it.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import re
import tomllib
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLAG, DEFAULT, FAST = "flag", "default", "--fast-verified"
"""Sources of a value besides a config file (its path) and an example (``example NAME``)."""
SOURCES_KEY = "_sources"
"""Where the flags dict keeps the source of each value once the file is merged in."""
NOT_IN_FILE = frozenset(
    (
        "config",
        "dry_run",
        "probe",
        "debug",
        "resume",
        "resume_campaign",
        "from_run",
        "rerun_evaluator",
    )
) | {"drain_pending"}
"""Flags that ask for one invocation and have no place in a config file."""
SESSION_KEYS = ("store", "progress", "observer")
"""The keys a ``--resume`` or ``--from-run`` takes from the file (the run has the rest)."""
_PATH_KEYS = frozenset(
    (
        "target",
        "dataset",
        "from_trajectory",
        "store",
        "example_dir",
        "rubric",
        "prices",
        "expose",
        "expose_rw",
    )
)
_FILE_NAME, _PYPROJECT = "evolane.toml", "pyproject.toml"


class ConfigError(ValueError):
    """A config file that cannot be used: one line naming the file (and line) and the key."""


@dataclass
class ConfigFile:
    """A parsed config file: its values by flag name (paths made absolute) and their lines."""

    path: Path
    values: dict[str, Any] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)

    def where(self, key: str, *, absolute: bool = False) -> str:
        """``FILE:LINE`` of ``key`` (``FILE`` when its line is unknown); the file's path is
        relative when it is in the current folder or below, unless ``absolute``."""
        line = self.lines.get(key)
        path = self.path if absolute else shown_path(self.path)
        return f"{path}:{line}" if line else str(path)


def shown_path(path: Path) -> Path:
    """``path`` relative to the current folder when it is inside it."""
    with contextlib.suppress(ValueError):
        return path.relative_to(Path.cwd())
    return path


_COMMANDS: list[Callable[..., Any]] = []


def use_flags(command: Callable[..., Any]) -> None:
    """Declare the command whose parameters are the flags (``optimize``, which calls this
    when it is defined: the flags' module depends on this one, not the other way)."""
    _COMMANDS[:] = [command]


def _command() -> Callable[..., Any]:
    if not _COMMANDS:
        raise RuntimeError("evolane.cli._optimize is not loaded (it declares the flags)")
    return _COMMANDS[0]


def flag_types() -> dict[str, Any]:
    """Every flag a config file may set, by parameter name, with its Python type."""
    command = _command()
    hints = typing.get_type_hints(command)
    names = inspect.signature(command).parameters
    return {name: hints[name] for name in names if name not in NOT_IN_FILE}


def find_config(start: Path) -> Path | None:
    """The nearest ``evolane.toml``, else ``pyproject.toml`` holding ``[tool.evolane]``, in
    ``start`` or a parent, up to the repository's root (a folder holding ``.git``)."""
    for folder in (start, *start.parents):
        if (folder / _FILE_NAME).is_file():
            return folder / _FILE_NAME
        pyproject = folder / _PYPROJECT
        if pyproject.is_file() and re.search(r"(?m)^\s*\[tool\.evolane\]", _text(pyproject)):
            return pyproject
        if (folder / ".git").exists():
            return None
    return None


MAX_CONFIG_BYTES = 1 << 20
"""A config file (or pyproject.toml) larger than this is refused unread: a flag file is a
few hundred bytes, and a 100 MB one took 14 s to parse (found by review)."""


def _text(path: Path) -> str:
    """The file's text, at most `MAX_CONFIG_BYTES` read; a pipe given as ``--config``
    (``<(...)``) is read as a file is (the search for a config file takes files only)."""
    from evolane.store import read_at_most

    try:
        with open(path, "rb") as handle:
            data = read_at_most(handle, MAX_CONFIG_BYTES)
        if len(data) > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"{shown_path(path)}: the config file is over {MAX_CONFIG_BYTES >> 20} MiB"
            )
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{shown_path(path)}: cannot read the config file ({error})") from None


def load_config(path: Path, *, named: bool = False) -> ConfigFile:
    """Parse and check ``path``: every key a known flag, every value of its flag's type. A
    ``pyproject.toml`` ``named`` by ``--config`` must hold ``[tool.evolane]`` (found by
    review: one without it was read as no settings, silently)."""
    text = _text(path)
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(_syntax_error(path, str(error), text)) from None
    except RecursionError:
        raise ConfigError(f"{shown_path(path)}: not valid TOML (nested too deeply)") from None
    except ValueError as error:  # an integer of over 4300 digits
        raise ConfigError(f"{shown_path(path)}: not valid TOML ({_value_problem(error)})") from None
    table: Any = document
    if path.name == _PYPROJECT:
        tool = document.get("tool")
        table = tool.get("evolane") if isinstance(tool, dict) else None
        if table is None and named:
            raise ConfigError(f"--config {shown_path(path)}: has no [tool.evolane] table")
        table = {} if table is None else table
    if not isinstance(table, dict):
        raise ConfigError(f"{shown_path(path)}: [tool.evolane] must be a table")
    config = ConfigFile(path.absolute())
    types = flag_types()
    for key, value in table.items():
        name = key.replace("-", "_")
        if name in config.lines:
            config.lines[name] = _line_of(text, key, path.name == _PYPROJECT)
            raise ConfigError(f"{config.where(name)}: {key}: set twice (- and _ name one flag)")
        config.lines[name] = _line_of(text, key, path.name == _PYPROJECT)
        if name not in types:
            hint = " (it asks for one invocation: give it as a flag)" if name in NOT_IN_FILE else ""
            raise ConfigError(f"{config.where(name)}: {key}: not a setting{hint}")
        config.values[name] = _checked(config, key, value, types[name])
    return config


def _syntax_error(path: Path, message: str, text: str) -> str:
    """A TOML syntax error as ``FILE:LINE: not valid TOML (what, column N)`` (the parser
    says ``what (at line L, column N)``, or ``what (at end of document)``: the last line;
    found by review: the line was only inside it, or not given)."""
    at = re.search(r"\s*\(at line (\d+), column (\d+)\)$", message)
    if at is not None:
        what = message[: at.start()]
        return f"{shown_path(path)}:{at.group(1)}: not valid TOML ({what}, column {at.group(2)})"
    end = re.search(r"\s*\(at end of document\)$", message)
    if end is not None:
        last = max(1, len(text.splitlines()))
        return f"{shown_path(path)}:{last}: not valid TOML ({message[: end.start()]}, at its end)"
    return f"{shown_path(path)}: not valid TOML ({message})"


def _value_problem(error: ValueError) -> str:
    """What a ``ValueError`` from the TOML parser says, without Python's advice."""
    text = str(error)
    return "an integer of too many digits" if "integer string conversion" in text else text


def _line_of(text: str, key: str, in_pyproject: bool) -> int:
    """The 1-based line that sets ``key`` (in ``[tool.evolane]`` for a pyproject), else 0:
    ``key = ...``, a dotted ``key.x = ...``, or a table ``[key]`` / ``[key.x]`` / ``[[key]]``
    (found by review: a table's error had no line)."""
    name = rf"""["']?{re.escape(key)}["']?"""
    pattern = re.compile(rf"^\s*{name}\s*[=.]")
    top = "tool.evolane" if in_pyproject else ""
    table = re.compile(rf"^{re.escape(top + '.' if top else '')}{name}(\.|$)")
    inside = not in_pyproject
    for number, line in enumerate(text.splitlines(), start=1):
        header = re.match(r"^\s*\[\[?([^\]]*)\]", line)
        if header is not None:
            heading = re.sub(r"\s*\.\s*", ".", header.group(1).strip())
            if table.match(heading):
                return number
            inside = heading == top
        elif inside and pattern.match(line):
            return number
    return 0


def _checked(config: ConfigFile, key: str, value: Any, kind: Any) -> Any:
    """``value`` as its flag's type (paths made absolute against the file's folder)."""
    name = key.replace("-", "_")
    if isinstance(value, dict):  # ``[key]`` or ``key.x = ``: pydantic's text named Path
        raise ConfigError(f"{config.where(name)}: {key}: a table, where a value belongs")
    kinds = set(typing.get_args(kind)) or {kind}
    if (bool in kinds) != isinstance(value, bool):  # TOML has booleans: no "yes", no 1
        what = "expected true or false" if bool in kinds else "a boolean, where a value belongs"
        raise ConfigError(f"{config.where(name)}: {key}: {what} (got {value!r})")
    is_list = any(typing.get_origin(each) is list for each in kinds)
    if is_list and not isinstance(value, list):
        value = [value]  # one value of a repeatable flag
    if is_list or str in kinds:  # e.g. max-procs = 512, expose = ["data", 2024]
        items = value if is_list else [value]
        numbers = [
            str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v for v in items
        ]
        value = numbers if is_list else numbers[0]
    from pydantic import TypeAdapter, ValidationError

    try:
        checked = TypeAdapter(kind).validate_python(value, strict=False)
    except ValidationError as error:
        message = str(error.errors()[0]["msg"]).removeprefix("Value error, ")
        raise ConfigError(f"{config.where(name)}: {key}: {message} (got {value!r})") from None
    if name in _PATH_KEYS and checked is not None:
        if any(not str(item).strip() for item in (value if is_list else [value])):
            # an unset "$STORE" in a generated file: this file's folder, unasked, as the
            # flag refuses (found by hostile review: `store = ""` put the store there)
            where = config.where(name)
            raise ConfigError(f'{where}: {key}: an empty path (write "." for this folder)')
        folder = config.path.parent
        if isinstance(checked, list):
            return [_grant_path(config, key, folder, item) for item in checked]
        return type(checked)(folder / Path(str(checked)).expanduser())
    return checked


def _grant_path(config: ConfigFile, key: str, folder: Path, item: str) -> str:
    """``item`` made absolute against ``folder``; an ``expose``'s ``ROLE=PATH`` keeps its
    role (`evolane.measure.split_grant`), a bad one is this file's error."""
    if key.replace("-", "_") not in ("expose", "expose_rw"):
        return str(folder / Path(item).expanduser())
    from evolane.measure import split_grant

    try:
        role, path = split_grant(item)
    except ValueError as error:
        raise ConfigError(f"{config.where(key.replace('-', '_'))}: {key}: {error}") from None
    absolute = str(folder / Path(path).expanduser())
    return absolute if role is None else f"{role}={absolute}"


def explicit_flags(flags: dict[str, Any]) -> set[str]:
    """The flags given on the command line: click's parameter source when a command is
    running, else those whose value differs from the default (a direct call)."""
    ctx = _current_context()
    parameters = inspect.signature(_command()).parameters
    defaults = {name: param.default for name, param in parameters.items()}
    given = set()
    for name, value in flags.items():
        source = ctx.get_parameter_source(name) if ctx is not None else None
        if source is not None:
            if source.name in ("COMMANDLINE", "ENVIRONMENT"):
                given.add(name)
        elif name in defaults and value != defaults[name] and value not in (None, []):
            given.add(name)
    return given


def ignored_by_resume(flags: dict[str, Any]) -> list[str]:
    """The flags given on the command line beside ``--resume`` that the resumed run ignores
    (it keeps its stored settings; only the session's keys and ``--debug`` apply), as
    ``--name``: found by review, ``--resume R --iterations 5`` ran the stored 2, silently."""
    kept = {*SESSION_KEYS, *NOT_IN_FILE}
    return [_as_given(name, flags[name]) for name in sorted(explicit_flags(flags) - kept)]


VIEW_KEYS = ("progress", "observer")
"""The session keys a resumed run keeps from its first session's settings when neither a
flag nor the config file gives them."""


def continue_session(flags: dict[str, Any]) -> list[str]:
    """For ``--resume``: the flags given beside it that the run ignores (`ignored_by_resume`),
    once its `VIEW_KEYS` that neither a flag nor the config file set are taken from the
    run's stored settings, as the README promises (found by review: ``--progress none``
    given to the first session was forgotten, and its resume drew the live view). A run
    that cannot be read is left to the resume to report."""
    sources = flags.get(SOURCES_KEY, {})
    missing = [name for name in VIEW_KEYS if name not in sources]
    if missing:
        from evolane.campaign import StoreLayout, load_run

        with contextlib.suppress(OSError, ValueError):  # an InputError is a ValueError
            run = load_run(StoreLayout(Path(flags["store"]).absolute()), flags["resume"])
            for name in missing:
                stored = (run.settings or {}).get(name)
                if stored is not None and stored.value not in (None, []):
                    flags[name], sources[name] = stored.value, f"run {run.run_id}"
    return ignored_by_resume(flags)


def _as_given(name: str, value: Any) -> str:
    """The flag ``name`` as it was typed: a boolean's off form (``--no-network``) when it is
    false (found by review: ``--resume R --no-network`` was said as ``--network``)."""
    ctx = _current_context()
    for param in ctx.command.params if ctx is not None else ():
        if param.name == name and getattr(param, "is_bool_flag", False) and param.secondary_opts:
            return str(param.opts[0] if value else param.secondary_opts[0])
    return f"--{name.replace('_', '-')}"


def _current_context() -> Any:
    """The running command's click context, or None: typer 0.2x runs its commands on a
    vendored copy of click (whose context stack is its own), older typer on click."""
    try:
        from typer._click.globals import get_current_context
    except ImportError:
        from click import get_current_context
    return get_current_context(silent=True)


def merge_config_file(flags: dict[str, Any], *, session_only: bool = False) -> dict[str, str]:
    """Fill ``flags`` in place with the config file's values where no flag was given, and
    return (and keep under `SOURCES_KEY`) the source of each flag set so far: ``flag`` or
    the file's path. Idempotent. Raises `ConfigError`."""
    if SOURCES_KEY in flags:
        return flags[SOURCES_KEY]
    given = explicit_flags(flags)
    sources = {name: FLAG for name in given}
    named = flags.get("config")
    if named is not None:
        path = Path(named)
        if path.is_dir():
            raise ConfigError(f"--config {named}: a folder, not a file")
        if not path.exists():  # a pipe (``<(...)``) is read as a file
            raise ConfigError(f"--config {named}: no such file")
    else:
        path = find_config(Path.cwd())
    if path is not None:
        config = load_config(path, named=named is not None)
        for name, value in config.values.items():
            if name in given or (session_only and name not in SESSION_KEYS):
                continue
            flags[name] = value
            sources[name] = config.where(name, absolute=True)
    flags[SOURCES_KEY] = sources
    return sources


def locate(message: str, flags: dict[str, Any]) -> str:
    """A usage error about a flag (``--name ...``) that the config file set, told at the
    file's line: ``FILE:LINE: name ...``."""
    match = re.match(r"--([a-z][a-z0-9-]*)(.*)", message, re.DOTALL)
    if match is None:
        return message
    name = match.group(1).replace("-", "_")
    if name == "required_files":
        name = "required_file"
    source = flags.get(SOURCES_KEY, {}).get(name)
    if source is None or source == FLAG:
        return message
    path, _, line = source.rpartition(":")
    shown = f"{shown_path(Path(path))}:{line}" if line.isdigit() else shown_path(Path(source))
    return f"{shown}: {match.group(1)}{match.group(2)}"


_GATE_KEYS = frozenset(
    ("gate", "k_se", "min_effect", "threshold", "confidence", "bootstrap_samples", "sequential")
)
_AS_GIVEN = frozenset(("rubric", "prices"))  # the config holds their contents: show the path
_DUMPED_ONLY_SET = frozenset(("test_budget",))
"""Settings `CampaignConfig` dumps only when not at their default: ``test-budget`` showed
"(not set)" where its default ``campaign`` was in force (found by review)."""


def resolved_settings(config: Any, flags: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every setting a config file may hold, as resolved for ``config`` from ``flags``:
    ``{name: {"value": ..., "source": ...}}``; the source is ``flag``, a config file's
    ``PATH:LINE``, ``example NAME``, ``--fast-verified`` or ``default``."""
    dumped = config.model_dump(mode="json")
    sources = flags.get(SOURCES_KEY, {})
    settings = {}
    for name in flag_types():
        field_name = "required_files" if name == "required_file" else name
        if name in _GATE_KEYS or name == "no_regression":
            value = dumped["gate"][name]
        elif field_name in dumped and name not in _AS_GIVEN:
            value = dumped[field_name]
        elif name in _DUMPED_ONLY_SET:
            value = getattr(config, name)
        else:
            value = flags.get(name)
        value = json.loads(json.dumps(value, default=str))  # paths and tuples as JSON
        settings[name] = {"value": value, "source": sources.get(name, DEFAULT)}
    return settings
