"""The shape of engine/ that keeps it easy to carry on: no import circle between its modules (counting imports made
inside functions, which only hide one), and the window's code (app/) imported by one module alone."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "engine"


def modules() -> dict[str, Path]:
    out = {}
    for path in ENGINE.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's imports of other engine modules, wherever in it they are (a name imported from a package that is
    a module of its own counts as that module)."""
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                deps.update(f"{target}.{a.name}" if f"{target}.{a.name}" in mods else target for a in node.names)
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while component[-1:] != [v]:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_in_engine():
    assert circles(imports(modules())) == []


# engine's layers, lowest first: a package or top module imports only those before it (and itself). The core (the
# binding, errors, the formats table) knows no family; a checkpoint reader no loaded model; a run no profile; the
# session every front end opens models through sits under the profiles' replay, the tuner and the commands.
LAYERS = ["core", "families", "checkpoints", "placement", "model", "devices", "runs", "session", "profiles", "export",
          "tune", "cli", "__main__"]  # fmt: skip


def unit(module: str) -> str:
    """The package or top module a module of engine/ belongs to: engine.runs.run -> runs, engine.session -> session."""
    return module.split(".")[1]


def test_no_import_circle_between_engine_packages():
    """Modules without a circle can still make packages import each other (core.model used checkpoints while
    checkpoints used core's errors): then no package can be read, tested or replaced below the other."""
    graph: dict[str, set[str]] = {}
    for name, deps in imports(modules()).items():
        if name != "engine":
            graph.setdefault(unit(name), set()).update(unit(d) for d in deps if d != "engine" and unit(d) != unit(name))
    for deps in list(graph.values()):
        for d in deps:
            graph.setdefault(d, set())
    assert circles(graph) == []


def test_engine_packages_import_only_their_lower_layers():
    upward = []
    for name, deps in imports(modules()).items():
        if name in ("engine", "engine._build_native"):
            continue
        for d in deps:
            if d != "engine" and LAYERS.index(unit(d)) > LAYERS.index(unit(name)):
                upward.append(f"{name} imports {d}")
    assert upward == []
    units = {unit(n) for n in modules() if n not in ("engine", "engine._build_native")}
    assert units == set(LAYERS)


def test_the_checker_finds_a_circle_and_the_imports_inside_functions():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = imports(modules())
    # fingerprint() imports it where it needs it
    assert "engine.checkpoints.gguf_file" in graph["engine.profiles.profile"]
    assert {"engine.families", "engine.checkpoints.gguf_file"} <= graph["engine.checkpoints.checkpoint"]


def test_only_the_gui_command_imports_the_window():
    importers = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            if any(n == "app" or n.startswith("app.") for n in names):
                importers.append(name)
    assert sorted(set(importers)) == ["engine.cli.gui"]


def test_every_package_is_installed():
    """pyproject's packages list names every package of engine/ and app/: one left out is missing from a built
    wheel, though an editable install (tests/setup.sh's) would not show it."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"])
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for top in ("engine", "app")
        for p in (ROOT / top).rglob("__init__.py")
    }
    assert found - listed == set()


def test_engine_modules_sit_in_packages():
    """engine/ is packages by job (core, checkpoints, families, placement, runs, profiles, export, tune, cli); at its
    top only the package file, `python -m engine`, the native build script and the session every front end opens
    its models through, with the loaded engine it opens (model: Engine, Model, Context) and which devices an engine
    opens (devices): the layer above the checkpoints and placements, under the runs."""
    top = sorted(p.name for p in ENGINE.glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "_build_native.py", "devices.py", "model.py", "session.py"]
    packages = sorted(p.parent.name for p in ENGINE.glob("*/__init__.py"))
    assert packages == ["checkpoints", "cli", "core", "export", "families", "placement", "profiles", "runs", "tune"]


def bound_names(path: Path) -> set[str]:
    """The names a module binds at its top (definitions, assignments, imports, also inside a try or an if there):
    what `from it import name` finds."""
    out: set[str] = set()
    todo = list(ast.parse(path.read_text(encoding="utf-8")).body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.Try | ast.If):
            todo += node.body + node.orelse + [s for h in getattr(node, "handlers", []) for s in h.body]
        elif isinstance(node, ast.Import | ast.ImportFrom):
            out.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                out.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return out


def missing(mods: dict[str, Path], module: str, names: list[str]) -> list[str]:
    """Of `from module import names`, each name that is neither a module of engine/ nor bound at the module's top."""
    if module not in mods:
        return [] if module == "engine._native" else [module]
    bound = bound_names(mods[module])
    return [f"{module}.{n}" for n in names if n != "*" and f"{module}.{n}" not in mods and n not in bound]


def test_every_relative_import_names_a_module_that_exists():
    """An import inside a function runs only when that function does: one that names a module moved elsewhere would
    pass every test that does not reach it. Each relative import's module is found here, whoever calls it."""
    mods = modules()
    dangling = []
    for name, path in mods.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
                names = [a.name for a in node.names]
                dangling += [f"{path.relative_to(ROOT)}:{node.lineno}: {m}" for m in missing(mods, target, names)]
    assert dangling == []


def test_every_import_of_engine_elsewhere_names_a_module_that_exists():
    """The same for the window, the tests, the benchmarks and the tools: `from engine.X import ...` anywhere in the
    repository names a module of engine/."""
    mods = modules()
    dangling = []
    for top in ("app", "tests", "bench", "assets", "tools"):
        for path in (ROOT / top).rglob("*.py") if (ROOT / top).is_dir() else ():
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                found: list[str] = []
                if isinstance(node, ast.Import):
                    found = [a.name for a in node.names if a.name.split(".")[0] == "engine" and a.name not in mods]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("engine"):
                    found = missing(mods, node.module, [a.name for a in node.names])
                dangling += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in found]
    assert dangling == []
