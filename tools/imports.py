"""The house's arrows: which module of ``workbench`` imports which, the circles among them, the private
names imported across modules, and the arrows between packages that go up the layer order.

    python3 tools/imports.py            # a summary: modules, arrows, circles (between modules, between
                                        # packages), private imports, arrows up the layers
    python3 tools/imports.py --json     # the same as JSON
    python3 tools/imports.py --root DIR # another checkout of the project (before and after a change)

It also gives the sizes: lines of the package, and the modules and functions that sit just under the
house's gauges (400 lines a module, 60 a function): cut to the gauge rather than by concept, they
cluster there.

Every import counts, at the top of a module or inside a function (a lazy import is still an arrow:
the module cannot be understood without the other), except those under ``if TYPE_CHECKING:``, which
never run. Standard library only, reading the source with ``ast``: nothing is imported.
``tests/test_layout.py`` keeps the circles and the private imports at none.
"""
from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "workbench"

#: the layers, lowest first: a package may import its own layer and those below (docs/architecture.md)
LAYERS = [
    ["workbench.checks", "workbench.sizes", "workbench.paths", "workbench.telemetry", "workbench.deadline",
     "workbench.lazy", "workbench.idx", "workbench.syspkgs", "workbench.files", "workbench.options",
     "workbench.generated_sets", "workbench.ports", "workbench.lr_schedules", "workbench.mpilib", "workbench.runtime.processes"],
    ["workbench.schedules", "workbench.network"],
    ["workbench.comm.names", "workbench.comm.options", "workbench.comm.buckets", "workbench.optim.fragments",
     "workbench.optim.definition", "workbench.optim.registry", "workbench.data", "workbench.models",
     "workbench.comm.hookspec", "workbench.config"],
    ["workbench.summary", "workbench.results", "workbench.store", "workbench.runtime.rundir"],
    ["workbench.netsim", "workbench.burst"],
    ["workbench.comm", "workbench.collectives"],
    ["workbench.vcluster"],
    ["workbench.runtime", "workbench.optim", "workbench.bench", "workbench.burst.execute", "workbench.burst.profiler"],
    ["workbench.dashboard", "workbench.sweep"],
    ["workbench.cli", "workbench.demo", "workbench"],
]


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    found = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The ids of the import nodes under ``if TYPE_CHECKING:``."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for part in node.body for n in ast.walk(part)}
    return skip


def arrows(root: Path = ROOT) -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    """``(module -> the modules it imports, [(module, imported module, private name)])``."""
    known = modules(root)
    graph: dict[str, set[str]] = {name: set() for name in known}
    private = []
    for name, path in known.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _type_checking_only(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if not target.startswith(PACKAGE):
                    continue
                for alias in node.names:
                    full = f"{target}.{alias.name}"
                    module = full if full in known else target
                    if module in known and module != name:
                        graph[name].add(module)
                    if alias.name.startswith("_") and not alias.name.startswith("__") and full not in known:
                        private.append((name, target, alias.name))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in known and alias.name != name:
                        graph[name].add(alias.name)
    # a module's own package (its __init__) is not an arrow out of it: Python runs it first anyway
    for name in graph:
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    return graph, private


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def package_arrows(graph: dict[str, set[str]], root: Path = ROOT) -> dict[str, set[str]]:
    """The arrows between packages: a module's package is its folder (a package's own ``__init__`` is the
    package); arrows into a package's parent are left out (Python runs it first anyway)."""
    known = modules(root)

    def package(module: str) -> str:
        return module if known[module].name == "__init__.py" else module.rsplit(".", 1)[0]
    found: dict[str, set[str]] = {}
    for a, targets in graph.items():
        found.setdefault(package(a), set())
        for b in targets:
            pa, pb = package(a), package(b)
            if pa != pb and not pa.startswith(pb + "."):
                found[pa].add(pb)
                found.setdefault(pb, set())
    return found


def layer_of(module: str) -> int:
    """The layer of ``module``: that of the longest entry of :data:`LAYERS` it is or lies under."""
    best, level = "", len(LAYERS) - 1
    for i, entries in enumerate(LAYERS):
        for entry in entries:
            if (module == entry or module.startswith(entry + ".")) and len(entry) > len(best):
                best, level = entry, i
    return level


def climbs(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The arrows that go up the layers: a module importing one of a higher layer."""
    return sorted((a, b) for a, targets in graph.items() for b in targets if layer_of(b) > layer_of(a))


#: the house's gauges (tests/test_layout.py): lines of a module, lines of code of a function
MODULE_GAUGE, FUNCTION_GAUGE = 400, 60
#: "just under a gauge": within this share of it
NEAR = 0.05


def functions(tree: ast.AST, prefix: str = ""):
    """``(qualified name, node)`` of every function in ``tree``, methods and nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = prefix + node.name
            if not isinstance(node, ast.ClassDef):
                yield name, node
            yield from functions(node, name + ".")
        else:
            yield from functions(node, prefix)


def code_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's lines from its ``def`` to its end, less its docstring's: a long contract is not
    a long function."""
    lines = node.end_lineno - node.lineno + 1
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines -= first.end_lineno - first.lineno + 1
    return lines


def sizes(root: Path = ROOT) -> dict:
    """Lines of the package; the modules (lines) and functions (lines of code) over their gauge, and just
    under it (``"module:qualified name"`` for a function)."""
    lines, found = 0, {key: [] for key in ("modules_over_gauge", "modules_near_gauge", "functions_over_gauge",
                                           "functions_near_gauge")}

    def place(kind: str, name: str, n: int, gauge: int) -> None:
        if n > gauge:
            found[f"{kind}_over_gauge"].append([name, n])
        elif n >= gauge * (1 - NEAR):
            found[f"{kind}_near_gauge"].append([name, n])

    for name, path in modules(root).items():
        text = path.read_text(encoding="utf-8")
        lines += len(text.splitlines())
        place("modules", name, len(text.splitlines()), MODULE_GAUGE)
        for function, node in functions(ast.parse(text)):
            place("functions", f"{name}:{function}", code_lines(node), FUNCTION_GAUGE)
    return {"lines": lines, **found}


def report(root: Path = ROOT) -> dict:
    graph, private = arrows(root)
    return {"modules": len(graph), "arrows": sum(len(t) for t in graph.values()), "circles": circles(graph),
            "package_circles": circles(package_arrows(graph, root)),
            "private_imports": [list(p) for p in private], "climbs": [list(c) for c in climbs(graph)],
            **sizes(root)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    root = Path(argv[argv.index("--root") + 1]).resolve() if "--root" in argv else ROOT
    found = report(root)
    if "--json" in argv:
        print(json.dumps(found, indent=1))
        return 0
    print(f"{found['modules']} modules, {found['arrows']} arrows, {len(found['circles'])} circles between modules, "
          f"{len(found['package_circles'])} between packages, "
          f"{len(found['private_imports'])} private names imported across modules, {len(found['climbs'])} arrows "
          f"up the layers")
    print(f"{found['lines']} lines; modules over {MODULE_GAUGE} lines: {len(found['modules_over_gauge'])}, within "
          f"{NEAR:.0%} under it: {len(found['modules_near_gauge'])}; functions over {FUNCTION_GAUGE} lines of code: "
          f"{len(found['functions_over_gauge'])}, within {NEAR:.0%} under it: {len(found['functions_near_gauge'])}")
    for group in found["circles"]:
        print("circle: " + " <-> ".join(group))
    for group in found["package_circles"]:
        print("package circle: " + " <-> ".join(group))
    for module, source, name in found["private_imports"]:
        print(f"private: {module} imports {name} from {source}")
    for low, high in found["climbs"]:
        print(f"climb: {low} -> {high}")
    for key in ("modules_over_gauge", "modules_near_gauge", "functions_over_gauge", "functions_near_gauge"):
        for name, n in found[key]:
            print(f"{key.replace('_', ' ')}: {name} ({n} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
