"""The architecture as the imports show it: no import circle among the modules of k7core
and k7async, and no module importing another module's private (underscore) names."""

from __future__ import annotations

import ast
from pathlib import Path

from tests._queuehelp import ROOT

PACKAGES = ("k7core", "k7async")


def module_files() -> dict[str, Path]:
    """Every Python module of the packages, by dotted name."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(modules: dict[str, Path]) -> dict[str, list[tuple[str, list[str], int]]]:
    """For each module: (imported module, names taken from it, line), every import
    statement anywhere in the file (``TYPE_CHECKING`` blocks and functions included)."""
    out: dict[str, list[tuple[str, list[str], int]]] = {}
    for name, path in modules.items():
        found: list[tuple[str, list[str], int]] = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found += [(a.name, [], node.lineno) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                target = resolve(name, path.name == "__init__.py", node)
                names = [a.name for a in node.names]
                found.append((target, names, node.lineno))
                # ``from pkg import submodule`` imports the submodule
                found += [(f"{target}.{n}", [], node.lineno) for n in names
                          if f"{target}.{n}" in modules]
        out[name] = found
    return out


def test_no_import_circle() -> None:
    modules = module_files()
    graph = {
        m: sorted({t for t, _, _ in found if t in modules and t != m})
        for m, found in imports(modules).items()
    }
    # a package's __init__ re-exports its modules: an edge into a package is an edge into
    # its __init__, and its modules may not import the package back
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in graph[m]:
            if state.get(t) == 1:
                cycles.append([*stack[stack.index(t):], t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m)
    assert cycles == [], "import circles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_private_name_is_imported_from_another_module() -> None:
    modules = module_files()
    bad = []
    for m, found in imports(modules).items():
        for target, names, line in found:
            if target.split(".")[0] not in PACKAGES:
                continue
            for n in names:
                if n.startswith("_") and not (n.startswith("__") and n.endswith("__")) and (
                    f"{target}.{n}" not in modules
                ):
                    bad.append(f"{modules[m].relative_to(ROOT)}:{line} imports {n} from {target}")
    assert bad == []


def test_the_checker_sees_circles_and_private_names(tmp_path: Path) -> None:
    """The two checks above can fail: they find what they look for in a made-up package."""
    (tmp_path / "a.py").write_text("from .b import _hidden\n")
    (tmp_path / "b.py").write_text("from typing import TYPE_CHECKING\n"
                                   "if TYPE_CHECKING:\n    from .a import x\n")
    found = imports({"p.a": tmp_path / "a.py", "p.b": tmp_path / "b.py"})
    assert found["p.a"] == [("p.b", ["_hidden"], 1)]
    assert found["p.b"][-1] == ("p.a", ["x"], 3)
