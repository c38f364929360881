"""Draw minillm's folders from its real imports: docs/architecture.png (run: python docs/architecture.py).

Each box is a folder of minillm/ with its files and lines; an arrow A -> B means some file in A imports
from B. Floors are computed from the imports (a folder sits one floor above the highest folder it
imports), so the picture cannot drift from the code; tests/test_architecture.py checks the same graph.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "minillm"
ROLES = {
    "model": "the tiny transformer",
    "engine": "THE CORE: loop, policies, KV, seams",
    "layers": "features on the core's seams",
    "grammar": "patterns compiled to automata",
    "parallel": "one model split over ranks",
    "training": "tasks, and how the model learns them",
    "card": "a real model on a real card",
    "runs": "workloads in, traces and metrics out",
    "serving": "the engine behind HTTP",
    "bench": "every claim measured",
    "cli": "python -m minillm",
}


def folder_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else None


def folder_graph() -> tuple[dict[str, set[str]], dict[str, tuple[int, int]]]:
    edges: dict[str, set[str]] = {f: set() for f in ROLES}
    sizes: dict[str, tuple[int, int]] = {}
    for name in ROLES:
        files = sorted((PACKAGE / name).glob("*.py"))
        sizes[name] = (
            len([f for f in files if f.name != "__init__.py"]),
            sum(len(f.read_text().splitlines()) for f in files),
        )
        for path in files:
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("minillm."):
                    other = folder_of(node.module)
                    if other and other != name:
                        edges[name].add(other)
    return edges, sizes


def reduce(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """Drop an arrow A -> C when a longer path A -> ... -> C already shows that A stands on C."""

    def reachable(start: str) -> set[str]:
        seen, todo = set(), list(edges[start])
        while todo:
            f = todo.pop()
            if f not in seen:
                seen.add(f)
                todo.extend(edges[f])
        return seen

    return {
        a: {c for c in targets if not any(c in reachable(b) for b in targets - {c})} for a, targets in edges.items()
    }


def floors(edges: dict[str, set[str]]) -> dict[str, int]:
    floor: dict[str, int] = {}

    def height(f: str) -> int:
        if f not in floor:
            floor[f] = 1 + max((height(g) for g in edges[f]), default=-1)
        return floor[f]

    for f in edges:
        height(f)
    return floor


def draw(out: Path) -> Path:
    edges, sizes = folder_graph()
    floor = floors(edges)
    by_floor: dict[int, list[str]] = {}
    for f in ROLES:
        by_floor.setdefault(floor[f], []).append(f)
    fig, ax = plt.subplots(figsize=(12, 7.5), dpi=110)
    box_w, box_h, where = 3.0, 0.95, {}
    for level, names in by_floor.items():
        for i, name in enumerate(names):
            x = (i - (len(names) - 1) / 2) * (box_w + 0.5)
            where[name] = (x, level * 1.6)
    for src, targets in reduce(edges).items():
        for dst in targets:
            (x1, y1), (x2, y2) = where[src], where[dst]
            ax.add_patch(FancyArrowPatch((x1, y1 - box_h / 2), (x2, y2 + box_h / 2), arrowstyle="-|>",
                                         mutation_scale=16, color="#777", lw=1.6, zorder=1))  # fmt: skip
    for name, (x, y) in where.items():
        core = name == "engine"
        ax.add_patch(FancyBboxPatch((x - box_w / 2, y - box_h / 2), box_w, box_h, boxstyle="round,pad=0.05",
                                    fc="#fde8c8" if core else "#e6eef8", ec="#c0392b" if core else "#4a6fa5",
                                    lw=2.5 if core else 1.5, zorder=2))  # fmt: skip
        files, lines = sizes[name]
        ax.text(x, y + 0.2, f"{name}/", ha="center", va="center", fontsize=15, weight="bold")
        ax.text(x, y - 0.07, ROLES[name], ha="center", va="center", fontsize=9.5)
        ax.text(x, y - 0.3, f"{files} files, {lines:,} lines", ha="center", va="center", fontsize=9, color="#555")
    xs = [x for x, _ in where.values()]
    ax.set_xlim(min(xs) - 1.4 * box_w, max(xs) + 1.4 * box_w)
    ax.set_ylim(-1, max(y for _, y in where.values()) + 1)
    ax.axis("off")
    ax.set_title("minillm/, drawn from its imports: A -> B means A imports B (and all B stands on)", fontsize=14)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "architecture.png"
    print(draw(target))
