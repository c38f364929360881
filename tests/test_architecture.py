"""The package's architecture, read from its imports (ast, nothing is imported): the rules stay true.

Imports run one way, folder by folder (model <- engine <- training, card <- runs <- serving <- bench <- cli),
no module imports another that imports it back, the core stays small enough to read in an evening, and no
file holds more than one idea's worth of lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "minillm"
# A folder may import from folders on a lower floor (and from itself); the top-level config.py and errors.py
# are the ground floor everyone stands on.
FLOORS = {"errors": 0, "config": 0.5, "model": 1, "grammar": 1.5, "engine": 2, "training": 3, "card": 3, "parallel": 3,
          "runs": 4, "serving": 5, "bench": 6, "cli": 7, "__main__": 8, "__init__": 8}  # fmt: skip
CORE = ("engine", "model")
# The move (issue 18) left the core at 1,882 lines of its ~1,900. What came after, each asked for by an issue: the
# allocator's debug mode and events, one live request per id, prefixes shared mid-prefill (issue 25); KV freed
# after the step's record (issue 19); fused q/k/v and gate/up, with files kept in Llama's layout (issue 22).
# Issue 24 added a new idea to the core, speculative decoding: engine/speculate.py (the drafters, acceptance,
# rollback: 190 lines) and what it needs elsewhere (a request's draft, verify rows in packing and the runner, the
# allocator's truncate, the guesses in the trace): 1,945 -> 2,207 lines; verify rows' query heads folded onto their
# kv heads in attention, as decode rows' are (3x faster attention at 128 rows of 3 tokens): 2,217.
# Issue 32 added output that obeys: engine/constrain.py (a row's automaton state, its mask per pick, 90 lines),
# the mask and the rejection rule of speculative sampling in sampler.py, draws from each request's own streams
# (batch invariance), guesses per logit position in packing, constraints in the plain loop: 2,434. The compilers
# (regex, automaton, JSON schema) live beside the core in grammar/, which the core does not import but for DEAD.
# Issue 30 (tensor parallelism) opened a seam in the core: a step planned from given block tables (a worker plans
# rank 0's step: kv_cache.plan_rows), the runner's prepare apart from its forward, make_cache for any heads: 2,454.
# The ranks themselves live above the core in parallel/.
# Issue 31 (prefill apart from decode) added a request handed from one engine to another: engine/handover.py (export,
# the copy, adopt: 65 lines), a request's KV read and written whole in both caches, the scheduler counting brought KV
# as computed, the engine keeping a handed request's KV until released; the step's record moved to trace.py: 2,586.
# Shortcuts for a simulated fleet's thousands of steps (no checks of an empty plan, no speculation calls when off):
# 2,593. Growing past this is a decision, made here with its reason, not a drift.
CORE_MAX_LINES = 2_600
FILE_MAX_LINES = 300


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Every minillm module this file imports, at the top or inside a function (a lazy import is still one)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("minillm"):
            for alias in node.names:  # `from minillm.card import roofline` imports the module minillm.card.roofline
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if candidate in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("minillm")}
    return found


FILES = sorted(PACKAGE.rglob("*.py"))
MODULES = {module_name(p) for p in FILES}
GRAPH = {module_name(p): imported_modules(p) for p in FILES}


def folder(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_run_one_way(module):
    here = folder(module)
    upward = [m for m in GRAPH[module] if folder(m) != here and FLOORS[folder(m)] >= FLOORS[here]]
    assert not upward, f"{module} (floor {FLOORS[here]}: {here}/) imports {upward} from its own floor or above"


def test_every_folder_has_a_floor():
    assert {folder(m) for m in GRAPH} <= set(FLOORS), "a new folder needs its place in FLOORS"


def test_no_import_circle():
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for other in GRAPH.get(module, ()):
            if other.startswith("minillm") and other != module and other not in ("minillm",):
                if state.get(other) == "open":
                    raise AssertionError("import circle: " + " -> ".join(path + [other]))
                if other not in state:
                    visit(other, path + [other])
        state[module] = "done"

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [module])


def test_the_engine_knows_nothing_of_cards_servers_benchmarks_or_pictures():
    for module, imports in GRAPH.items():
        if folder(module) == "engine":
            outside = [m for m in imports if folder(m) in ("card", "serving", "bench", "runs", "training", "cli")]
            assert not outside, f"{module} imports {outside}"
    package_text = "\n".join(p.read_text() for p in FILES)
    assert "import viz" not in package_text and "from viz" not in package_text, "minillm must never import viz"


def test_the_core_reads_in_an_evening():
    """engine/ and model/: their code files (each folder's __init__.py is a reading guide and its public names)."""
    core = [p for p in FILES if folder(module_name(p)) in CORE and p.name != "__init__.py"]
    lines = sum(len(p.read_text().splitlines()) for p in core)
    assert lines <= CORE_MAX_LINES, f"engine/ + model/ hold {lines} lines (at most {CORE_MAX_LINES})"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_one_idea_per_file(path):
    lines = len(path.read_text().splitlines())
    assert lines <= FILE_MAX_LINES, f"{path.relative_to(PACKAGE)} has {lines} lines: is a second idea hiding in it?"


def test_the_rules_catch_an_upward_import(tmp_path):
    """The checker itself: an engine file importing the cost model is caught."""
    bad = tmp_path / "bad.py"
    bad.write_text("from minillm.card.roofline import step_cost\n")
    assert "minillm.card.roofline" in imported_modules(bad)
    assert FLOORS["card"] >= FLOORS["engine"]


def lazy_and_top_imports() -> list[tuple[str, str, str]]:
    """(file, module, name) for every `from minillm... import name` in the package, inside functions too."""
    found = []
    for path in FILES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("minillm"):
                found += [(str(path.relative_to(PACKAGE)), node.module, alias.name) for alias in node.names]
    return found


def test_every_import_in_the_package_resolves():
    """A function's own imports run only when it is called: a moved name would break a command nobody tested."""
    import importlib

    missing = []
    for file, module, name in lazy_and_top_imports():
        target = importlib.import_module(module)
        if not hasattr(target, name) and importlib.util.find_spec(f"{module}.{name}") is None:
            missing.append(f"{file}: from {module} import {name}")
    assert not missing, "imports that would fail when run:\n" + "\n".join(missing)
