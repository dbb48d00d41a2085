"""Coding-agent CLIs as optimizers: ``--optimizer agent:NAME`` (DESIGN §11).

``agent:claude-code``, ``agent:codex``, ``agent:gemini-cli``, ``agent:aider`` and
``agent:opencode`` are built in (`evolane.lanes._agent_presets` states the interface each
one assumes); the entry-point group ``evolane.agents`` adds more, each entry point loading
an `AgentPreset` (a built-in name wins over a plugin of the same name).

Resolving a spec (`resolve_agent`) looks the CLI up on PATH and fails with one line when it
is not there; the absolute path goes first in the command line, so no PATH lookup happens
in the sandbox and a confined run is shown the executable's folder (and, for a symlink,
its target's). The expansion is a function of the spec, PATH and the job's paths only, so a
resumed run runs the same command.

Per job the optimizer lane renders the prompt as text (`agent_prompt`), writes it to
``prompt.md`` in the job's directory, runs the preset's command line in the sandbox like any
optimizer command (same deadline, idle watchdog, limits and confinement), and afterwards
turns the CLI's stdout into ``usage.json`` (unless the CLI wrote one) and a one-line summary
(`AgentCommand.record_usage`, `AgentCommand.summary`).

Credentials never pass by default: the sandbox scrubs the environment and gives a fresh
HOME, so a CLI's API key must be named with ``--pass-env optimizer=NAME``
(``ANTHROPIC_API_KEY``, ``OPENAI_API_KEY``, ``GEMINI_API_KEY``...: with ``optimizer=`` no
replay, which runs the candidate's code, sees it), and a CLI installed outside the system
folders under ``--isolation confined`` may need ``--expose optimizer=PATH`` for its runtime
(e.g. a node install).
"""

from __future__ import annotations

import os
import shlex
import shutil
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import orjson

from evolane.inputs import OPTIMIZER_PLACEHOLDERS, CommandTemplate, InputError
from evolane.lanes._agent_kit import AgentCall, AgentPreset
from evolane.lanes._agent_presets import BUILTIN_AGENTS
from evolane.lanes._prompt_text import PROMPT_TEXT_BYTES, decode_prompt, prompt_text

AGENT_PREFIX = "agent:"
"""How an ``--optimizer`` value names a coding-agent preset."""
AGENT_ENTRY_POINTS = "evolane.agents"
"""The entry-point group whose entries each load an `AgentPreset`."""
AGENT_PROMPT_BYTES = PROMPT_TEXT_BYTES
"""UTF-8 bytes of the prompt an agent CLI gets (on its command line and in ``prompt.md``);
under the sandbox's 64 KiB per argument."""
AGENT_TAIL_BYTES = 256 << 10
"""Bytes of an agent run's stdout tail kept for parsing (its usage is reported at the end)."""

_PREAMBLE = """\
You are the optimizer of an evolane campaign. Improve the files in your current working \
directory ({workdir}) by editing them in place: that directory is the candidate, and only \
changes inside it count. Work without asking questions (nobody will answer), do not create \
version-control folders, and do not change the paths you are told to keep. A read-only \
folder with more context (cases, earlier results) is at {context}; this prompt is also in \
{prompt_file}. When you are done, reply with one line that summarises your change.

"""


class AgentSpecError(InputError):
    """An ``--optimizer agent:NAME`` that cannot be used (one line; the CLI exits 2)."""


class AgentNotInstalledError(AgentSpecError):
    """The preset's CLI is not on PATH."""


def is_agent_spec(optimizer: str) -> bool:
    """Whether ``optimizer`` names a coding-agent preset rather than a command template."""
    return optimizer.strip().startswith(AGENT_PREFIX)


def agent_presets() -> dict[str, AgentPreset]:
    """Every preset by name: the built-ins, then every plugin's (each entry point loaded; one
    that fails to load is left out here, and `resolve_agent` names its error)."""
    presets = dict(BUILTIN_AGENTS)
    for name in sorted(_plugin_names()):
        if name in presets:
            continue
        try:
            presets[name] = _load_plugin(name)
        except AgentSpecError:
            continue
    return presets


def _plugin_names() -> set[str]:
    return {point.name for point in entry_points(group=AGENT_ENTRY_POINTS)}


def _load_plugin(name: str) -> AgentPreset:
    """The plugin preset ``name``; `AgentSpecError` when it does not load or is no preset."""
    where = f"--optimizer {AGENT_PREFIX}{name}"
    points = sorted(
        (p for p in entry_points(group=AGENT_ENTRY_POINTS) if p.name == name),
        key=lambda p: p.value,
    )
    try:
        preset = points[0].load()
    except Exception as error:  # a plugin's own import failure, said in one line
        raise AgentSpecError(
            f"{where}: the plugin {points[0].value} failed to load: {type(error).__name__}: {error}"
        ) from None
    if not isinstance(preset, AgentPreset):
        raise AgentSpecError(f"{where}: the plugin {points[0].value} is not an AgentPreset")
    return preset


def _preset(name: str) -> AgentPreset:
    if name in BUILTIN_AGENTS:
        return BUILTIN_AGENTS[name]
    if name and name in _plugin_names():
        return _load_plugin(name)
    known = ", ".join(sorted({*BUILTIN_AGENTS, *_plugin_names()}))
    raise AgentSpecError(f"--optimizer {AGENT_PREFIX}{name}: unknown coding agent (known: {known})")


@dataclass(frozen=True)
class AgentCommand:
    """A preset bound to its CLI's absolute path: what the optimizer lane runs per job."""

    preset: AgentPreset
    path: str
    """The executable as found on PATH (absolute)."""

    @property
    def spec(self) -> str:
        """The ``--optimizer`` value (``agent:NAME``)."""
        return f"{AGENT_PREFIX}{self.preset.name}"

    def exposed(self) -> tuple[str, ...]:
        """The absolute paths a confined run must see: the executable and, when it is a
        symlink (npm and pip installs), the file it points to."""
        real = os.path.realpath(self.path)
        return (self.path,) if real == self.path else (self.path, real)

    def template(self) -> CommandTemplate:
        """A template naming `exposed` (not what runs: the lane runs `argv`), so every check
        of what an optimizer command names and sees (confinement views, hidden paths) covers
        the agent's executable too."""
        text = shlex.join(self.exposed()).replace("{", "{{").replace("}", "}}")
        return CommandTemplate.parse(text, role="optimizer", allowed=OPTIMIZER_PLACEHOLDERS)

    def argv(self, call: AgentCall) -> tuple[str, ...]:
        """The CLI's command line for one job (``call.executable`` is this path); ValueError
        when the preset (a plugin's) fails or builds one that does not start with it."""
        try:
            argv = tuple(self.preset.argv(call))
        except Exception as error:  # a plugin's bug costs the job, not the lane
            raise ValueError(f"{self.spec}: no command line: {type(error).__name__}") from error
        if not argv or argv[0] != call.executable or not all(isinstance(a, str) for a in argv):
            raise ValueError(f"{self.spec}: the command line must start with {call.executable}")
        return argv

    def call(self, prompt_json: Path, prompt_file: Path, workdir: Path, context: Path) -> AgentCall:
        """Render the job's prompt (``prompt_json`` and the ``context`` folder) as text, write
        it to ``prompt_file`` and return the call (blocking I/O: run it in a thread)."""
        prompt = decode_prompt(prompt_json.read_bytes())
        text = agent_prompt(prompt, context, workdir=workdir, prompt_file=prompt_file)
        prompt_file.write_text(text, encoding="utf-8")
        return AgentCall(self.path, text, prompt_file, workdir, context)

    def record_usage(self, usage_file: Path, stdout: bytes) -> dict[str, Any] | None:
        """Write the usage the CLI reported in ``stdout`` to ``usage_file``, unless a usage
        document is there already (the CLI's own wins); returns what was written."""
        if os.path.lexists(usage_file):
            return None
        try:
            document = self.preset.usage(stdout)
        except Exception:  # a plugin parser's bug: the spend stays unknown (fail-closed)
            return None
        if document is None:
            return None
        try:
            usage_file.write_bytes(orjson.dumps(document))
        except (OSError, TypeError):  # no room, or a plugin's document is not JSON
            return None
        return document

    def summary(self, stdout: bytes) -> str:
        """The one-line summary the CLI's output gives ("" when none)."""
        try:
            text = self.preset.summary(stdout)
        except Exception:  # a plugin parser's bug costs the summary only
            return ""
        return text if isinstance(text, str) else ""


def resolve_agent(spec: str) -> AgentCommand:
    """The preset ``spec`` (``agent:NAME``) names, bound to its CLI found on PATH.

    Raises `AgentSpecError` for an unknown name or a plugin that fails to load, and
    `AgentNotInstalledError` when the CLI is not on PATH (each one line, a ValueError)."""
    name = spec.strip()[len(AGENT_PREFIX) :].strip()
    preset = _preset(name)
    found = shutil.which(preset.program)
    if found is None:
        raise AgentNotInstalledError(
            f"--optimizer {AGENT_PREFIX}{name}: `{preset.program}` is not installed "
            "(not found on PATH)"
        )
    return AgentCommand(preset, os.path.abspath(found))


def optimizer_command(optimizer: str) -> str:
    """The command text a check of ``--optimizer`` should read: the template itself, or for
    ``agent:NAME`` the CLI's absolute path(s) (`resolve_agent`: may raise)."""
    if not is_agent_spec(optimizer):
        return optimizer
    return shlex.join(resolve_agent(optimizer).exposed())


def agent_prompt(
    prompt: dict[str, Any],
    context_dir: Path | None,
    *,
    workdir: Path,
    prompt_file: Path,
    max_bytes: int = AGENT_PROMPT_BYTES,
) -> str:
    """The text an agent CLI is given: what it may edit and how to finish, then the
    optimizer prompt and context excerpts (`prompt_text`); at most ``max_bytes`` bytes."""
    head = _PREAMBLE.format(workdir=workdir, context=context_dir, prompt_file=prompt_file)
    room = max(max_bytes - len(head.encode()), 0)
    text = head + prompt_text(prompt, context_dir, max_bytes=room)
    return text.encode()[:max_bytes].decode("utf-8", "ignore")


def captured_bytes(head: bytes, tail: bytes, truncated: bool) -> bytes:
    """A captured stream's bytes for parsing: head and tail joined, with a line break
    between them when bytes were dropped (so no line is glued across the gap)."""
    return head + (b"\n" if truncated else b"") + tail
