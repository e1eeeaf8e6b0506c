"""The layers of docs/design.md, and no import cycle. The layers: the core resid (0) <- resid.dictionaries (1) <-
resid.analyses (2) <- resid.analyses.cli (3). A module may import its own layer or a lower one, never a higher one:
the core never imports the dictionaries (it attaches them through resid.attachments) nor the analyses, the
dictionaries never import the analyses, the analyses never import the CLI. The analyses live in the folder analyses/
and install as resid.analyses (pyproject.toml).

Nor do resid's modules import one another in a cycle, so no import has to hide inside a function to break one (the
function-local imports left keep `import resid` and `resid --help` from loading torch and the analyses).

Read from the source (ast), not by importing, so an import inside a function, behind `if TYPE_CHECKING` or through
`importlib.import_module("...")` counts too."""

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"resid": "resid", "analyses": "resid.analyses"}  # folder under the repository root -> package name
# the most specific prefix first
LAYERS = (("resid.analyses.cli", 3), ("resid.analyses", 2), ("resid.dictionaries", 1), ("resid", 0))


def layer_of(module: str) -> int | None:
    """The layer of a dotted module name; None for anything outside resid (torch, pandas, ...)."""
    for prefix, layer in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return layer
    return None


def module_name(path: Path, root: Path) -> str:
    folder, *parts = path.relative_to(root).with_suffix("").parts
    parts = [PACKAGES[folder], *parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of everything the module imports. `from a import b` yields `a.b`, since b may be a
    submodule (`from resid.analyses import cli`); a.b is never in a lower layer than a."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the importing package
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield from ((node.lineno, base if alias.name == "*" else f"{base}.{alias.name}") for alias in node.names)
        elif isinstance(node, ast.Call) and _is_import_module(node.func) and node.args:
            name = _leading_text(node.args[0])
            if name:
                yield node.lineno, name.rstrip(".")


def _is_import_module(func: ast.expr) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id in ("import_module", "__import__")
    )


def _leading_text(arg: ast.expr) -> str | None:
    """The literal start of a module-name argument: "a.b" or f"a.b.{name}" -> "a.b."."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return str(arg.values[0].value)
    return None


def violations(root: Path) -> list[str]:
    """'file:line: module (layer a) imports name (layer b)' for every import of a higher layer."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            module = module_name(path, root)
            own = layer_of(module)
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for line, name in imported_names(tree, module, path.name == "__init__.py"):
                target = layer_of(name)
                if own is not None and target is not None and target > own:
                    found.append(f"{path.relative_to(root)}:{line}: {module} (layer {own}) imports {name} "
                                 f"(layer {target})")
    return sorted(set(found))


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the resid modules it imports (anywhere in it), each import name cut to its longest module prefix
    (`from resid.sites import Site` -> resid.sites, a package's __init__)."""
    paths = {module_name(path, root): path for package in PACKAGES for path in sorted((root / package).rglob("*.py"))}
    graph = {}
    for module, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        found = set()
        for _, name in imported_names(tree, module, path.name == "__init__.py"):
            parts = name.split(".")
            target = next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in paths), None)
            if target is not None and target != module:
                found.add(target)
        graph[module] = found
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_import_cycle():
    graph = import_graph(ROOT)
    assert "resid.sites.site" in graph["resid.sites"] and "resid.forward" in graph["resid.model"]  # read at all
    found = cycles(graph)
    assert not found, "modules that import one another in a cycle:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_cycle_finder_finds_a_cycle_through_a_function_local_import(tmp_path):
    files = {
        "resid/__init__.py": "",
        "resid/a.py": "from resid.b import f\n",
        "resid/b.py": "def f():\n    from resid.c import g\n",
        "resid/c.py": "import resid.a\n",
        "resid/d.py": "from resid.a import f\n",
        "analyses/__init__.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cycles(import_graph(tmp_path)) == [["resid.a", "resid.b", "resid.c"]]


def test_no_module_imports_a_higher_layer():
    assert (ROOT / "resid" / "__init__.py").is_file() and (ROOT / "analyses" / "cli" / "main.py").is_file()
    found = violations(ROOT)
    layers = "resid <- resid.dictionaries <- resid.analyses <- resid.analyses.cli"
    assert not found, f"imports against the layers {layers}:\n" + "\n".join(found)


def test_the_checker_catches_upward_imports(tmp_path):
    files = {
        "resid/__init__.py": "",
        "resid/bad.py": "import torch\n\nfrom resid.analyses import x\n",
        "resid/sub/__init__.py": "def f():\n    import resid.analyses.io.tables\n",
        "resid/dynamic.py": "import importlib\nimportlib.import_module('resid.analyses.plots')\n",
        "resid/lazy_dictionaries.py": "def run():\n    from resid.dictionaries.attach import Attached\n",
        "resid/dictionaries/__init__.py": "from resid.capture import Capture\n",
        "resid/dictionaries/up.py": "from resid.analyses.features import views\n",
        "analyses/__init__.py": "from . import cli\n",
        "analyses/ok.py": "import resid\nfrom resid.errors import ResidError\nfrom resid.analyses import tables\n",
        "analyses/lazy.py": "from importlib import import_module\nimport_module(f'resid.analyses.cli.{name}')\n",
        "analyses/cli/__init__.py": "",
        "analyses/cli/main.py": "import resid.analyses\nfrom resid.analyses.io import tables\nfrom resid import load\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = violations(tmp_path)
    assert [f.split(": ")[0] for f in found] == [
        "analyses/__init__.py:1", "analyses/lazy.py:2", "resid/bad.py:3", "resid/dictionaries/up.py:1",
        "resid/dynamic.py:2", "resid/lazy_dictionaries.py:2", "resid/sub/__init__.py:2",
    ], found
    assert "resid.bad (layer 0) imports resid.analyses.x (layer 2)" in found[2]
    assert "imports resid.analyses.cli (layer 3)" in found[1]
    assert "resid.lazy_dictionaries (layer 0) imports resid.dictionaries.attach.Attached (layer 1)" in found[5]
