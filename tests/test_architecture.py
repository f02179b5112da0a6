"""The core stays generic: no generic module imports a task, the shapes world or the safety package (statically,
at any depth of the file); tasks and plug-ins are reached by name through the registries."""

import ast
from pathlib import Path

import pytest
from conftest import REPO

PACKAGE = REPO / "flowrl"
GENERIC = [
    "algorithms",
    "policies",  # every module of these packages
    "train.py",
    "rollout.py",
    "config.py",
    "prompt_source.py",
    "experiment.py",
    "report.py",
    "sampling.py",
    "generate.py",
    "checkpoint.py",
    "fk.py",
    "samples.py",
    "registry.py",
    "schedules.py",
    "data_loss.py",
    "images.py",
    "errors.py",
    "demo.py",
    "cli.py",
    "rewards/__init__.py",
    "rewards/base.py",
    "rewards/augment.py",
    "tasks/__init__.py",
    "tasks/base.py",
    "eval/metrics.py",
    "sdf.py",
    "async_rollouts.py",
]
TASK_MODULES = (
    "flowrl.shapes",
    "flowrl.safety",
    "flowrl.tasks.shapes",
    "flowrl.tasks.safety",
    "flowrl.tasks.shapes_cli",
    "flowrl.eval.shapes",
    "flowrl.eval.safety",
    "flowrl.eval.protocol",
    "flowrl.eval.diversity",
    "flowrl.rewards.shapes",
    "flowrl.models",
    "flowrl.pretrain",
    "flowrl.shapes3d",
    "flowrl.tasks.shapes3d",
    "flowrl.motion",
    "flowrl.tasks.moving_shapes",
    "flowrl.editing",
    "flowrl.tasks.shapes_edit",
)


def generic_files() -> list[Path]:
    files = []
    for entry in GENERIC:
        path = PACKAGE / entry
        files += sorted(path.glob("*.py")) if path.is_dir() else [path]
    return files


def imported_modules(path: Path) -> list[str]:
    """Absolute names of every module a file imports, anywhere in it (function-level imports too)."""
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
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


def test_the_generic_list_names_real_files():
    assert all(path.is_file() for path in generic_files()) and len(generic_files()) > 30


@pytest.mark.parametrize("path", generic_files(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_generic_modules_import_no_task(path):
    bad = sorted(
        {name for name in imported_modules(path) if any(name == t or name.startswith(t + ".") for t in TASK_MODULES)}
    )
    assert not bad, f"{path.relative_to(REPO)} imports task code: {bad}"


def test_the_walk_sees_relative_and_nested_imports(tmp_path):
    """The checker itself: a relative import inside a function is found and resolved."""
    module = PACKAGE / "_probe_for_test.py"
    module.write_text("def f():\n    from .shapes import verifier\n    from .tasks.base import Task\n")
    try:
        names = imported_modules(module)
    finally:
        module.unlink()
    assert "flowrl.shapes.verifier" in names and "flowrl.tasks.base" in names


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
