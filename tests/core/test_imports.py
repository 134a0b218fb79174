"""The import graph's two rules (#58 item 5): the contracts are leaves, and nothing imports in
a circle.

rec.contract is what every stage, both servers' Python side and the benchmarks read, so it
imports no torch and nothing of rec above it: a fresh interpreter that imports every contract
module must not have loaded torch, rec.data, rec.config or rec.features. And no module of rec/,
train/, export/, serve/ or benchmarks/ reaches itself through its imports: a circle makes the
order of imports matter and hides which module owns what. Imports inside functions count too,
since a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import rec.contract

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("rec", "train", "export", "serve", "benchmarks")
# pyproject.toml's package-dir: the stage folders are installed under the rec namespace.
MAPPED = {"train": "rec.train", "export": "rec.export", "serve": "rec.serve"}
# Modules that a contract must not load, directly or through anything it imports.
ABOVE_CONTRACT = ("torch", "rec.data", "rec.config", "rec.features", "rec.train", "rec.export",
                  "rec.serve")  # fmt: skip


def contract_modules() -> list[str]:
    found = pkgutil.iter_modules(rec.contract.__path__, prefix="rec.contract.")
    return ["rec.contract", *sorted(m.name for m in found)]


def test_the_contract_modules_import_nothing_above_them():
    modules = contract_modules()
    assert {"rec.contract.events", "rec.contract.updates", "rec.contract.urls"} <= set(modules)
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"above = {ABOVE_CONTRACT!r}\n"
        "print('\\n'.join(m for m in sys.modules if m in above or m.startswith(\n"
        "    tuple(a + '.' for a in above))))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    loaded = sorted({m.split(".")[0] if m.startswith("torch") else m for m in proc.stdout.split()})
    assert not loaded, f"importing rec.contract loaded {loaded}"


def test_the_rec_command_loads_no_torch_until_a_command_needs_it():
    """`rec --help`, and the commands that only talk to servers or files, start in a fraction of a
    second: torch, torchrec and fbgemm_gpu cost about 4 CPU-s a process, paid only by the commands
    that train, export or read a data set (each imports them inside its function)."""
    code = (
        "import sys, rec.cli\nprint(' '.join(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'torchrec', 'fbgemm_gpu')))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [], f"import rec.cli loaded {sorted(proc.stdout.split())[:5]}"


def module_name(path: Path) -> str:
    """The name a file is imported by: rec.train.trainer for train/trainer.py; a benchmark script
    is imported by its stem (the scripts run with benchmarks/ on sys.path), named
    benchmarks.<stem> here."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[0] in MAPPED:
        parts[0:1] = MAPPED[parts[0]].split(".")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources() -> dict[str, Path]:
    return {
        module_name(p): p
        for top in SCANNED
        for p in sorted((REPO / top).rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The scanned modules `path` imports anywhere in it (module level, functions, TYPE_CHECKING
    blocks): each imported name resolved to the longest scanned module it names."""
    bench = {n.split(".", 1)[1] for n in known if n.startswith("benchmarks.")}

    def resolve(dotted: str) -> str | None:
        if name.startswith("benchmarks.") and dotted.split(".")[0] in bench:
            return "benchmarks." + dotted.split(".")[0]
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(resolve(a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for a in node.names:  # `from pkg import module` names a module, else a name in pkg
                full = f"{base}.{a.name}"
                out.add(full if full in known else resolve(base))
    out.discard(None)
    out.discard(name)
    return out


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan): the modules each
    reach the others through their imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

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
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def path_through(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle from the component's first module back to it (breadth first)."""
    start = min(component)
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {sorted(component)}")


def test_the_cycle_finder_finds_a_circle_and_names_it():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert circles(graph) == [{"a", "b", "c"}]
    assert path_through(graph, {"a", "b", "c"}) == ["a", "b", "c", "a"]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_scanner_reads_lazy_relative_and_benchmark_imports(tmp_path):
    known = {f"rec.{n}": tmp_path / f"{n}.py" for n in ("x", "y")}
    known |= {f"benchmarks.{n}": tmp_path / f"{n}.py" for n in ("one", "two")}
    known["rec.x"].write_text("def f():\n    from rec.y import g\n")
    known["rec.y"].write_text("from . import x\nimport numpy\n")
    known["benchmarks.one"].write_text("def main():\n    from two import run\n")
    assert imports_of("rec.x", known["rec.x"], known) == {"rec.y"}
    assert imports_of("rec.y", known["rec.y"], known) == {"rec.x"}
    assert imports_of("benchmarks.one", known["benchmarks.one"], known) == {"benchmarks.two"}


def test_no_module_imports_itself_in_a_circle():
    known = sources()
    assert {"rec.config", "rec.train.trainer", "rec.export.formats", "benchmarks.freshness"} <= set(
        known
    )
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    found = [path_through(graph, c) for c in circles(graph)]
    assert not found, "import circles (move the shared piece into a module both import):\n" + (
        "\n".join(" -> ".join(c) for c in found)
    )
