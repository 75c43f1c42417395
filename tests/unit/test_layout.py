"""The layout tells the story: harness/'s import graph is a DAG (modules and packages), and no two
classes share a name."""

from __future__ import annotations

import ast
import re
import subprocess
from collections import defaultdict
from pathlib import Path

import harness

ROOT = Path(harness.__file__).parent


def _modules() -> dict[str, ast.Module]:
    modules = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = ast.parse(path.read_text(encoding="utf-8"))
    return modules


def _imports(modules: dict[str, ast.Module]) -> dict[str, set[str]]:
    """module -> the harness modules it imports (``from pkg import mod`` names the module ``pkg.mod``)."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, tree in modules.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in modules:
                for alias in node.names:
                    graph[name].add(
                        f"{node.module}.{alias.name}"
                        if f"{node.module}.{alias.name}" in modules
                        else node.module
                    )
            elif isinstance(node, ast.Import):
                graph[name].update(alias.name for alias in node.names if alias.name in modules)
        graph[name].discard(name)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_module_import_graph_is_acyclic():
    assert _cycle(_imports(_modules())) is None


def test_package_import_graph_is_acyclic():
    packages: dict[str, set[str]] = defaultdict(set)
    for module, targets in _imports(_modules()).items():
        packages[_package(module)] |= {
            _package(t) for t in targets if _package(t) != _package(module)
        }
    assert _cycle(packages) is None


def test_no_two_classes_share_a_name():
    seen: dict[str, str] = {}
    for module, tree in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                assert node.name not in seen, f"class {node.name} in {module} and {seen[node.name]}"
                seen[node.name] = module


def test_no_command_imports_another_command():
    # Commands parse, call the domain and print; what two commands share lives in the domain (or,
    # for argparse options, in harness.commands.options, which is no command).
    graph = _imports(_modules())
    commands = {name for name in graph if name.startswith("harness.commands.")}
    shared = {"harness.commands.options"}
    crossing = {
        (name, target)
        for name in commands - shared
        for target in graph[name]
        if target in commands - shared
    }
    assert crossing == set()


def test_a_metric_is_named_by_its_registry_member_not_by_a_string():
    # One home per metric: its name is a string only in the registry (MetricName) and the typed
    # record; everywhere else code says MetricName.X, so mypy catches a misspelt metric.
    from harness.record.metrics import MetricName

    homes = {"harness.record.metrics", "harness.record.model"}
    spelled = sorted(
        (module, node.lineno, node.value)
        for module, tree in _modules().items()
        if module not in homes
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in set(MetricName)
    )
    assert spelled == []


def test_no_path_of_a_particular_machine_is_written_into_the_project():
    # Paths come from arguments, documented environment variables, a cache under the user's home or
    # tempfile: a home, work or temp directory of the machines this project was developed on means
    # nothing elsewhere (a default that pointed at one made tests skip without saying why).
    machine_roots = re.compile(r"""["'=\s(](/(?:work|home|root|Users|tmp|farm)/)""")
    project = ROOT.parent
    files = subprocess.run(
        ["git", "ls-files", "harness", "tests", "ci", "benchmarks", ".ci", ".github"],
        cwd=project,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    found = [
        f"{name}:{number}: {match[1]}"
        for name in files
        # goldens and measured records keep the paths of the machine that wrote them, as data
        if not name.startswith(("tests/golden/", "tests/measured/")) and (project / name).is_file()
        for number, line in enumerate(
            (project / name).read_text(encoding="utf-8", errors="replace").splitlines(), 1
        )
        for match in [machine_roots.search(line)]
        if match
    ]
    assert found == []
