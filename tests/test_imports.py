"""cuctx's modules import each other without cycles: the graph is built from the source (every
import, module-level or inside a function; type-only imports under ``if TYPE_CHECKING:``
aside), and must be acyclic."""

from __future__ import annotations

import ast
from pathlib import Path

import cuctx

PACKAGE = Path(cuctx.__file__).parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, type_only: bool = False):
    """Every Import/ImportFrom node, skipping the bodies of ``if TYPE_CHECKING:`` (or, with
    ``type_only``, only those bodies' imports)."""
    stack = [(tree, False)]
    while stack:
        node, typing = stack.pop()
        if isinstance(node, ast.If) and _type_checking(node.test):
            stack.extend((child, True) for child in node.body)
            stack.extend((child, typing) for child in node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if typing == type_only:
                yield node
        stack.extend((child, typing) for child in ast.iter_child_nodes(node))


def import_graph(type_only: bool = False) -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p): p for p in paths}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    # The C extension (cuctx._native, built from src/cuctx/csrc/) imports nothing of cuctx:
    # what it uses is handed to it. It is a node, so importing it is no import of the package.
    graph["cuctx._native"] = set()
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(), str(path)), type_only):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = package.split(".")
                if node.level:
                    base = base[: len(base) - node.level + 1]
                    if node.module:
                        base += node.module.split(".")
                else:
                    base = node.module.split(".")
                base = ".".join(base)
                # ``from . import x`` imports the submodule x when there is one
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in graph else base for a in node.names
                ]
            for target in targets:
                while target and target not in graph:  # a name inside a module
                    target = target.rpartition(".")[0]
                if target and target != name and target.startswith("cuctx"):
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_function_level_imports_and_skips_type_only_ones():
    graph = import_graph()
    assert "cuctx._driver.sim" in graph["cuctx._driver"]  # imported inside _load_sim
    assert "cuctx.device" not in graph["cuctx.context"]  # only under TYPE_CHECKING there
    assert "cuctx.device" in import_graph(type_only=True)["cuctx.context"]


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def family(module: str) -> str:
    """The package a module lives in: the root's modules are the core family, each
    subpackage (kernels, memory, graphs, tools, the sim, ...) is one."""
    return module if module == "cuctx" else module.rpartition(".")[0]


def test_type_hints_never_point_up_across_families():
    """Inside one family, modules may name each other's types (a Kernel makes Launchers, a
    Launcher names its Kernel: a protocol would only hide that). Across families, type-only
    imports obey the layers like any other: added to the graph, they close no cycle."""
    graph = import_graph()
    for importer, targets in import_graph(type_only=True).items():
        graph[importer] |= {t for t in targets if family(t) != family(importer)}
    assert cycles(graph) == []


def with_package_inits(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``graph`` plus what Python runs on each import: importing ``a.b.c`` runs the
    ``__init__`` of ``a.b`` (and of ``a``) first, unless the importer lives inside it."""
    out = {name: set(targets) for name, targets in graph.items()}
    for name, targets in graph.items():
        for target in targets:
            package = target.rpartition(".")[0]
            while package and package != "cuctx":
                if package in graph and package != name and not name.startswith(package + "."):
                    out[name].add(package)
                package = package.rpartition(".")[0]
    return out


def imports_that_run_back_up(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The imports that close a cycle once package ``__init__``s count: each leads to a
    module that imports the importer back (an edge inside a strongly connected part)."""
    parts = {module: tuple(part) for part in cycles(graph) for module in part}
    return sorted(
        (name, target)
        for name, targets in graph.items()
        for target in targets
        if name in parts and parts.get(target) == parts[name]
    )


def test_importing_a_module_runs_no_layer_above_it():
    """Python runs a package's ``__init__`` before any module of it, and a family's
    ``__init__`` re-exports the family, so a lower layer that reaches into an upper family's
    module runs that whole family. The readers of device code (`cuctx.devcode`) sit below the
    driver seam for that reason: the sim reads images and checks twins through them, never
    through `cuctx.kernels`, whose ``__init__`` imports contexts, memory and launches (with
    the sim importing `kernels._cubin` and `kernels._twin_check` as it once did, 106 imports
    ran back up through one cycle of 34 modules). None runs back up now."""
    assert imports_that_run_back_up(with_package_inits(import_graph())) == []


def test_a_lower_layer_reaching_into_an_upper_family_is_seen():
    graph = {
        "cuctx.low": {"cuctx.up.mod"},
        "cuctx.up": {"cuctx.up.main"},
        "cuctx.up.main": {"cuctx.low"},
        "cuctx.up.mod": set(),
    }
    assert imports_that_run_back_up(graph) == []  # no cycle without the package's __init__
    assert imports_that_run_back_up(with_package_inits(graph)) == [
        ("cuctx.low", "cuctx.up"),
        ("cuctx.up", "cuctx.up.main"),
        ("cuctx.up.main", "cuctx.low"),
    ]
