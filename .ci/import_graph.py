"""The lint tier's import-graph check: imports run one way and never in a circle.

Layers, from the bottom; a module imports its own layer and those below it, never one above:
  base      reference.errors, .extras, .files, .rules: what every step shares;
  request   reference.request.*: arguments, pipeline folder, admission, plan, precision;
  read      reference.read.*: headers, checkpoint, reader pool, prefetch, preflight;
  place     reference.place.*: module build, cast, adopt, stream, post-load, tensor records;
  report    reference.report.*: the load report and process memory;
  load      reference.load.*: the spine that runs the steps in order;
  facade    reference (its __init__): the public names;
  kit       reference.kit.*: the suite's machinery (seam, plugin, adapters, isolated attempts);
  fakes     fakes.* (top level, beside reference/): the doubles the tests load, broken loaders
            among them (each the reference's adapter with one defect);
  judging   reference.kit.judging.*: the helpers that judge a loader by driving it over the
            fakes and reading the evidence it leaves;
  programs  reference.__main__, reference.programs.*: the library, the kit and the fakes (the
            demo's and the bench's models);
  tests     tests.*: anything.
So the steps a load runs in order (request -> read -> place -> report) each import only the
steps before them, only the spine and the programs see them all, and the loader never imports
the fakes. Every import counts, at
module level or inside a function, because a lazy import is still a dependency. Shipped code
never names the repository's `tests` (the wheel installs it only as reference.kit.suite).
Exits 1 naming each offending import and each cycle; 0 prints a summary.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = (
    "base",
    "request",
    "read",
    "place",
    "report",
    "load",
    "facade",
    "kit",
    "fakes",
    "judging",
    "programs",
    "tests",
)
BASE = ("reference.errors", "reference.extras", "reference.files", "reference.rules")
STEPS = ("request", "read", "place", "report", "load", "programs")


def module_files() -> Iterator[tuple[str, Path]]:
    """Every module of the project, named as it is imported (a file's place is its name)."""
    trees = {"reference": ROOT / "reference", "fakes": ROOT / "fakes", "tests": ROOT / "tests"}
    for top, folder in trees.items():
        for path in sorted(folder.rglob("*.py")):
            yield dotted(top, path.relative_to(folder)), path


def dotted(top: str, relative: Path) -> str:
    parts = [top, *relative.with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str:
    if module == "tests" or module.startswith("tests."):
        return "tests"
    if module == "fakes" or module.startswith("fakes."):
        return "fakes"
    if module == "reference.kit.judging" or module.startswith("reference.kit.judging."):
        return "judging"
    if module == "reference":
        return "facade"
    if module == "reference.__main__":
        return "programs"
    if module in BASE:
        return "base"
    second = module.split(".")[1]
    if second in STEPS or second == "kit":
        return second
    raise SystemExit(f"{module}: no layer; place it in a step folder or name it in BASE")


def allowed(importer: str) -> tuple[str, ...]:
    """The layers a module of layer `importer` may import: its own and those below."""
    return LAYERS[: LAYERS.index(importer) + 1]


def imports(module: str, path: Path, known: set[str]) -> Iterator[tuple[int, str]]:
    """(line, module) for each project module that `module` imports."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                # `from reference import platform` imports the module reference.request.platform.
                full = f"{base}.{alias.name}"
                yield node.lineno, full if full in known else base


def project(name: str, known: set[str]) -> str | None:
    """The project module `name` resolves to, or None for a third-party import."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def main() -> int:
    files = dict(module_files())
    known = set(files)
    graph: dict[str, set[str]] = {name: set() for name in files}
    problems: list[str] = []
    for name, path in files.items():
        where = path.relative_to(ROOT)
        for line, imported in imports(name, path, known):
            if imported.split(".")[0] == "tests" and layer(name) != "tests":
                problems.append(f"{where}:{line}: {name} imports {imported}; use reference.kit")
                continue
            target = project(imported, known)
            if target is None or target == name:
                continue
            # A package's own __init__ is imported before any of its modules: not an edge.
            if name.startswith(target + "."):
                continue
            graph[name].add(target)
            if layer(target) not in allowed(layer(name)):
                problems.append(
                    f"{where}:{line}: {name} ({layer(name)}) imports {target} ({layer(target)});"
                    f" the {layer(name)} layer imports only {', '.join(allowed(layer(name)))}"
                )
    for component in cycles(graph):
        problems.append(f"import cycle: {' <-> '.join(component)}")
    for problem in problems:
        print(problem)
    if problems:
        return 1
    edges = sum(len(targets) for targets in graph.values())
    print(f"import graph: {len(graph)} modules, {edges} imports, one way, no cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
