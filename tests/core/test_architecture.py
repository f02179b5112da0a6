"""The layout holds: the core (everything in flowrl/ outside flowrl/worlds/) imports no world, a world imports the
core and at most the shapes world its scenes are drawn from, and no module of flowrl/ is part of an import cycle,
imports inside functions included. Worlds and plug-ins are reached by name through the registries."""

import ast
from pathlib import Path

import pytest
from conftest import REPO

PACKAGE = REPO / "flowrl"
WORLDS = PACKAGE / "worlds"
BASE_WORLD = "shapes"  # the renderer, prompt grammar and verifier the other embedded worlds build their scenes on


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> list[str]:
    """Absolute names of every module a file imports, anywhere in it (function-level imports too)."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            names += [base] + [f"{base}.{alias.name}" for alias in node.names]
    return names


def library_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the flowrl modules it imports (`from package import name` counts as the submodule when `name` is
    one, else as the package)."""
    graph = {}
    for name, path in modules.items():
        edges = set()
        for imported in imported_modules(path):
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                edges.add(imported)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
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


def world_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if parts[:2] == ["flowrl", "worlds"] and len(parts) > 2 else None


def test_no_import_cycle_in_flowrl():
    assert not cycles(import_graph(library_modules()))


def test_the_cycle_check_finds_a_cycle_through_a_function_level_import():
    graph = import_graph(library_modules())
    graph["flowrl.errors"].add("flowrl.config")  # config imports errors; this closes a loop
    assert any({"flowrl.errors", "flowrl.config"} <= set(c) for c in cycles(graph))
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_worlds_are_packages_and_the_core_holds_none():
    worlds = sorted(p.name for p in WORLDS.iterdir() if (p / "__init__.py").is_file())
    assert worlds == ["moving_shapes", "safety", "shapes", "shapes3d", "shapes_edit", "tactile"]
    core = [m for m in library_modules() if world_of(m) is None and not m.startswith("flowrl.worlds")]
    assert len(core) > 60


@pytest.mark.parametrize("module", sorted(library_modules()), ids=str)
def test_the_core_imports_no_world_and_worlds_only_the_base_world(module):
    path = library_modules()[module]
    own = world_of(module)
    worlds = {world_of(name) for name in imported_modules(path)} - {None, own}
    allowed = {BASE_WORLD} if own is not None else set()
    assert not worlds - allowed, f"{path.relative_to(REPO)} imports the world(s) {sorted(worlds - allowed)}"


def test_the_walk_sees_relative_and_nested_imports(tmp_path):
    """The checker itself: a relative import inside a function is found and resolved."""
    module = PACKAGE / "_probe_for_test.py"
    module.write_text("def f():\n    from .worlds.shapes import verifier\n    from .tasks.base import Task\n")
    try:
        names = imported_modules(module)
    finally:
        module.unlink()
    assert "flowrl.worlds.shapes.verifier" in names and "flowrl.tasks.base" in names


def test_no_unsafe_loading_anywhere_in_flowrl():
    """No pickle: every torch.load passes weights_only=True, nothing imports pickle, trust_remote_code is never
    switched on, and servers bind 127.0.0.1 unless told otherwise."""
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')}"
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", None) == "load"
                and getattr(node.func.value, "id", None) == "torch"
            ):
                if not any(k.arg == "weights_only" and getattr(k.value, "value", None) is True for k in node.keywords):
                    problems.append(f"{where}: torch.load without weights_only=True")
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                if any(n.split(".")[0] in ("pickle", "dill", "cloudpickle") for n in names):
                    problems.append(f"{where}: imports pickle")
            if (
                isinstance(node, ast.keyword)
                and node.arg == "trust_remote_code"
                and getattr(node.value, "value", None) is True
            ):
                problems.append(f"{where}: trust_remote_code=True")
    assert not problems, problems
    from flowrl.cli import _parser, task_commands

    assert _parser(task_commands()).parse_args(["demo", "--pipeline", "p"]).host == "127.0.0.1"
