"""The architecture rules of DESIGN §1, checked over source text with `ast` (no imports run).

`check_tree(modules)` takes ``{dotted module name: source}`` and returns every violation as
one readable line, so a test can feed it a tree with one bad import and see it reported.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

LAYERS: tuple[tuple[str, ...], ...] = (
    ("_faults", "_allocator", "_version", "_lazy"),  # plumbing every layer may call (root
    # modules): the fault-injection hook, the process's allocator policy (light: the CLI
    # imports it), the package's version and the facades' load on first use
    ("messages",),
    ("store",),
    ("stats",),
    ("inputs",),
    ("sandbox",),
    ("actors",),
    ("supervisors",),
    ("lanes",),
    ("distributed",),
    ("measure",),
    ("views",),
    ("campaign",),
    ("embed",),
    ("aio",),
    ("examples",),
    ("testing",),
    ("stress",),
    ("cli",),
    ("__init__", "__main__"),  # the package's facade and entry point
)
"""Each unit (a subpackage or a root module of ``evolane``) imports only units listed
before it, never one after it or beside it."""

SHARED_ROOT_MODULES = frozenset({"_faults", "_allocator", "_version", "_lazy"})
"""Root modules whose private name every unit may import (the package's own plumbing)."""

IO_FREE = {"measure._plan": ("trio", "os", "subprocess", "anyio", "asyncio", "socket")}
"""Modules that decide without IO: they may not import these."""

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80  # body lines, the signature not counted


@dataclass(frozen=True)
class Import:
    """One import statement's target, resolved to an absolute dotted name."""

    source: str  # the importing module, e.g. "evolane.measure._scheduler"
    target: str  # e.g. "evolane.lanes._replay" or "evolane.lanes.ReplayLane"
    line: int


def _unit(module: str) -> str:
    """The layer unit of an ``evolane.*`` module: its first component after ``evolane``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _layer_of(unit: str) -> int | None:
    for index, units in enumerate(LAYERS):
        if unit in units:
            return index
    return None


def _is_package(module: str, modules: Mapping[str, str]) -> bool:
    return any(other.startswith(module + ".") for other in modules)


def imports_of(module: str, source: str, modules: Mapping[str, str]) -> list[Import]:
    """Every ``evolane`` import in ``source``: top-level, lazy and TYPE_CHECKING alike."""
    package = module if _is_package(module, modules) else module.rsplit(".", 1)[0]
    found: list[Import] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [Import(module, a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for alias in node.names:
                full = f"{target}.{alias.name}"
                found.append(Import(module, full if full in modules else target, node.lineno))
    return [i for i in found if i.target == "evolane" or i.target.startswith("evolane.")]


def _module_of(target: str, modules: Mapping[str, str]) -> str:
    """The module an import target names (``evolane.lanes.ReplayLane`` -> ``evolane.lanes``)."""
    while target not in modules and "." in target:
        target = target.rsplit(".", 1)[0]
    return target


def _private_crossing(imp: Import) -> bool:
    """An import of a ``_private`` module that belongs to another unit."""
    src, dst = _unit(imp.source), _unit(imp.target)
    if src == dst or dst in SHARED_ROOT_MODULES:
        return False
    return any(part.startswith("_") for part in imp.target.split(".")[2:])


def _cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _size_problems(module: str, source: str) -> Iterable[str]:
    lines = len(source.splitlines())
    if lines > MAX_MODULE_LINES:
        yield f"{module}: {lines} lines (at most {MAX_MODULE_LINES})"
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            body = (node.end_lineno or node.lineno) - node.body[0].lineno + 1
            if body > MAX_FUNCTION_LINES:
                yield (
                    f"{module}:{node.lineno}: function {node.name} has {body} body lines "
                    f"(at most {MAX_FUNCTION_LINES})"
                )


def check_tree(modules: Mapping[str, str]) -> list[str]:
    """Every violation of the rules in ``modules`` ({dotted name: source}), one line each."""
    problems: list[str] = []
    file_graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, source in sorted(modules.items()):
        problems += _size_problems(module, source)
        src_unit = _unit(module)
        src_layer = _layer_of(src_unit)
        if src_layer is None:
            problems.append(f"{module}: {src_unit!r} is in no layer of LAYERS")
            continue
        for imp in imports_of(module, source, modules):
            where = f"{module}:{imp.line}"
            dst_unit = _unit(imp.target)
            dst_layer = _layer_of(dst_unit)
            if dst_unit != src_unit:
                if dst_layer is None or dst_layer >= src_layer:
                    problems.append(
                        f"{where}: imports {imp.target} ({dst_unit!r} is not below {src_unit!r})"
                    )
                if _private_crossing(imp):
                    problems.append(f"{where}: imports another package's private {imp.target}")
            target_module = _module_of(imp.target, modules)
            if target_module != module and target_module in modules:
                file_graph[module].add(target_module)
        short = module.removeprefix("evolane.")
        for banned in IO_FREE.get(short, ()):
            for node in ast.walk(ast.parse(source)):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names = [node.module]
                if any(n == banned or n.startswith(banned + ".") for n in names):
                    problems.append(f"{module}:{node.lineno}: IO-free module imports {banned}")
    # A package's __init__ re-exports its own modules: edges into it from its own files are
    # the facade, not a cycle of the design.
    for module in file_graph:
        if _is_package(module, modules):
            file_graph[module] = {t for t in file_graph[module] if not t.startswith(module + ".")}
    for component in _cycles(file_graph):
        problems.append("import cycle between files: " + " <-> ".join(component))
    return problems


def read_tree(root: Path) -> dict[str, str]:
    """``{dotted module name: source}`` for every .py file under the package dir ``root``."""
    modules: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path.read_text()
    return modules
