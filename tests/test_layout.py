"""The package's shape: no import cycles between autoshard's modules, no module over 400 lines,
and the solver as subpackages by role, each importing only those above it.

Every import counts, at module level, inside functions and under TYPE_CHECKING alike: a lazy
import that closes a circle still ties the two modules into one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parents[1] / "autoshard"
MAX_LINES = 400


def module_name(path: Path) -> str:
    """Dotted module name of a file of the package (a package's __init__ is the package)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that ``path`` imports anywhere in its body."""
    found: set[str] = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {name for name in names if name in modules}
    return found


def import_graph() -> nx.DiGraph:
    """Module -> the package's modules it imports."""
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(f) for f in files}
    graph = nx.DiGraph()
    for f in files:
        source = module_name(f)
        graph.add_node(source)
        graph.add_edges_from((source, target) for target in imports_of(f, modules) if target != source)
    return graph


def test_no_module_imports_itself_through_others():
    graph = import_graph()
    graph.remove_nodes_from([n for n in list(graph) if n == "autoshard"])  # the lazy re-exports of __init__
    cycles = sorted(sorted(c) for c in nx.simple_cycles(graph))
    assert not cycles, f"import cycles: {cycles}"


def test_the_import_graph_sees_imports_at_every_level():
    graph = import_graph()
    assert graph.has_edge("autoshard.solver.run.workers", "autoshard.solver.search.turns")  # inside a function
    assert graph.has_edge("autoshard.solver.api", "autoshard.solver.run.solve")  # at module level


def test_no_module_is_over_the_line_limit():
    long = {str(f.relative_to(PACKAGE.parent)): n for f in PACKAGE.rglob("*.py")
            if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_the_top_level_holds_packages_and_entry_points_only():
    modules = {f.stem for f in PACKAGE.glob("*.py")}
    assert modules == {"__init__", "api", "errors", "solve", "run", "train"}


SOLVER = "autoshard.solver"
SOLVER_LAYERS = {"model": set(), "procs": set(), "core": {"model", "procs"},
                 "engines": {"model", "procs", "core"}, "bounds": {"model", "procs", "core", "engines"},
                 "search": {"model", "procs", "core", "engines", "bounds"},
                 "run": {"model", "procs", "core", "engines", "bounds", "search"}}
"""Which of the solver's subpackages each may import: only those above it (solver/__init__.py)."""
SOLVER_TOP = {"__init__", "api", "precompile"}


def test_the_solver_is_subpackages_by_role_and_entry_points():
    solver = PACKAGE / "solver"
    assert {f.stem for f in solver.glob("*.py")} == SOLVER_TOP
    assert {d.name for d in solver.iterdir() if (d / "__init__.py").exists()} == set(SOLVER_LAYERS)


def test_each_solver_subpackage_imports_only_those_above_it():
    graph = import_graph()
    wrong = []
    for source, target in graph.edges:
        parts, into = source.split("."), target.split(".")
        if source.startswith(SOLVER + ".") and len(parts) > 2 and parts[2] in SOLVER_LAYERS:
            layer = parts[2]
            if target.startswith(SOLVER + ".") and len(into) > 2 and into[2] != layer \
                    and into[2] not in SOLVER_LAYERS[layer]:
                wrong.append(f"{source} -> {target}")
            elif not target.startswith(SOLVER + ".") and target.startswith("autoshard.") \
                    and target != "autoshard.errors":
                wrong.append(f"{source} -> {target}")
    assert not wrong, f"solver imports against its layering: {sorted(wrong)}"


def test_only_procs_forks():
    forking = {str(f.relative_to(PACKAGE.parent)) for f in (PACKAGE / "solver").rglob("*.py")
               if "os.fork(" in f.read_text() and f.parent.name != "procs"}
    assert not forking, f"forks outside solver/procs: {forking}"


def test_only_core_highs_calls_highs():
    """highspy and scipy's ``linprog`` (a second copy of HiGHS) are reached through
    solver/core/highs.py alone, which silences them and resets their threads in forked children."""
    calling = set()
    for f in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, (ast.Import, ast.ImportFrom)) else []
            module = (node.module or "") if isinstance(node, ast.ImportFrom) else ""
            if "highspy" in names or module == "highspy" or (module == "scipy.optimize" and "linprog" in names):
                calling.add(str(f.relative_to(PACKAGE.parent)))
    assert calling == {"autoshard/solver/core/highs.py"}, f"HiGHS called outside solver/core/highs.py: {calling}"
