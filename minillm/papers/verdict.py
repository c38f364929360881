"""Published against reproduced: a headline figure, the simulated one, their ratio and the verdict.

Issue 45's rule: a figure is reproduced when the simulated value lands within 35% of the published one (the
ratio reproduced / published between 0.65 and 1.35). A published bound ("more than 2x") is reproduced when the
simulated value keeps it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

TOLERANCE = 0.35


@dataclass(frozen=True)
class Headline:
    name: str  # what the figure is: "vLLM over naive static"
    published: float
    reproduced: float
    unit: str  # "x" (a ratio of throughputs) or "tokens/s"
    setting: str  # where the paper's figure sits in its sweep: "max tokens 1536"
    source: str  # where the published figure was read
    at_least: bool = False  # the paper publishes a bound: "more than" `published`
    about: str = ""  # for the code: what the figure is of (a system's key)

    @property
    def ratio(self) -> float:
        return self.reproduced / self.published

    @property
    def reproduced_ok(self) -> bool:
        if self.at_least:
            return self.reproduced > self.published
        return abs(self.ratio - 1) <= TOLERANCE

    @property
    def verdict(self) -> str:
        if self.at_least:
            return "kept" if self.reproduced_ok else "not kept"
        return "reproduced" if self.reproduced_ok else "not reproduced"

    def to_dict(self) -> dict:
        return asdict(self) | {"ratio": self.ratio, "verdict": self.verdict}


def figure(value: float, unit: str, at_least: bool = False) -> str:
    """23x, 1.9x, 81 tokens/s; a bound as "> 2x"."""
    text = f"{value:,.0f} {unit}" if unit != "x" else f"{value:.3g}x"
    return f"> {text}" if at_least else text


def headline_table(headlines: list[Headline]) -> str:
    """One line per headline: what, where, published, reproduced, reproduced / published, verdict."""
    rows = [("headline", "setting", "published", "reproduced", "ratio", "verdict")]
    for h in headlines:
        ratio = "" if h.at_least else f"{h.ratio:.2f}"
        rows.append((h.name, h.setting, figure(h.published, h.unit, h.at_least), figure(h.reproduced, h.unit), ratio,
                     h.verdict))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)
