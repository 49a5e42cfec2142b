"""The import graph of the ``verl`` package: no circles, and nothing imported from the checkout's other
folders (``benchmarks/``, ``tests/``, ``scripts/``), which an installed ``verl`` does not have.

The graph is built by parsing (nothing is imported):

* One node per module: ``verl/a/b.py`` is ``verl.a.b``, ``verl/a/__init__.py`` is ``verl.a``; and for a
  package a second node, ``verl.a.__init__``, for what importing *anything* in it runs (see below).
* Every ``import`` / ``from ... import`` counts wherever it is written: at module level, in a function or
  method, under ``try``, under ``if TYPE_CHECKING:``. A function-level import runs when the function is
  first called, often while a module of the circle is still half-initialised, so moving an import into a
  function does not take it out of the graph; a ``TYPE_CHECKING`` import is a dependency of the module's
  annotations (a type checker, ``typing.get_type_hints``). ``importlib.import_module("verl.x")`` and
  ``__import__("verl.x")`` with a literal name count too.
* Relative imports are resolved against the importing module's package; ``from verl.a import b`` is an
  edge to the module ``verl.a.b`` when that exists, else to ``verl.a`` (``b`` is a name defined there).
* Not counted: imports under ``if __name__ == "__main__":`` (that code runs as the program ``__main__``,
  never when the module is imported), and imports whose name is computed at run time.

Packages, and what makes a real circle. Importing ``verl.a.b`` first runs ``verl/a/__init__.py``, so the
import is also an edge to ``verl.a.__init__``, whose edges are the imports that file's body runs (not
those in its functions, which run only when called through an explicit ``from verl.a import f``: an edge
to ``verl.a``, the whole file). Two exceptions keep the usual false circles out:

* No such edge to a package that encloses the importing module itself: Python initialises ``verl.a``
  before ``verl.a.c``, so by the time ``verl.a.c`` imports its sibling ``verl.a.b`` the package is in
  ``sys.modules`` and nothing runs again. Without this, every ``__init__`` that re-exports its submodules
  (``verl/a/__init__.py`` imports ``verl.a.c``, which imports ``verl.a.b``) would show the false circle
  ``verl.a.__init__ -> verl.a.c -> verl.a.__init__``. An *explicit* ``from verl.a import X`` in
  ``verl.a.c`` (``X`` not a submodule) stays an edge: it needs the ``__init__`` to have defined ``X`` by
  then, which depends on the order of that file's lines, a real circle.
* A module-level ``__getattr__`` (the lazy re-exports of ``verl/__init__.py``: ``{name: "verl.x"}`` or an
  import inside it) imports on first access of a name, so its imports are edges of whoever accesses the
  name: ``from verl import Controller`` is an edge to ``verl.single_controller.flow``; a plain
  ``import verl``, or a name the module does not bind itself, is an edge to every module its
  ``__getattr__`` may import.

A package entered from outside is real: ``verl.tools.config`` importing ``verl.config.errors`` once ran
``verl/config/__init__.py``, which imported the validation, which imports ``verl.tools.config``: a fresh
``from verl.tools.base import BaseTool`` failed on that circle (``verl.config`` re-exports lazily since).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from collections import deque
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "verl"

# ------------------------------------------------------------------------------------------ parsing


def _is_main_guard(test: ast.expr) -> bool:
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)
    )


def _literal_import(node: ast.Call) -> ast.Import | None:
    """``importlib.import_module("verl.x")`` / ``__import__("verl.x")`` as the import statement it is."""
    func = node.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    if (
        name in ("import_module", "__import__")
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
        and not node.args[0].value.startswith(".")
    ):
        return ast.Import(names=[ast.alias(name=node.args[0].value)], lineno=node.lineno)
    return None


def _imports(nodes: list[ast.AST], *, into_functions: bool = True):
    """Every import under ``nodes`` (statements, and literal ``import_module`` / ``__import__`` calls),
    except under ``if __name__ == "__main__":``; inside function bodies too unless ``into_functions`` is
    false (their decorators and defaults run with the module, and count either way)."""
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_main_guard(node.test):
            stack.extend(node.orelse)
            continue
        if not into_functions and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            stack.extend(getattr(node, "decorator_list", []))
            stack.extend(d for d in [*node.args.defaults, *node.args.kw_defaults] if d is not None)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.Call) and (literal := _literal_import(node)) is not None:
            yield literal
        stack.extend(ast.iter_child_nodes(node))


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, modules: set[str]):
    """``(dotted name, attribute or None)`` for each name ``node`` (written in ``module``) imports:
    ``from P import m`` is ``(P.m, None)`` when ``P.m`` is a module, else ``(P, "m")``."""
    if isinstance(node, ast.Import):
        return [(alias.name, None) for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module if is_package else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    return [
        (f"{base}.{alias.name}", None) if f"{base}.{alias.name}" in modules else (base, alias.name)
        for alias in node.names
    ]


class _Module:
    """One parsed module: ``imports`` (all of them), ``body_imports`` (those its import runs: not in a
    function), ``lazy`` (name -> module its module-level ``__getattr__`` imports for that name) and
    ``defined`` (the names its body binds)."""

    def __init__(self, name: str, path: Path, modules: set[str]) -> None:
        self.name, self.path = name, path
        self.is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        lazy_defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "__getattr__"]
        own = [n for n in tree.body if n not in lazy_defs]

        def resolve(nodes):
            return [(node, _targets(name, self.is_package, node, modules)) for node in nodes]

        self.lazy: dict[str, str] = {}
        self.imports = resolve(_imports(own))
        self.body_imports = resolve(_imports(own, into_functions=False))
        self.has_getattr = bool(lazy_defs)
        self.defined = {a.asname or a.name.split(".")[0] for n, _ in self.body_imports for a in n.names}
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defined.add(node.name)
            for target in node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]:
                if isinstance(target, ast.Name):
                    self.defined.add(target.id)
        for node, targets in resolve(_imports(lazy_defs)):
            if isinstance(node, ast.ImportFrom):
                for alias, (target, _) in zip(node.names, targets, strict=True):
                    self.lazy[alias.asname or alias.name] = target
        for node in tree.body if lazy_defs else ():
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
                for key, value in zip(node.value.keys, node.value.values, strict=True):
                    if (
                        isinstance(key, ast.Constant)
                        and isinstance(value, ast.Constant)
                        and value.value in modules
                    ):
                        self.lazy[key.value] = value.value


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def init_node(package: str) -> str:
    """The node of what importing anything in ``package`` runs: its ``__init__.py`` but its functions."""
    return f"{package}.__init__"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _local_names(root: Path) -> set[str]:
    """Top-level names importable from the checkout's root other than ``verl``: its folders holding Python
    files (``benchmarks``, ``tests``, ``scripts``) and its ``.py`` files."""
    return {
        entry.stem if entry.suffix == ".py" else entry.name
        for entry in root.iterdir()
        if entry.name != PACKAGE
        and not entry.name.startswith(".")
        and (entry.suffix == ".py" or (entry.is_dir() and any(entry.rglob("*.py"))))
    }


def import_graph(root: Path = ROOT):
    """``(edges, where, outside)``: the graph of ``root/verl`` restricted to ``verl.*`` (module -> modules);
    for each edge the first ``file:line`` that makes it; for each module its imports of top-level names
    that are folders or files of ``root`` other than ``verl`` (``benchmarks``, ``tests``, ...)."""
    paths = {_module_name(p, root): p for p in sorted((root / PACKAGE).rglob("*.py"))}
    parsed = {name: _Module(name, path, set(paths)) for name, path in paths.items()}
    local = _local_names(root)
    edges: dict[str, set[str]] = {name: set() for name in paths}
    edges.update({init_node(name): set() for name, info in parsed.items() if info.is_package})
    where: dict[tuple[str, str], str] = {}
    outside: dict[str, list[str]] = {}

    def add(source: str, enclosing: set[str], imports, path: Path) -> None:
        for node, targets in imports:
            location = f"{path.relative_to(root)}:{node.lineno}"
            for target, attr in targets:
                top = target.split(".")[0]
                if top in local:
                    outside.setdefault(source, []).append(f"{location} imports {target}")
                if top != PACKAGE:
                    continue
                reached = target
                while reached not in paths and "." in reached:  # `import verl.a.B`-like: the module part
                    reached = reached.rpartition(".")[0]
                dests = [init_node(p) for p in _ancestors(reached) if p not in enclosing]
                dests.append(reached)
                info = parsed[reached]
                if attr is not None and attr in info.lazy:  # `from P import name`: P's __getattr__ imports it
                    dests.append(info.lazy[attr])
                elif attr is None or (info.has_getattr and attr not in info.defined):
                    # the module as a whole, or a name only its __getattr__ knows: any lazy name may be used
                    dests.extend(info.lazy.values())
                for dest in dests:
                    if dest not in (source, init_node(source)) and dest in edges:
                        edges[source].add(dest)
                        where.setdefault((source, dest), location)

    for module, info in parsed.items():
        enclosing = {module, *_ancestors(module)}
        add(module, enclosing, info.imports, info.path)
        if info.is_package:
            add(init_node(module), enclosing, info.body_imports, info.path)
    return edges, where, outside


# ------------------------------------------------------------------------------------------- cycles


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one node (iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)

    for root in sorted(edges):
        if root in index:
            continue
        visit(root)
        work = [(root, iter(sorted(edges[root])))]
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    visit(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while not component or component[-1] != node:
                        component.append(stack.pop())
                        on_stack.discard(component[-1])
                    if len(component) > 1:
                        components.append(sorted(component))
    return sorted(components)


def _shortest_cycle(start: str, members: set[str], edges: dict[str, set[str]]) -> list[str]:
    """The shortest cycle through ``start`` inside its component, as ``[start, ..., start]``."""
    previous: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(edges[node] & members):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return [*reversed(path), start]
            if child not in previous:
                previous[child] = node
                queue.append(child)
    raise AssertionError(f"{start} is on no cycle")


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """For each strongly connected component, the shortest cycle through each of its modules (each cycle
    once): together they name every module of every circle."""
    found: list[list[str]] = []
    for component in strongly_connected(edges):
        for start in component:
            body = _shortest_cycle(start, set(component), edges)[:-1]
            turn = body.index(min(body))
            cycle = [*body[turn:], *body[:turn], body[turn]]
            if cycle not in found:
                found.append(cycle)
    return found


def describe(cycle: list[str], where: dict[tuple[str, str], str]) -> str:
    """``a -> b -> a``, then each edge with the line that makes it."""
    steps = "".join(f"\n      {a} -> {b}  ({where[(a, b)]})" for a, b in pairwise(cycle))
    return f"  {' -> '.join(cycle)}{steps}"


# -------------------------------------------------------------------------------------------- tests


def test_the_import_graph_has_no_circles():
    edges, where, _ = import_graph()
    assert len(edges) > 100  # the walk found the package
    found = cycles(edges)
    assert not found, f"{len(found)} import circle(s) in verl/:\n" + "\n".join(
        describe(cycle, where) for cycle in found
    )


def test_the_library_imports_nothing_from_the_checkouts_other_folders():
    _, _, outside = import_graph()
    lines = [line for module in sorted(outside) for line in outside[module]]
    assert not lines, "verl/ imports what an installed verl does not have:\n" + "\n".join(
        f"  {line}" for line in lines
    )


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def test_the_checker_tells_real_circles_from_false_ones(tmp_path):
    root = _write(
        tmp_path,
        {
            "verl/__init__.py": "",
            # a package re-exporting its submodules, which import each other: no circle
            "verl/a/__init__.py": "from verl.a.c import C\n",
            "verl/a/b.py": "B = 1\n",
            "verl/a/c.py": "from verl.a.b import B\nC = B\n",
            # entering a package whose __init__ comes back: a circle, also from inside a function
            "verl/p/__init__.py": "from verl.p.heavy import H\n",
            "verl/p/errors.py": "class E(Exception): ...\n",
            "verl/p/heavy.py": "def check():\n    from verl.q.light import L\n",
            "verl/q/__init__.py": "",
            "verl/q/light.py": "from verl.p.errors import E\nL = E\n",
            # lazy re-exports: the importer depends on the module, the package does not
            "verl/lazy/__init__.py": "_EXPORTS = {'X': 'verl.lazy.x'}\ndef __getattr__(name): ...\n",
            "verl/lazy/x.py": "from verl.uses import U\nX = U\n",
            "verl/uses.py": "U = 1\ndef later():\n    from verl.lazy import X\n",
            "verl/shim.py": "def __getattr__(name):\n    from verl import real\n    return getattr(real, name)\n",
            "verl/real.py": "R = 1\n",
            "verl/client.py": "from verl.shim import R\n",
            # TYPE_CHECKING counts; a __main__ block does not; benchmarks/ is outside
            "verl/t1.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from verl.t2 import T2\n",
            "verl/t2.py": "from verl.t1 import TYPE_CHECKING\nif __name__ == '__main__':\n    import verl.m\n",
            "verl/m.py": "import verl.t2\nimport benchmarks.tool\n",
            "benchmarks/tool.py": "",
        },
    )
    edges, where, outside = import_graph(root)
    found = cycles(edges)
    assert found == [
        ["verl.lazy.x", "verl.uses", "verl.lazy.x"],
        ["verl.p.__init__", "verl.p.heavy", "verl.q.light", "verl.p.__init__"],
        ["verl.t1", "verl.t2", "verl.t1"],
    ], found
    assert "verl.a.__init__" not in edges["verl.a.c"] and "verl.m" not in edges["verl.t2"]
    assert edges["verl.client"] == {"verl.shim", "verl.real"} and edges["verl.shim"] == set()
    assert describe(found[1], where).startswith("  verl.p.__init__ -> verl.p.heavy -> verl.q.light -> ")
    assert "verl/q/light.py:1" in describe(found[1], where)
    assert outside == {"verl.m": ["verl/m.py:2 imports benchmarks.tool"]}


def test_a_custom_tools_documented_first_line_imports_in_a_fresh_interpreter():
    """docs/agent_loop.md: a tool starts with this import; it once failed on the verl.config circle."""
    result = subprocess.run(
        [sys.executable, "-c", "from verl.tools.base import BaseTool"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
