"""The package's layout: layers that only point down, no import cycles, readable modules,
pure modules free of TensorFlow."""

import ast
import json
import pathlib
import subprocess
import sys
import tomllib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "hybridpar"
MAX_LINES = 400
MAX_FUNCTION_LINES = 60
# The command line is exempt from MAX_FUNCTION_LINES: its parser builders are flat lists of
# flags, longer than a function should be but no harder to read.
CLI = ("hybridpar.cli.", "hybridpar.launch.args._launch_parser")
# The layers of hybridpar, lowest first: the one statement of the order. A module imports
# its own package and packages of lower layers only; packages that share a layer import
# neither each other. "" is hybridpar/__init__.py, the public names.
LAYERS = (
    ("errors", "exit_codes", "logs"),  # plain Python every layer may raise or log with
    ("config",),  # StrategyConfig
    ("topology",),  # pure: cluster, mesh, placement, plan
    ("state",),  # StrategyState, how everything above recognises hybridpar's strategies
    ("data",),  # what a dataset is; sharding, balanced pieces
    ("parallel",),  # hybridpar's collectives, stages, pipeline, compression
    ("report",),  # the placement report
    ("compat",),  # the hooks into Keras/TF internals
    ("training",),  # the Trainer those hooks hand Keras's trainer methods to
    ("checkpoint",),  # format, callback, preemption
    ("strategies",),  # the tf.distribute subclasses and their overrides, runners
    ("callbacks",),  # the public callbacks
    ("hybrid",),  # scope(), HybridStrategy
    ("pipeline", "ray_train", "testing"),  # public modules of their own
    ("train", "launch", "startup"),  # the training job, the launcher, initialize()
    ("cli",),
    ("",),
)
PURE_MODULES = [
    "hybridpar.config",
    "hybridpar.exit_codes",
    "hybridpar.state",
    "hybridpar.topology.cluster",
    "hybridpar.topology.mesh",
    "hybridpar.topology.partition",
    "hybridpar.topology.placement",
    "hybridpar.topology.plan",
    "hybridpar.topology.ps_cluster",
    "hybridpar.topology.tensor_layout",
    "hybridpar.parallel.schedule",
    "hybridpar.parallel.compression_plan",
    "hybridpar.parallel.zero_plan",
    "hybridpar.checkpoint.end_record",
    "hybridpar.checkpoint.files",
    "hybridpar.checkpoint.flat_slices",
    "hybridpar.checkpoint.manifest",
    "hybridpar.checkpoint.npz",
    "hybridpar.checkpoint.policy",
    "hybridpar.checkpoint.position",
    "hybridpar.checkpoint.publication",
    "hybridpar.checkpoint.read_shares",
    "hybridpar.checkpoint.watch",
    "hybridpar.launch",
    "hybridpar.startup",
]


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def imported_modules(path: pathlib.Path, type_checking: bool = False) -> set[str]:
    """hybridpar modules ``path`` imports, at module level or inside functions.

    Imports under ``if TYPE_CHECKING:`` never run and are left out unless
    ``type_checking``: a layer still should not name what sits above it.
    """
    found: set[str] = set()
    package = module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_checking:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1],
                                 *([base] if base else [])])
            submodules = {f"{base}.{alias.name}" for alias in node.names} & set(MODULES)
            found.update(submodules or {base})
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {name for name in found if name in MODULES}


def layer_of(name: str) -> int:
    """The index in ``LAYERS`` of module ``name``'s package."""
    package = name.split(".")[1] if "." in name else ""
    for index, packages in enumerate(LAYERS):
        if package in packages:
            return index
    raise AssertionError(f"{name}: package {package!r} is in no layer of LAYERS")


def test_every_package_has_a_layer():
    for name in MODULES:
        layer_of(name)


def test_imports_only_point_down():
    upward = []
    for name, path in MODULES.items():
        package = name.split(".")[1] if "." in name else ""
        for target in sorted(imported_modules(path, type_checking=True)):
            same = (target.split(".")[1] if "." in target else "") == package
            if not same and layer_of(target) >= layer_of(name):
                upward.append(f"{name} -> {target}")
    assert not upward, "imports of a layer above (or a sibling): " + ", ".join(upward)


def test_no_import_cycles():
    graph = {name: imported_modules(path) - {name} for name, path in MODULES.items()}
    state: dict[str, str] = {}
    stack: list[str] = []

    def walk(name: str) -> None:
        state[name] = "open"
        stack.append(name)
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                cycle = [*stack[stack.index(target):], target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                walk(target)
        stack.pop()
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            walk(name)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_stay_readable(name):
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines; split it by concern"


def functions(path: pathlib.Path) -> dict[str, int]:
    """``module.[Class.]function`` -> its length in lines, for every function of ``path``."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}.{child.name}"
                if not isinstance(child, ast.ClassDef):
                    found[name] = child.end_lineno - child.lineno + 1
                visit(child, name)
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text()), module_name(path))
    return found


def test_functions_stay_readable():
    long = {}
    for path in MODULES.values():
        for name, lines in functions(path).items():
            exempt = name.startswith(CLI)
            if lines > MAX_FUNCTION_LINES and not exempt:
                long[name] = lines
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them): {long}"


def test_pure_modules_import_no_tensorflow():
    code = (
        "import importlib, json, sys\n"
        f"for name in {PURE_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('tensorflow', 'keras', 'tensorflow_datasets'))))\n"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout) == []


def test_the_library_logs_through_a_null_handler_only():
    code = (
        "import logging, hybridpar\n"
        "logger = logging.getLogger('hybridpar')\n"
        "print([type(h).__name__ for h in logger.handlers], logger.propagate)\n"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert completed.stdout.strip() == "['NullHandler'] True", completed.stderr


def test_docstrings_cite_no_document_outside_the_repository():
    for name, path in MODULES.items():
        text = path.read_text()
        for phrase in ("DESIGN.md", "fact 5", "(fix ", "fix 3"):
            assert phrase not in text, f"{name} cites {phrase!r}"


def test_test_modules_have_unique_names():
    """pytest imports test modules by basename (the test folders are not packages), so two
    `test_x.py` in different layers make the whole run fail to collect one of them."""
    seen: dict[str, list[str]] = {}
    for path in sorted((PACKAGE.parent / "tests").rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(PACKAGE.parent)))
    assert not {name: paths for name, paths in seen.items() if len(paths) > 1}


def test_every_package_is_in_the_wheel():
    """pyproject's explicit package list: a package missing there is left out of a non-editable
    install (``pip install .``) and its imports fail only there."""
    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    listed = set(project["tool"]["setuptools"]["packages"])
    found = {".".join(init.parent.relative_to(PACKAGE.parent).parts)
             for init in PACKAGE.rglob("__init__.py")}
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
