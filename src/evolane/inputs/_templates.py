"""Command templates (DESIGN §8): argv strings split with ``shlex``, placeholders filled per arg.

A template is never run through a shell: the text is split once, at parse time, and each
placeholder is replaced inside its argument, so a substituted value (a path with spaces, a
string full of shell metacharacters) always stays exactly one literal argument.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Collection, Mapping
from typing import Annotated, Self

from pydantic import Field, field_serializer, model_validator

from evolane.inputs._errors import TemplateError, quote
from evolane.messages import Name, Record

MAX_TEMPLATE_CHARS = 8192
"""Upper bound on a template's text (and so on each of its arguments)."""
MAX_TEMPLATE_ARGS = 512
"""Upper bound on the number of arguments a template splits into."""
MAX_PLACEHOLDERS = 16
"""Upper bound on the number of distinct placeholders one template uses."""

ALL_PLACEHOLDERS = frozenset(
    {"candidate", "workspace", "case_file", "output_dir", "seed", "workdir", "prompt_file"}
)
"""Every placeholder DESIGN §8 defines."""
REPLAY_PLACEHOLDERS = frozenset({"candidate", "workspace", "case_file", "output_dir", "seed"})
"""Placeholders a replay command may use."""
JUDGE_PLACEHOLDERS = frozenset({"candidate", "workspace", "case_file", "output_dir", "seed"})
"""Placeholders a judge command may use."""
OPTIMIZER_PLACEHOLDERS = frozenset({"workdir", "prompt_file", "seed", "workspace"})
"""Placeholders an optimizer command may use."""
VERIFICATION_PLACEHOLDERS = frozenset({"workspace", "case_file", "output_dir", "seed"})
"""Placeholders a case's ``verification_command`` may use."""

_INTERPRETER = re.compile(
    r"(python|pypy)[0-9.]*|(ba|da|k|z)?sh|node(js)?|bun|deno|ruby|perl|php|lua|Rscript|julia|tclsh"
)
"""Program names that run the script file they are given (``python3 grade.py``)."""
_GLOB_CHARS = re.compile(r"([*?[])")

# "{{" and "}}" are literal braces, "{name}" is a placeholder, any other brace is stray.
_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")

_Arg = Annotated[str, Field(max_length=MAX_TEMPLATE_CHARS)]
_PlaceholderName = Annotated[str, Field(max_length=64)]
_PlaceholderList = Annotated[list[_PlaceholderName], Field(max_length=MAX_PLACEHOLDERS)]


class CommandTemplate(Record):
    """A parsed command template: the text, its ``shlex`` split and the placeholders it uses.

    Build one with `CommandTemplate.parse`; direct construction is validated for consistency.
    """

    text: Annotated[str, Field(min_length=1, max_length=MAX_TEMPLATE_CHARS)]
    argv: Annotated[tuple[_Arg, ...], Field(min_length=1, max_length=MAX_TEMPLATE_ARGS)]
    placeholders: Annotated[frozenset[_PlaceholderName], Field(max_length=MAX_PLACEHOLDERS)]
    role: Name = "command"

    @classmethod
    def parse(cls, text: str, *, role: str, allowed: Collection[str]) -> Self:
        """Split and check ``text`` as the ``role`` command that may use the ``allowed`` names.

        Raises `TemplateError` (one line, ``"<role> command: <reason>"``) on any problem.
        """
        argv, used = _analyse(text, role)
        _check_allowed(used, role, frozenset(allowed))
        return cls(text=text, argv=argv, placeholders=used, role=role)

    @model_validator(mode="after")
    def _derived_from_text(self) -> Self:
        argv, used = _analyse(self.text, self.role)
        if argv != self.argv or used != self.placeholders:
            raise ValueError("argv and placeholders must be derived from text (use parse)")
        return self

    @field_serializer("placeholders")
    def _sorted_placeholders(self, value: frozenset[str]) -> _PlaceholderList:
        return sorted(value)

    def literal_words(self) -> tuple[str, ...]:
        """The argv with every placeholder blanked: what the user wrote literally (the
        absolute paths in it are what a confined command is shown, see `evolane.sandbox`)."""
        return tuple(_TOKEN.sub(" ", arg) for arg in self.argv)

    def render(self, values: Mapping[str, str]) -> tuple[str, ...]:
        """The argv with every placeholder replaced by its value, each value kept literal.

        Values the template does not use are ignored; a used placeholder without a value, or
        a value with a NUL character, raises `TemplateError`.
        """
        missing = [name for name in sorted(self.placeholders) if name not in values]
        if missing:
            names = ", ".join("{" + name + "}" for name in missing)
            raise TemplateError.at(self.role, f"no value given for {names}")
        for name in sorted(self.placeholders):
            value = values[name]
            if not isinstance(value, str):
                raise TypeError(f"the value for {{{name}}} must be a str, got {type(value)}")
            if "\x00" in value:
                raise TemplateError.at(self.role, f"the value for {{{name}}} contains a NUL")

        def substitute(match: re.Match[str]) -> str:
            token = match.group(0)
            if token in ("{{", "}}"):
                return token[0]
            return values[match.group(1)]

        return tuple(
            _TOKEN.sub(substitute, arg) if "{" in arg or "}" in arg else arg for arg in self.argv
        )


def tree_program(template: CommandTemplate, placeholder: str = "candidate") -> str | None:
    """The file of the ``{placeholder}`` tree that ``template`` runs as its program, as a
    protected glob matching that one path: its first word (``{candidate}/grade.sh``), or the
    script an interpreter is given (``python3 -u {candidate}/tools/grade.py``); None when
    its program lies elsewhere (or runs code given inline, ``sh -c``, ``python -m``)."""
    prefix = "{" + placeholder + "}/"
    words = list(template.argv)
    if _INTERPRETER.fullmatch(words[0].rsplit("/", 1)[-1]):
        words = [word for word in words[1:] if not word.startswith("-") or word in ("-c", "-m")]
    if not words or not words[0].startswith(prefix):
        return None
    relative = words[0][len(prefix) :]
    parts = [part for part in relative.split("/") if part not in ("", ".")]
    if not parts or ".." in parts or "{" in relative or "}" in relative:
        return None
    return _GLOB_CHARS.sub(r"[\1]", "/".join(parts))  # each a literal character


def _analyse(text: str, role: str) -> tuple[tuple[str, ...], frozenset[str]]:
    """The ``shlex`` split of ``text`` and the placeholder names it uses; syntax errors raise."""
    if len(text) > MAX_TEMPLATE_CHARS:
        raise TemplateError.at(
            role, f"the command is {len(text)} characters long, over the {MAX_TEMPLATE_CHARS} limit"
        )
    if "\x00" in text:
        raise TemplateError.at(role, "the command contains a NUL character")
    if not text.strip():
        raise TemplateError.at(role, "the command is empty")
    try:
        argv = tuple(shlex.split(text, comments=False, posix=True))
    except ValueError as error:
        reason = str(error).lower() or "invalid quoting"
        raise TemplateError.at(role, f"cannot split the command: {reason}") from None
    if not argv:
        raise TemplateError.at(role, "the command is empty")
    if not argv[0]:
        raise TemplateError.at(role, "the program name (first argument) is empty")
    if len(argv) > MAX_TEMPLATE_ARGS:
        raise TemplateError.at(role, f"the command has more than {MAX_TEMPLATE_ARGS} arguments")
    used: set[str] = set()
    for index, arg in enumerate(argv):
        used.update(_placeholders_in(arg, index, role))
    if len(used) > MAX_PLACEHOLDERS:
        raise TemplateError.at(role, f"the command uses more than {MAX_PLACEHOLDERS} placeholders")
    return argv, frozenset(used)


def _placeholders_in(arg: str, index: int, role: str) -> list[str]:
    """The placeholder names in one argument; a stray or empty brace pair raises."""
    names: list[str] = []
    for match in _TOKEN.finditer(arg):
        token = match.group(0)
        if token in ("{{", "}}"):
            continue
        where = f"in argument {index + 1} ({quote(arg)})"
        if token in ("{", "}"):
            raise TemplateError.at(
                role, f"stray '{token}' {where}; write '{token * 2}' for a literal brace"
            )
        name = match.group(1)
        if not name:
            raise TemplateError.at(role, f"empty placeholder '{{}}' {where}")
        if len(name) > 64:
            raise TemplateError.at(role, f"unknown placeholder {quote('{' + name + '}')} {where}")
        names.append(name)
    return names


def _check_allowed(used: frozenset[str], role: str, allowed: frozenset[str]) -> None:
    """Raise `TemplateError` naming the placeholders of ``used`` that ``role`` may not use."""
    refused = used - allowed
    if not refused:
        return
    listed = ", ".join("{" + name + "}" for name in sorted(allowed)) or "none"
    unknown = sorted(refused - ALL_PLACEHOLDERS)
    if unknown:
        names = ", ".join("{" + name + "}" for name in unknown)
        plural = "s" if len(unknown) > 1 else ""
        raise TemplateError.at(
            role,
            f"unknown placeholder{plural} {names} (allowed: {listed}; write {{{{ and }}}} for a "
            "literal brace, e.g. ${{HOME}} or $HOME for an environment variable)",
        )
    names = ", ".join("{" + name + "}" for name in sorted(refused))
    raise TemplateError.at(
        role, f"{names} cannot be used in the {role} command (allowed: {listed})"
    )
