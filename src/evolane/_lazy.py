"""Package facades that load their modules on first use (PEP 562).

A facade's ``__init__`` names each public name in ``__all__`` and imports it once, in an
``if TYPE_CHECKING:`` block of plain ``from evolane.PACKAGE._module import name`` imports:
type checkers and readers see them, and `lazy_exports` reads the same imports from the
facade's compiled code (once, on the first lookup: source or bytecode-only install alike)
to know which module holds each name. So ``import evolane.campaign._runs`` (or ``from
evolane.campaign import StoreLayout``) loads that module and what it imports, not the whole
campaign, its lanes, sandbox, trio and numpy: a read-only command such as ``evolane runs``
starts without them. ``tests/test_lazy_facades.py`` checks that each facade's ``__all__``
and its block agree and that every name resolves.
"""

from __future__ import annotations

import dis
import importlib
import sys
from collections.abc import Callable
from importlib.machinery import SourceFileLoader, SourcelessFileLoader
from types import CodeType, ModuleType


def imported_names(code: CodeType) -> dict[str, tuple[str, str]]:
    """``{name bound: (module, name imported)}`` of each ``from MODULE import NAME [as
    BOUND]`` the module ``code`` runs at its top level, run or not (a ``TYPE_CHECKING``
    block's included: the compiler keeps its instructions)."""
    found: dict[str, tuple[str, str]] = {}
    module: str | None = None
    imported: str | None = None
    for instruction in dis.get_instructions(code):
        if instruction.opname == "IMPORT_NAME":
            module = instruction.argval
        elif instruction.opname == "IMPORT_FROM":
            imported = instruction.argval
        elif instruction.opname == "STORE_NAME" and imported is not None and module:
            found[instruction.argval] = (module, imported)
            imported = None
    return found


def lazy_exports(package: str) -> Callable[[str], object]:
    """The module ``__getattr__`` of the facade ``package``: each name of its ``__all__``
    is imported from the module its ``TYPE_CHECKING`` block names on first use and kept in
    the package's namespace (the next lookup does not call this); any other name raises
    `AttributeError`, as a missing attribute does (so ``from package import _submodule``
    still imports the submodule). The facade's ``dir()`` lists every public name."""
    facade = sys.modules[package]
    namespace = facade.__dict__
    homes: dict[str, tuple[str, str]] = {}

    def __dir__() -> list[str]:  # every public name, loaded or not (a REPL, an editor)
        return sorted({*namespace, *namespace.get("__all__", ())})

    namespace["__dir__"] = __dir__

    def __getattr__(name: str) -> object:
        if not homes:  # the facade's own code, read once
            homes.update(_homes(facade))
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home[0]), home[1])
        namespace[name] = value
        return value

    return __getattr__


def _homes(facade: ModuleType) -> dict[str, tuple[str, str]]:
    """Where each name of ``facade.__all__`` is defined, from the facade's compiled code
    (read by a loader of its own: an import hook, pytest's for one, may have loaded it)."""
    origin = str(facade.__file__)
    kind = SourceFileLoader if origin.endswith(".py") else SourcelessFileLoader
    code = kind(facade.__name__, origin).get_code(facade.__name__)
    wanted = set(getattr(facade, "__all__", ()))
    return {name: home for name, home in imported_names(code).items() if name in wanted}
