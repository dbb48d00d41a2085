"""Plugins through entry points: named backends a package adds (DESIGN §12).

Four groups:

- ``evolane.backends``: replay backends, used as ``--replay NAME:ARGS``;
- ``evolane.judges``: judges, used as ``--judge NAME:ARGS``;
- ``evolane.optimizers``: optimizers, used as ``--optimizer NAME:ARGS``;
- ``evolane.observers``: progress observers, enabled by ``--observer NAME``.

A backend entry point loads a **factory** ``factory(args: str) -> Backend``: it is called
once per run with the text after ``NAME:`` (stripped, possibly empty) and returns the
in-process `Backend` (``async def backend(call: BackendCall) -> ...``, see
`evolane.lanes._backends` for what each role returns). Everything a single call needs (the
case, the candidate, the seed, the usage file) comes in its `BackendCall`. An observer entry
point loads a factory taking no argument that returns an observer (`evolane.embed.Observer`).

A value is a plugin spec only when it has the shape ``NAME:ARGS`` (`evolane.inputs.
plugin_words`) AND NAME is installed in the role's group; the built-ins ``llm:`` (judge,
optimizer) and ``agent:`` (optimizer) win over a plugin of the same name. Anything else is a
command template, as before plugins existed (``python3 x.py``, ``sh -c 'echo a:b'``).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from importlib.metadata import EntryPoint, PackageNotFoundError, entry_points, version
from typing import Any, Literal

from evolane.actors import is_crash
from evolane.inputs import InputError, plugin_words
from evolane.lanes._agent_presets import BUILTIN_AGENTS
from evolane.lanes._agents import AGENT_ENTRY_POINTS, AGENT_PREFIX
from evolane.lanes._backends import Backend
from evolane.lanes._llm_extra import llm_available

Role = Literal["replay", "judge", "optimizer"]
BACKEND_GROUPS: dict[str, str] = {
    "replay": "evolane.backends",
    "judge": "evolane.judges",
    "optimizer": "evolane.optimizers",
}
"""The entry-point group of each role's plugin backends."""
OBSERVER_GROUP = "evolane.observers"
"""The entry-point group whose entries each load an observer factory (no arguments)."""
BUILTIN_NAMES: dict[str, frozenset[str]] = {
    "replay": frozenset(),
    "judge": frozenset({"llm"}),
    "optimizer": frozenset({"llm", "agent"}),
}
"""Spec names a role's built-ins own: a plugin of the same name is never used there."""


class PluginError(InputError):
    """A plugin that cannot be used: it fails to load, is not callable, or its factory
    raised (one line naming the plugin; the CLI exits 2). Raising covers ``sys.exit`` and
    any other `BaseException` but a ``KeyboardInterrupt`` (`evolane.actors.is_crash`)."""


@dataclass(frozen=True)
class PluginSpec:
    """A ``--replay``/``--judge``/``--optimizer`` value that names an installed plugin."""

    role: str
    name: str
    args: str
    point: EntryPoint

    @property
    def where(self) -> str:
        """How errors name it: the flag, the value and the entry point."""
        return f"--{self.role} {self.name}:{self.args} (plugin {self.point.value})"


def plugin_points(group: str) -> dict[str, EntryPoint]:
    """The installed entry points of ``group`` by name (for a name installed twice, evolane's
    own, else the first by ``module:attr``, so the choice does not depend on the path order).
    Found by review: another package's ``otel`` observer whose module sorted first took
    ``--observer otel`` from evolane's OpenTelemetry exporter."""
    points: dict[str, EntryPoint] = {}
    for point in sorted(entry_points(group=group), key=lambda p: (p.name, not _own(p), p.value)):
        points.setdefault(point.name, point)
    return points


def _own(point: EntryPoint) -> bool:
    """Whether evolane itself declares ``point`` (its ``otel`` observer)."""
    return _shipped_by(point)[0] == "evolane"


def plugin_spec(spec: str | None, role: str) -> PluginSpec | None:
    """The plugin ``spec`` names for ``role``, or None: a built-in spec, or a command
    template (also when the name has the shape of a plugin but none is installed)."""
    words = plugin_words(spec)
    if words is None or words[0] in BUILTIN_NAMES[role]:
        return None
    point = plugin_points(BACKEND_GROUPS[role]).get(words[0])
    return PluginSpec(role, words[0], words[1], point) if point is not None else None


def load_entry(point: EntryPoint, where: str) -> Any:
    """What ``point`` loads, which must be callable; `PluginError` (naming ``where``) when
    it fails to import or is not callable."""
    try:
        loaded = point.load()
    except BaseException as error:  # a plugin's own import failure, said in one line
        if not is_crash(error):  # a Ctrl-C goes on; a sys.exit is the plugin's failure
            raise
        raise PluginError(f"{where}: failed to load: {type(error).__name__}: {error}") from None
    if not callable(loaded):
        raise PluginError(f"{where}: {point.value} is not callable (a factory is expected)")
    return loaded


def check_plugin(spec: PluginSpec) -> None:
    """Import ``spec``'s factory now (before anything is written); it is called per run."""
    load_entry(spec.point, spec.where)


def plugin_backend(spec: PluginSpec) -> Backend:
    """Call ``spec``'s factory with its args: the run's backend for the role. `PluginError`
    when it fails to load, raises, or returns something that is not callable."""
    factory = load_entry(spec.point, spec.where)
    try:
        backend = factory(spec.args)
    except BaseException as error:  # the factory refused its args, or has a bug: one line
        if not is_crash(error):  # a Ctrl-C; a sys.exit (argparse) is the factory's failure
            raise
        raise PluginError(
            f"{spec.where}: the factory raised {type(error).__name__}: {error}"
        ) from None
    if not callable(backend):
        raise PluginError(
            f"{spec.where}: the factory returned {type(backend).__name__}, not a backend"
        )
    return backend  # type: ignore[no-any-return]


@dataclass(frozen=True)
class InstalledPlugin:
    """One line of ``evolane plugins``: what a spec name resolves to and who ships it."""

    group: str
    name: str
    """How it is named: ``NAME`` in ``NAME:ARGS`` (``agent:NAME`` for a coding agent)."""
    target: str
    """``module:attr`` of what it loads."""
    distribution: str
    version: str
    builtin: bool = False
    shadowed: bool = False
    """A plugin named like a built-in of its group (``llm``, ``agent``, evolane's own
    ``otel`` observer): never used."""
    missing: str = ""
    """The extra it needs that is not installed here (``llm``, ``otel``): naming it fails."""


def installed_plugins() -> list[InstalledPlugin]:
    """Everything a spec can name, by group: evolane's built-ins (``llm`` for judges and
    optimizers, the ``agent:`` presets) and every installed entry point of the plugin
    groups and of ``evolane.agents`` (a plugin a built-in shadows is listed, not used)."""
    own = _own_version()
    llm = "" if llm_available() else "llm"
    found = [
        InstalledPlugin(
            "evolane.judges", "llm", "evolane.lanes:llm_judge", "evolane", own, True, missing=llm
        ),
        InstalledPlugin(
            "evolane.optimizers",
            "llm",
            "evolane.lanes:llm_optimizer",
            "evolane",
            own,
            True,
            missing=llm,
        ),
    ]
    found += [
        InstalledPlugin(
            "evolane.optimizers",
            f"{AGENT_PREFIX}{name}",
            f"evolane.lanes:BUILTIN_AGENTS[{name!r}]",
            "evolane",
            own,
            True,
        )
        for name in sorted(BUILTIN_AGENTS)
    ]
    builtins = {role: BUILTIN_NAMES[role] for role in BACKEND_GROUPS}
    shadowing = {BACKEND_GROUPS[role]: names for role, names in builtins.items()}
    shadowing[AGENT_ENTRY_POINTS] = frozenset(BUILTIN_AGENTS)
    for group in (*BACKEND_GROUPS.values(), OBSERVER_GROUP, AGENT_ENTRY_POINTS):
        used = plugin_points(group)
        for point in sorted(entry_points(group=group), key=lambda p: (p.name, p.value)):
            distribution, release = _shipped_by(point)
            shadowed = point.name in shadowing.get(group, frozenset())
            shadowed = shadowed or (_own(used[point.name]) and not _own(point))
            found.append(
                InstalledPlugin(
                    group,
                    point.name,
                    point.value,
                    distribution,
                    release,
                    builtin=_own(point),
                    shadowed=shadowed,
                    missing=_missing_extra(point),
                )
            )
    return found


def _missing_extra(point: EntryPoint) -> str:
    """``otel`` for evolane's own OpenTelemetry observer where its extra is not installed."""
    own = point.value.startswith("evolane.") and point.name == "otel"
    return "otel" if own and importlib.util.find_spec("opentelemetry") is None else ""


def _own_version() -> str:
    try:
        return version("evolane")
    except PackageNotFoundError:  # run from a source tree
        return "?"


def _shipped_by(point: EntryPoint) -> tuple[str, str]:
    """The distribution (name, version) that declares ``point`` (``?`` when unknown, also
    when its metadata cannot be read: found by review, a METADATA that is not UTF-8 made
    ``evolane plugins`` a traceback)."""
    dist = getattr(point, "dist", None)
    if dist is None:
        return "?", "?"
    try:
        return str(dist.metadata["Name"] or "?"), str(dist.version or "?")
    except Exception:  # a broken distribution's own problem, not a reason to fail the list
        return "?", "?"
