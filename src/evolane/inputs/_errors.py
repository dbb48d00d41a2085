"""The errors raised for bad user input: one line each, naming the input (DESIGN §10)."""

from __future__ import annotations

from typing import Any


def one_line(text: str) -> str:
    """``text`` with every line break (including Unicode separators) folded into a space."""
    parts = text.splitlines()
    return " ".join(part.strip() for part in parts) if len(parts) > 1 else text


def quote(value: object, limit: int = 60) -> str:
    """A short, one-line ``repr`` of ``value`` for an error message (truncated past ``limit``)."""
    shown = repr(value)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def first_problem(error: Any, whole: str = "the record") -> str:
    """The first field error of a pydantic ``ValidationError`` as ``where: message`` (one
    line; ``whole`` names the place when the error is on the value itself)."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or whole
    return f"{where}: {first['msg']}"


class InputError(ValueError):
    """Bad user input; ``str(error)`` is one clear line (the CLI maps it to exit code 2)."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))

    @property
    def message(self) -> str:
        """The one-line message."""
        return str(self.args[0])


class DatasetError(InputError):
    """A dataset that cannot be used: ``"<path>:<line>: <reason>"`` or ``"<path>: <reason>"``."""

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.path = path
        self.line = line
        self.reason = reason

    @classmethod
    def at(cls, path: str, line: int | None, reason: str) -> DatasetError:
        """The error for ``reason`` at ``path`` (and ``line``, 1-based, when there is one)."""
        where = path if line is None else f"{path}:{line}"
        return cls(f"{where}: {reason}", path=path, line=line, reason=reason)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_dataset_error, (self.message, self.path, self.line, self.reason))


def _rebuild_dataset_error(
    message: str, path: str | None, line: int | None, reason: str | None
) -> DatasetError:
    return DatasetError(message, path=path, line=line, reason=reason)


class TemplateError(InputError):
    """A command template that cannot be used: ``"<role> command: <reason>"``."""

    def __init__(self, message: str, *, role: str | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.role = role
        self.reason = reason

    @classmethod
    def at(cls, role: str, reason: str) -> TemplateError:
        """The error for ``reason`` in the ``role`` command."""
        return cls(f"{role} command: {reason}", role=role, reason=reason)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_template_error, (self.message, self.role, self.reason))


def _rebuild_template_error(message: str, role: str | None, reason: str | None) -> TemplateError:
    return TemplateError(message, role=role, reason=reason)
