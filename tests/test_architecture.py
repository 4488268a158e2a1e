"""docs/architecture.md §3 as a test: who may import whom, no import cycles, no private names across modules.

Every import statement of ``cem_bench/`` is read with ``ast`` (function-level ones included), so a lazy import
inside a function counts as much as one at the top of the file.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "cem_bench"
DOC = ROOT / "docs" / "architecture.md"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def read_groups(text: str) -> set[str]:
    """The folders that §3 says group rooms without being rooms themselves (``core/``, ``analysis/``)."""
    m = re.search(r"The folders (.*?) group rooms", text.split("## 3. Who may import whom", 1)[1], re.S)
    assert m, "docs/architecture.md §3 names no folders that group rooms"
    return set(re.findall(r"`(\w+)/`", m.group(1)))


GROUPS = read_groups(DOC.read_text())


def room(module: str, groups: set[str] = GROUPS) -> str:
    """``cem_bench.surrogates.gmm`` -> ``surrogates``; ``cem_bench`` (the package's ``__init__``) -> itself; a
    module of a folder that only groups rooms is its own room: ``cem_bench.core.trainer`` -> ``trainer``,
    ``cem_bench.analysis.report.page`` -> ``report``, the folder's ``__init__`` ``cem_bench.core`` -> ``core``."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] in groups:
        return parts[2]
    return parts[1] if len(parts) > 1 else parts[0]


def project_modules(package: Path = PACKAGE) -> dict[str, Path]:
    """``{"cem_bench.surrogates.gmm": path, ...}`` of the package folder ``package``."""
    return {module_name(p, package.parent): p for p in sorted(package.rglob("*.py"))}


def imports(path: Path, name: str, modules: set[str]) -> list[tuple[int, str, list[str]]]:
    """``(line, module imported, names imported from it)`` for every project import in ``path``, the module
    ``name``. ``from X import y`` where ``X.y`` is a module counts as an import of ``X.y``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names if a.name.split(".")[0] == "cem_bench"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "cem_bench":
                continue
            names = [a.name for a in node.names]
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
            out += [(node.lineno, s, []) for s in subs]
            rest = [n for n in names if f"{target}.{n}" not in modules]
            if rest or not subs:
                out.append((node.lineno, target, rest))
    return out


def read_rules(text: str) -> dict[str, tuple[int, set[str] | None]]:
    """The §3 table: room -> (rule number, the rooms it may import; None = anything)."""
    section = text.split("## 3. Who may import whom", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if re.match(r"^\| \d+ \|", line)]
    assert rows, "docs/architecture.md §3 has no rule table"
    by_number: dict[int, tuple[list[str], str]] = {}
    for line in rows:
        number, rooms, allowed = (c.strip() for c in line.strip().strip("|").split("|"))
        by_number[int(number)] = (re.findall(r"`([\w]+)`", rooms), allowed)
    rules: dict[str, tuple[int, set[str] | None]] = {}
    for number, (rooms, allowed) in sorted(by_number.items()):
        if allowed == "anything":
            may = None
        elif allowed == "nothing":
            may = set()
        elif m := re.fullmatch(r"rules (\d+)[–-](\d+)", allowed):
            may = {r for n in range(int(m[1]), int(m[2]) + 1) for r in by_number[n][0]}
        else:
            may = set(re.findall(r"`([\w]+)`", allowed))
        for r in rooms:
            rules[r] = (number, may)
    return rules


def violations(rules, modules: dict[str, Path]) -> list[str]:
    out = []
    for name, path in modules.items():
        mine = room(name)
        if mine not in rules:
            out.append(f"{name}: room {mine!r} is in no rule of docs/architecture.md §3")
            continue
        number, may = rules[mine]
        for line, target, _ in imports(path, name, set(modules)):
            other = room(target)
            if other != mine and may is not None and other not in may:
                out.append(f"{name} may not import {target} (rule {number}; line {line})")
    return out


def cycles(modules: dict[str, Path]) -> list[list[str]]:
    """Strongly connected groups of more than one module in the import graph (Tarjan)."""
    graph = {m: sorted({t for _, t, _ in imports(p, m, set(modules)) if t in modules and t != m})
             for m, p in modules.items()}
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def defined_private_names(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the private names it defines (functions, classes, module-level assignments, and attributes
    its classes set on ``self``)."""
    out: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            found.add(n.id)
                        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self":
                            found.add(n.attr)
        out[name] = {n for n in found if n.startswith("_") and not n.startswith("__")}
    return out


def private_uses(files: dict[str, Path], modules: dict[str, Path]) -> list[str]:
    """In ``files`` (module name -> path): ``from X import _y`` of a project module, and ``obj._y`` where ``_y``
    is a private name that another project module defines and the file itself does not (``self._y`` and
    ``cls._y`` are always the class's own business)."""
    private = defined_private_names(modules)
    out = []
    for name, path in files.items():
        own = private.get(name, set())
        elsewhere = set().union(*(v for k, v in private.items() if k != name))
        for line, target, names in imports(path, name, set(modules)):
            out += [f"{name}:{line} imports the private name {n} from {target}"
                    for n in names if n.startswith("_") and not n.startswith("__")]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in elsewhere - own:
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    continue
                out.append(f"{name}:{node.lineno} uses {ast.unparse(node)}, a private name of another module")
    return out


MODULES = project_modules()
RULES = read_rules(DOC.read_text())


def test_every_import_follows_the_rules_of_the_architecture_page():
    assert violations(RULES, MODULES) == []


def test_no_module_imports_in_a_cycle():
    assert cycles(MODULES) == []


def test_graphs_imports_nothing_of_the_project():
    assert imports(PACKAGE / "core" / "graphs.py", "cem_bench.core.graphs", set(MODULES)) == []


def test_the_folders_are_the_map():
    """Each folder that groups rooms holds exactly the rooms docs/architecture.md §2 lists under it, and a room
    lives in one place: ``cem_bench/core/trainer.py`` and ``cem_bench/trainer.py`` cannot both exist."""
    assert GROUPS == {"core", "analysis"}
    where: dict[str, set[str]] = {}
    for name in MODULES:
        parts = name.split(".")
        if len(parts) > 1:
            where.setdefault(room(name), set()).add(parts[1] if parts[1] in GROUPS and len(parts) > 2 else "")
    assert {r: w for r, w in where.items() if len(w) > 1} == {}
    section = DOC.read_text().split("## 2. The rooms", 1)[1].split("\n## ", 1)[0]
    for group in GROUPS:
        listed = re.search(rf"`{group}/` holds (.*?)\.\n", section, re.S)
        assert listed, f"docs/architecture.md §2 does not say what `{group}/` holds"
        rooms = set(re.findall(r"`(\w+)(?:\.py|/)`", listed.group(1)))
        actual = {room(m) for m in MODULES if m.split(".")[1:2] == [group] and m != f"cem_bench.{group}"}
        assert rooms == actual, f"{group}/: the page lists {sorted(rooms)}, the folder holds {sorted(actual)}"
    crossing = [f"{name} imports {target}" for name, path in MODULES.items() for _, target, _ in
                imports(path, name, set(MODULES))
                if {(name.split(".") + [""])[1], (target.split(".") + [""])[1]} == {"core", "analysis"}]
    assert crossing == [], "§2: nothing in core/ imports analysis/, and analysis/ imports nothing of core/"


def test_no_module_or_script_uses_another_modules_private_names():
    scripts = {module_name(p): p for p in sorted((ROOT / "scripts").glob("*.py"))}
    assert private_uses({**MODULES, **scripts}, MODULES) == []


def private_ray_imports(paths: list[Path]) -> list[tuple[str, str, bool]]:
    """``(file, module, guarded)`` for each import of one of Ray's private modules (a ``_``-led part, e.g.
    ``ray._private.utils``, ``ray.autoscaler._private``): ``guarded`` when it sits inside a ``try``. (Torch's
    ``TorchDispatchMode`` lives in ``torch.utils._python_dispatch``, where PyTorch's docs import it from.)"""
    out = []
    for path in paths:
        tree = ast.parse(path.read_text())
        guarded = {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try) for b in t.body for n in ast.walk(b)}
        for node in ast.walk(tree):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                if name.split(".")[0] == "ray" and any(p.startswith("_") for p in name.split(".")[1:]):
                    out.append((str(path.relative_to(ROOT)), name, id(node) in guarded))
    return out


def test_the_package_uses_one_private_ray_module_and_under_a_guard():
    """docs/architecture.md: the search uses Ray's public API save ``read_ray_address``, read inside a ``try`` (a
    Ray release that moves it skips one check, it does not break the search)."""
    assert private_ray_imports(sorted(PACKAGE.rglob("*.py"))) == [
        ("cem_bench/search/run.py", "ray._private.utils", True)]
    assert "ray._private.utils.read_ray_address" in DOC.read_text()


def test_the_checks_catch_a_forbidden_import_a_cycle_and_a_private_name(tmp_path):
    """The checks can fail: a copy of the package with a surrogate that imports the trainer (rule 9), a cycle
    between two foundations, and a script that reads ``Trainer``'s private state."""
    import shutil
    copy = tmp_path / "cem_bench"
    shutil.copytree(PACKAGE, copy)
    gmm = copy / "surrogates" / "gmm.py"
    gmm.write_text(gmm.read_text() + "\n\ndef _late():\n    from ..core.trainer import Trainer  # noqa: F401\n")
    errors = copy / "errors.py"
    errors.write_text(errors.read_text() + "\nfrom . import storage  # noqa: E402,F401\n")
    storage = copy / "storage.py"
    storage.write_text(storage.read_text() + "\nfrom . import errors  # noqa: E402,F401\n")
    modules = project_modules(copy)
    found = violations(RULES, modules)
    assert any(v.startswith("cem_bench.surrogates.gmm may not import cem_bench.core.trainer (rule 9") for v in found)
    assert any(v.startswith("cem_bench.errors may not import cem_bench.storage (rule 1") for v in found)
    assert ["cem_bench.errors", "cem_bench.storage"] in cycles(modules)
    script = tmp_path / "peek.py"
    script.write_text("def peek(tr):\n    return tr._surrogate_fwd\n")
    assert private_uses({"scripts.peek": script}, MODULES) == [
        "scripts.peek:2 uses tr._surrogate_fwd, a private name of another module"]


@pytest.mark.parametrize("line, rule", [("| 1 | `a`, `b` | nothing |", (1, set())),
                                        ("| 2 | `c` | `a`, `b` |", (2, {"a", "b"})),
                                        ("| 3 | `d` | rules 1–2 |", (3, {"a", "b", "c"})),
                                        ("| 4 | `e` | anything |", (4, None))])
def test_the_rule_table_is_read_as_written(line, rule):
    rows = "\n".join(["| 1 | `a`, `b` | nothing |", "| 2 | `c` | `a`, `b` |", "| 3 | `d` | rules 1–2 |",
                      "| 4 | `e` | anything |"])
    rules = read_rules(f"## 3. Who may import whom\n\n{rows}\n\n## 4. Next\n")
    name = re.findall(r"`(\w+)`", line)[-1 if rule[0] != 1 else 0]
    assert rules[line.split("`")[1]] == rule and name in rules
