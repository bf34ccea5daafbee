"""The library's import graph, read from the source with ``ast``: layers import only layers, and nothing is a circle.

Every ``import`` counts: at module level, inside a function (a lazy import still ties two modules
together) and under ``if TYPE_CHECKING:`` (a circle hidden from the interpreter is still one for the
reader). ``from package import name`` is an import of the submodule ``package.name`` where there is
one, else of the package.
"""
import ast
from pathlib import Path
from typing import Collection

ROOT = Path(__file__).resolve().parent.parent


def library_modules() -> dict[str, Path]:
    """``{dotted name: source file}`` of every module under ``seqapps/`` (a package by its ``__init__.py``)."""
    modules = {}
    for path in sorted((ROOT / "seqapps").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_modules(name: str, path: Path, modules: Collection[str]) -> set[str]:
    """The modules of ``modules`` that a module imports (``from a import b``: ``a.b`` if it is one, else ``a``).

    Args:
        name: the module's dotted name (to resolve relative imports).
        path: its source file.
        modules: the dotted names that count.
    """
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                         for alias in node.names)
    return (found & set(modules)) - {name}


def library_imports() -> dict[str, set[str]]:
    """``{module: the library modules it imports}`` for every module under ``seqapps/``."""
    modules = library_modules()
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: each strongly connected set of two or more modules, sorted (Tarjan)."""
    index: dict[str, int] = {}
    lowest: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(module: str) -> None:
        index[module] = lowest[module] = len(index)
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                lowest[module] = min(lowest[module], lowest[target])
            elif target in stack:
                lowest[module] = min(lowest[module], index[target])
        if lowest[module] == index[module]:
            members = stack[stack.index(module):]
            del stack[stack.index(module):]
            if len(members) > 1:
                cycles.append(sorted(members))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles


def test_the_cycle_finder_finds_a_circle_and_reads_lazy_relative_and_type_checking_imports(tmp_path):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import seqapps.x\n\n"
                      "from . import y\nfrom .z import Z\n\n\ndef f():\n    from seqapps import training\n")
    modules = {"seqapps", "seqapps.m", "seqapps.x", "seqapps.y", "seqapps.z", "seqapps.training"}
    assert imported_modules("seqapps.m", source, modules) == {"seqapps.x", "seqapps.y", "seqapps.z",
                                                              "seqapps.training"}


def test_no_library_module_imports_itself_in_a_circle():
    assert import_cycles(library_imports()) == []


def test_layers_import_only_layers_and_keras():
    outside = {name: sorted(imported for imported in imported if not imported.startswith("seqapps.layers"))
               for name, imported in library_imports().items() if name.startswith("seqapps.layers")}
    assert {name: found for name, found in outside.items() if found} == {}
