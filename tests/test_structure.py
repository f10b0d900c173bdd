"""The shape of the package, kept by tests: the runtime's import graph has no cycle and no
module looks another of ours up in sys.modules; one after-fork hook; the supported versions
stated once in the integration table and equal in pyproject's extras and the README;
`import autoteardown` imports none of the libraries it patches, nor what is costly, and five
modules of its own."""

import ast
import re
import subprocess
import sys

import pytest

from helpers import ROOT, base_env

from autoteardown.integrations import TABLE, supported_range

PACKAGE = ROOT / "autoteardown"
RUNTIME = [p for p in sorted(PACKAGE.rglob("*.py")) if "cli" not in p.relative_to(PACKAGE).parts]


def module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path):
    """The modules of ours that `path` imports, anywhere in it (a function's import too)."""
    name, found, names = module_name(path), set(), {module_name(p) for p in RUNTIME}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            base = f"{base}.{node.module}" if node.level and node.module else base if node.level else node.module
            for alias in node.names:  # a submodule of `base`, or a name in it
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in names else base)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    # A module's own packages are not imports of it back: Python runs them first anyway.
    return {m for m in found if m in names and not f"{name}.".startswith(f"{m}.")}


def test_the_runtime_import_graph_has_no_cycle():
    graph = {module_name(p): imports_of(p) for p in RUNTIME}
    done, cycles = set(), []

    def visit(node, path):
        for nxt in sorted(graph[node]):
            if nxt in path:
                cycles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in done:
                visit(nxt, path + [nxt])
        done.add(node)

    for start in sorted(graph):
        if start not in done:
            visit(start, [start])
    assert cycles == []


def test_no_module_of_ours_is_looked_up_in_sys_modules():
    pattern = re.compile(r"""sys\.modules(\.get)?\(?\[?["']autoteardown""")
    found = [f"{p.relative_to(ROOT)}:{n}" for p in RUNTIME for n, line in enumerate(p.read_text().splitlines(), 1)
             if pattern.search(line)]
    assert found == []


def test_one_after_fork_hook():
    calls = [p for p in PACKAGE.rglob("*.py") for _ in re.finditer(r"register_at_fork\(", p.read_text())]
    assert [p.name for p in calls] == ["forksafe.py"]


def readme_versions():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Supported versions", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| *(\w+) *\| *([^|]+?) *\|$", section, re.M)
    return {name: requires for name, requires in rows if name != "integration"}


def test_the_supported_versions_are_the_same_in_the_table_pyproject_and_the_readme():
    assert readme_versions() == {name: supported_range(name) for name in TABLE}
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    stated = {}
    for requirement in (r for name in TABLE for r in TABLE[name].requires):
        stated[requirement.distribution] = str(requirement).split(" ", 1)[1]
    in_extras = set()
    for requirements in extras.values():
        for line in requirements:
            match = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^]]*\])?\s*([<>=!~].*)?", line)
            if match and match.group(1) in stated:
                assert (match.group(3) or "").replace(" ", "") == stated[match.group(1)], line
                in_extras.add(match.group(1))
    # Every integration can be installed through an extra (distributed with torch's).
    assert [n for n in TABLE if not in_extras & {r.distribution for r in TABLE[n].requires}] == []


def test_import_autoteardown_imports_none_of_the_libraries_nor_what_is_costly():
    code = ("import sys; import autoteardown; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'wandb', 'ray', 'mlflow', 'wrapt', 'signal', 'logging', 'typing', 'tensorboard', 'swanlab',"
            " 'trackio', 'threading', 'queue')))")
    result = subprocess.run([sys.executable, "-S", "-c", code], env=base_env(False, PYTHONPATH=ROOT),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result


def test_import_autoteardown_loads_five_of_its_own_modules():
    # Each module costs about 0.1 ms of every Python process's start: the rest load when used.
    code = "import sys; import autoteardown; print(sorted(m for m in sys.modules if m.startswith('autoteardown')))"
    result = subprocess.run([sys.executable, "-S", "-c", code], env=base_env(False, PYTHONPATH=ROOT),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result
    assert ast.literal_eval(result.stdout) == ["autoteardown", "autoteardown.config", "autoteardown.forksafe",
                                               "autoteardown.importhook", "autoteardown.integrations"]


# CPython's private internals (cpython.py says which, and on which versions they were checked).
CPYTHON_INTERNALS = re.compile(r"ctypes|threading\._shutdown|import _signal\b|[.'\"](_getframe|_current_frames|_threading_atexits|"
                               r"_register_atexit|_SHUTTING_DOWN|_exit_function|_bootstrap|_children|_parent_pid|"
                               r"_initializing)\b")


def test_cpythons_internals_are_used_in_one_module():
    found = [f"{p.relative_to(ROOT)}:{n}" for p in PACKAGE.rglob("*.py") if p.name != "cpython.py"
             for n, line in enumerate(p.read_text().splitlines(), 1) if CPYTHON_INTERNALS.search(line)]
    assert found == []


def test_a_modules_state_is_its_one_state_object():
    # A module's mutable state lives in one object, `_state`: the one name a `global` statement
    # rebinds (a fork child's new state).
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in PACKAGE.rglob("*.py")
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if re.match(r"\s*global ", line) and line.strip() != "global _state"]
    assert found == []


def test_no_module_sets_another_modules_attribute():
    # A module's state is its own: another module hands it a callback through a function it
    # defines (threads.start_helper(on_wakeup=...), integrations.declare_kinds_to), never by assignment.
    found = []
    for path in RUNTIME:
        tree = ast.parse(path.read_text())
        ours = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level
                for alias in node.names}
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AugAssign, ast.AnnAssign)) else []
            found += [f"{path.relative_to(ROOT)}:{node.lineno}" for t in targets if isinstance(t, ast.Attribute)
                      and isinstance(t.value, ast.Name) and t.value.id in ours]
    assert found == []


def test_the_two_settings_of_every_budget_are_read_in_deadlines_only():
    # Every budget of an ending has one definition, derived from T and G where its rule is written.
    found = [f"{p.relative_to(ROOT)}:{n}" for p in PACKAGE.rglob("*.py") if p.name not in ("deadlines.py", "config.py")
             for n, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"\.(TIMEOUT|RAY_GRACE)\b", line)]
    assert found == []


def _ends_a_process(node, method):
    """What `node` does that ends a process, outside a process handle's own kill() or terminate()."""
    if method in ("kill", "terminate"):
        return None
    if "SIGKILL" in (getattr(node, "id", None), getattr(node, "attr", None)):
        return "SIGKILL"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("kill", "terminate") \
            and not (isinstance(node.func.value, ast.Name) and node.func.value.id in ("processes", "os")):
        return f".{node.func.attr}()"  # os.kill's signal is checked by its name
    return None


def test_one_rule_ends_processes():
    # processes.terminate is the one way to end processes (SIGTERM, the grace, SIGKILL, never a
    # reused pid): SIGKILL is named, and a process's kill() or terminate() called, only there, in
    # cpython.py, and in a process handle's own kill() or terminate(), the ones `terminate` calls.
    found = []
    for path in RUNTIME:
        if path.name in ("processes.py", "cpython.py"):
            continue
        todo = [(ast.parse(path.read_text()), None)]
        while todo:
            node, method = todo.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                method = node.name
            what = _ends_a_process(node, method)
            if what:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {what}")
            todo += [(child, method) for child in ast.iter_child_nodes(node)]
    assert found == []
