"""The package's architecture, read from its imports (ast, nothing is imported): the rules stay true.

Imports run one way, folder by folder (model <- engine <- layers <- training, card <- runs <- serving <- bench <-
cli), no module imports another that imports it back, the core stays small enough to read in an evening and knows
no feature (each lives in a layer on one of the core's seams), and no file holds more than one idea's worth of lines.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "minillm"
# A folder may import from folders on a lower floor (and from itself); the top-level config.py and errors.py
# are the ground floor everyone stands on.
FLOORS = {"errors": 0, "config": 0.5, "model": 1, "grammar": 1.5, "engine": 2, "layers": 2.5, "training": 3,
          "card": 3, "parallel": 3, "runs": 4, "serving": 5, "papers": 5.5, "bench": 6, "cli": 7, "__main__": 8,
          "__init__": 8}  # fmt: skip
CORE = ("engine", "model")
# The rule: the core (engine/ + model/) teaches one idea and reads in an evening: a request's life, the policies, the
# allocator, the KV cache, packing ragged rows, one forward and the greedy pick, the loop, the one-user loop. Every
# other feature is a layer in minillm/layers/ on a seam engine.py names; a new feature adds a layer, not core lines.
# Counted as `wc -l` counts them, __init__.py files included; lines at most 100 columns, formatted by ruff.
CORE_MAX_LINES = 1_800
CORE_MAX_COLUMNS = 100
# Words a feature owns: the core may say them only where it defines the seams (engine.py), in at most two files.
FEATURE_WORDS = ("draft", "guess", "speculat", "constraint", "automaton", "handoff", "handover", "kv_import")
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


CORE_FILES = [p for p in FILES if folder(module_name(p)) in CORE]
LAYER_FILES = [p for p in FILES if folder(module_name(p)) == "layers"]


def test_the_core_reads_in_an_evening():
    lines = sum(len(p.read_text().splitlines()) for p in CORE_FILES)
    assert lines <= CORE_MAX_LINES, f"engine/ + model/ hold {lines} lines (at most {CORE_MAX_LINES})"


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_core_is_laid_out_plainly(path):
    """No line past the core's width, and nothing kept out of the formatter's hands."""
    text = path.read_text()
    assert "fmt: skip" not in text and "fmt: off" not in text, f"{path.name} keeps code from ruff format"
    wide = [i for i, line in enumerate(text.splitlines(), 1) if len(line) > CORE_MAX_COLUMNS]
    assert not wide, f"{path.name}: lines {wide} are wider than {CORE_MAX_COLUMNS} columns"


def layer_names() -> set[str]:
    """Every layer's module path, its classes, and its functions of more than one word (settle_row, not accept)."""
    names = set()
    for path in LAYER_FILES:
        if path.name != "__init__.py":
            names |= {f"layers.{path.stem}", f"layers/{path.stem}.py"}
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) or isinstance(node, ast.FunctionDef) and "_" in node.name.strip("_"):
                names.add(node.name)
    return names


def layers_named(text: str, names: set[str]) -> list[str]:
    words = set(re.findall(r"[A-Za-z_][\w./]*", text))
    return sorted(n for n in names if any(w == n or w.endswith(("." + n, "/" + n)) for w in words))


def test_no_core_file_imports_or_names_a_layer():
    names = layer_names()
    for path in CORE_FILES:
        module = module_name(path)
        layers = [m for m in GRAPH[module] if folder(m) == "layers"]
        assert not layers, f"{module} imports {layers}: the core knows no layer, a layer plugs into a seam"
        named = layers_named(path.read_text(), names)
        assert not named, f"{module} names {named}: the core knows no layer, a layer plugs into a seam"


def test_the_layer_check_catches_a_name():
    """The checker itself: a core file that names a layer's class or module is caught, the seams' words are not."""
    names = layer_names()
    assert {"LayeredEngine", "Sampler", "Speculation", "HandOver", "layers.sampling"} <= names
    assert layers_named("self.picker = Sampler()  # see minillm/layers/sampling.py", names) == [
        "Sampler", "layers/sampling.py"]  # fmt: skip
    assert layers_named("from minillm.layers.speculate import settle_row", names) == ["layers.speculate", "settle_row"]
    assert not layers_named("the pick seam: a layer may plug in a picker (minillm/layers/)", names)


@pytest.mark.parametrize("word", FEATURE_WORDS)
def test_a_feature_word_stays_where_the_seams_are_defined(word):
    holding = [p.name for p in CORE_FILES if word in p.read_text().lower()]
    assert len(holding) <= 2, f"{word!r} appears in {holding}: a feature belongs in its layer, not in the core"


@pytest.mark.parametrize("path", LAYER_FILES, ids=lambda p: p.name)
def test_every_layer_says_which_seam_it_uses(path):
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert "seam" in doc.lower(), f"layers/{path.name}: its docstring should say which of engine.py's seams it uses"


def test_a_request_carries_no_feature_state():
    """A layer keeps its own per-request state (a dict by id, its own record): Request's fields are the core's."""
    from minillm.engine.request import Request

    features = FEATURE_WORDS + ("logprob", "seed", "verified", "accepted")
    fields = [f for f in Request.__dataclass_fields__ if any(w in f for w in features)]
    assert not fields, f"Request has feature fields {fields}"


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
