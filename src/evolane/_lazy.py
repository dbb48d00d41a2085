"""Package facades that load their modules on first use (PEP 562).

A package's ``__init__`` names its public names twice: in an ``if TYPE_CHECKING:`` block of
plain imports, which type checkers and readers see, and in the table given to
`lazy_exports`, which the interpreter uses. So ``import evolane.campaign._runs`` (or
``from evolane.campaign import StoreLayout``) loads that module and what it imports, not the
whole campaign, its lanes, sandbox, trio and numpy: a read-only command such as
``evolane runs`` starts without them. ``tests/test_lazy_facades.py`` checks that the two
lists agree and that every name resolves.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_exports(package: str, modules: Mapping[str, tuple[str, ...]]) -> Callable[[str], object]:
    """The module ``__getattr__`` of the facade ``package``: each name of ``modules``
    ({module: names it exports}) is imported from its module on first use and kept in the
    package's namespace (the next lookup does not call it); any other name raises
    `AttributeError`, as a missing attribute does (so ``from package import _submodule``
    still imports the submodule)."""
    home = {name: module for module, names in modules.items() for name in names}
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> object:
        module = home.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
