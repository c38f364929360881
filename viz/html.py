"""Small HTML snippets for the app: colour legends, the waiting queue, the users' replies."""

from __future__ import annotations

from html import escape

from viz.budget import TokenSplit
from viz.colors import (
    CACHED_FREE_BLOCK,
    DECODE,
    EMPTY,
    FREE_BLOCK,
    HELD,
    PREFILL,
    STALLED,
    STATE_COLORS,
    STATE_NAMES,
    text_on,
)

REPLY_TAIL = 180  # characters of a long reply kept on screen: the end is where the typing happens
STATUS_COLORS = {"running": "#0072b2", "held": "#b03030", "waiting": "#777777", "preempted": "#d55e00"}


def swatch(color: str, border: str = "#999999", border_px: int = 1) -> str:
    return (
        f'<span style="display:inline-block;width:0.9em;height:0.9em;background:{color};box-sizing:border-box;'
        f'border:{border_px}px solid {border};vertical-align:middle;margin-right:0.3em"></span>'
    )


def occupancy_legend(stalled: bool = False, held: bool = True, more: tuple[str, ...] = ()) -> str:
    """The seat states' colours (held: static batching's idle seats; stalled: seats waiting for budget), and `more`
    items after them (HTML: a fleet's marks)."""
    codes = [PREFILL, DECODE] + [HELD] * held + [STALLED] * stalled + [EMPTY]
    items = [f"{swatch(STATE_COLORS[c])}{STATE_NAMES[c]}" for c in codes]
    return '<div style="font-size:0.95em">' + " &nbsp; ".join([*items, *more]) + "</div>"


def kv_legend(prefix_caching: bool = False) -> str:
    shared = ""
    if prefix_caching:
        shared = (
            f"{swatch('#555555', '#000000', 3)}shared by n requests (n = reference count) &nbsp; "
            f"{swatch(CACHED_FREE_BLOCK)}free, still holding a cached prefix &nbsp; "
        )
    return (
        f'<div style="font-size:0.85em;color:#444">{swatch("#555555")}tokens stored (a colour per request) &nbsp; '
        f"{swatch('#d5d5d5')}reserved but empty &nbsp; {shared}{swatch(FREE_BLOCK)}free</div>"
    )


def stacked_bar(parts: list[tuple[str, float, str]], total: float, mark: float | None = None, height="1.3em") -> str:
    """A horizontal bar: (label, amount, colour) parts, laid left to right as shares of `total`;
    `mark`: an amount to draw a black line at (a budget smaller than the bar)."""
    cells = "".join(
        f'<div title="{escape(label)}" style="width:{100 * amount / total:.3f}%;background:{color}"></div>'
        for label, amount, color in parts
        if amount > 0
    )
    line = ""
    if mark is not None and mark < total:
        at = f"left:{100 * mark / total:.3f}%"
        line = f'<div style="position:absolute;{at};top:-3px;bottom:-3px;border-left:2px solid #000"></div>'
    return (
        f'<div style="position:relative;display:flex;height:{height};border:1px solid #999;background:{FREE_BLOCK};'
        f'margin:0.15em 0 0.3em 0">{cells}{line}</div>'
    )


def bar_block(head: str, parts: list[tuple[str, float, str]], total: float, extra: str = "", mark=None) -> str:
    """A heading, the bar, and a legend line naming each non-empty part with its amount."""
    words = [f"{swatch(color)}{amount:,} {label}" for label, amount, color in parts if amount]
    words += [extra] if extra else []
    legend = f"<span style='font-size:0.85em'>{' &nbsp; '.join(words)}</span>"
    # (margin: st.markdown pulls what follows up by 1 rem, for a paragraph's margin this block does not have)
    return f'<div style="margin-bottom:1rem">{head}{stacked_bar(parts, total, mark)}{legend}</div>'


TOKEN_COLORS = {"decode": STATE_COLORS[DECODE], "prefill": STATE_COLORS[PREFILL], "padding": STATE_COLORS[HELD]}


def token_budget_html(split: TokenSplit, budget: int | None, scale: int, made: int | None = None) -> str:
    """This step's tokens against the budget: decode rows, prefill chunks, padding rows (the bar's width: `scale`;
    padding rows take no budget, but they are computed: they show beyond the budget's mark). made: the new tokens
    that came out of them (a prompt chunk computes many tokens and makes one, or none before its last chunk)."""
    parts = [
        ("decode", split.decode, TOKEN_COLORS["decode"]),
        ("prefill", split.prefill, TOKEN_COLORS["prefill"]),
        ("padding", split.padding, TOKEN_COLORS["padding"]),
    ]
    spent = split.decode + split.prefill
    head = f"<b>Tokens computed this step</b>: {spent} of a {budget}-token budget" if budget else (
        f"<b>Tokens computed this step</b>: {spent} (no token budget: whole prompts at once)")  # fmt: skip
    if split.padding:
        head += f", and {split.padding} padding rows for held seats"
    if made is not None:
        head += f"; {made} new token{'' if made == 1 else 's'} came out"
    return bar_block(head, parts, scale, mark=budget)


KV_COLORS = {"stored": "#555555", "reserved": "#d5d5d5", "cached": CACHED_FREE_BLOCK}


def kv_memory_html(kv: dict[str, int], bytes_per_block: float | None = None) -> str:
    """The KV pool at one step as one bar (a simulated card's pool has thousands of blocks: no map)."""
    parts = [
        ("holding tokens", kv["stored"], KV_COLORS["stored"]),
        ("reserved but empty", kv["reserved"], KV_COLORS["reserved"]),
        ("free, cached prefix", kv["cached"], KV_COLORS["cached"]),
    ]
    used = kv["stored"] + kv["reserved"]
    size = ""
    if bytes_per_block:
        gib = lambda blocks: f"{blocks * bytes_per_block / 2**30:,.{1 if blocks * bytes_per_block >= 2**33 else 2}f}"
        size = f" = {gib(used)} of {gib(kv['total'])} GiB"
    head = f"<b>KV memory</b>: {used:,} of {kv['total']:,} blocks in use{size}, {kv['tokens']:,} tokens stored"
    return bar_block(head, parts, max(kv["total"], 1), f"{swatch(FREE_BLOCK)}{kv['free']:,} free")


FIGURE_LABEL = "font-size:0.8em;color:#555;line-height:1.2;overflow-wrap:anywhere"  # wraps, never cut
FIGURE_VALUE_EM = 1.9  # a figure's value, in the label's parent's ems
FIGURE_VALUE = f"font-size:{FIGURE_VALUE_EM}em;line-height:1.15;white-space:nowrap"
# Character widths in Source Sans (Streamlit's font), in its ems, rounded up: digits are tabular (0.5), "%" is wide.
CHAR_EM = {**dict.fromkeys("0123456789", 0.5), "%": 0.84, " ": 0.2, ",": 0.25, ".": 0.25, "–": 0.5}
OTHER_CHAR_EM = 0.55  # a letter (lowercase is narrower; "of", "memory")


def text_em(text: str) -> float:
    """How wide `text` is in Source Sans, in its font's ems (an upper bound for figures' values)."""
    return sum(CHAR_EM.get(c, OTHER_CHAR_EM) for c in text)


def figure_min_em(values: list[str]) -> float:
    """The narrowest a figure's cell may be (in the figures' ems) so that the longest value fits in it: narrower,
    and a nowrap value ran into its neighbour ("100%100%4")."""
    return round(max(map(text_em, values), default=0.5) * FIGURE_VALUE_EM + 0.2, 2)


def figures_html(figures: list[tuple[str, str, str, str]], widest: list[str] | None = None) -> str:
    """A row of big numbers, each (label, value, note under it or "", tooltip): like st.metric, but six fit
    in half a projector's width. A long label wraps onto a second line rather than lose its end; where the row is
    too narrow for every value (a sidebar open beside two panels), the cells wrap onto a second row. widest: the
    widest values the row will show (default: these), so that panels side by side and frame after frame wrap alike."""
    cells = []
    for label, value, note, tip in figures:
        under = f'<div style="font-size:0.75em;color:#555">{escape(note)}</div>' if note else ""
        cells.append(
            f'<div title="{escape(tip)}" style="min-width:0"><div style="{FIGURE_LABEL}">{escape(label)}</div>'
            f'<div style="{FIGURE_VALUE}" data-figure="{escape(label)}">{escape(value)}</div>{under}</div>'
        )
    cell = f"minmax({figure_min_em(widest or [value for _, value, _, _ in figures])}em, 1fr)"
    grid = f"display:grid;grid-template-columns:repeat(auto-fit, {cell});gap:0.45em;margin:0.2em 0 0.6em 0"
    return f'<div style="{grid}">{"".join(cells)}</div>'


HEADLINE_REM = 2.2  # the big numbers: 44 px on a projector (20 px type), in rem so no parent's size shrinks them


def headline_html(label: str, parts: list[tuple[str, ...]], note: str = "", one_line: bool = False) -> str:
    """The view's one big number (or two, side by side): `parts` are (what, value) pairs, e.g.
    [("static", "52%"), ("continuous", "99%")], or (what, value, after) with a few words after the number;
    `note`: a sentence under them (HTML allowed). one_line: the label on the numbers' line, no note (the presenter
    view puts it one click away)."""
    numbers = " &nbsp;·&nbsp; ".join(
        f'<span style="white-space:nowrap">{escape(what)} <b data-headline="{escape(what)}" '
        f'style="font-size:{HEADLINE_REM}rem;line-height:1.1">{escape(value)}</b>'
        f"{escape(''.join(' ' + a for a in after))}</span>"
        for what, value, *after in parts
    )
    box = "border-left:0.35em solid #0072b2;padding:0.2em 0 0.3em 0.7em;margin:0.3em 0 0.6em 0"
    if one_line:
        # (no margin: st.markdown pulls what follows up by 1 rem, so put what follows it in the same markdown)
        return f'<div style="{box};margin:0"><span style="color:#333">{escape(label)}</span> {numbers}</div>'
    under = f'<div style="font-size:0.9em;color:#333;margin-top:0.2em">{note}</div>' if note else ""
    label = f'<div style="font-size:0.95em;color:#333">{escape(label)}</div>'
    return f'<div style="{box}">{label}<div>{numbers}</div>{under}</div>'


CAPTION = "font-size:1rem;line-height:1.4;height:1.4em;white-space:nowrap;overflow:hidden;text-overflow:ellipsis"


def caption_html(label: str, playing: bool, position: int) -> str:
    """Where the player is ("step 158 (of 996 steps: 0–995) · playing"): one line of normal-size text, as tall
    playing or paused (a line that wrapped pushed the charts down mid-play). data-step: the position."""
    state = "playing" if playing else "paused"
    return f'<div data-caption data-step="{position}" style="{CAPTION}">{escape(label)} · {state}</div>'


def frame_html(caption: str, legend: str, panels: str, columns: int) -> str:
    """A player's frame as one block: the caption and the legend on a line (the legend wraps under the caption when
    the line is too short), then the panels side by side, one column each (as st.columns(columns) would lay them)."""
    top = "display:flex;flex-wrap:wrap;align-items:center;column-gap:2rem;row-gap:0.2rem;margin-bottom:0.2rem"
    grid = f"display:grid;grid-template-columns:repeat({columns}, minmax(0, 1fr));gap:1rem"
    block = (f'<div data-frame style="margin-bottom:1rem"><div style="{top}">{caption}{legend}</div>'
             f'<div style="{grid}">{panels}</div></div>')  # fmt: skip
    return block.replace("\n", " ")  # (an HTML block in markdown ends at a blank line: a reply's text may hold one)


def chip(request_id: str, color: str) -> str:
    """A request's id on its colour; never broken across lines ("r1" / "7")."""
    return (
        f'<span style="background:{color};color:{text_on(color)};border-radius:0.3em;padding:0 0.4em;'
        f'margin-right:0.2em;font-weight:600;white-space:nowrap;display:inline-block;line-height:1.3">'
        f"{escape(request_id)}</span>"
    )


def queue_html(waiting: list[str], colors: dict[str, str], length: int | None = None,
               marks: dict[str, str] | None = None) -> str:  # fmt: skip
    """The queue's head as chips; `length`: the whole queue's length, when more are waiting than shown; marks: request
    id -> HTML after its chip (a target it has missed: viz/targets.py)."""
    length, marks = len(waiting) if length is None else length, marks or {}
    if not length:
        return "<div data-queue><b>Waiting queue:</b> empty</div>"
    chips = "".join(chip(rid, colors.get(rid, "#777777")) + marks.get(rid, "") for rid in waiting)
    more = f" … and {length - len(waiting)} more" if length > len(waiting) else ""
    return f"<div data-queue><b>Waiting queue ({length}):</b> {chips}{more}</div>"


def event_html(step: int, event: str) -> str:
    """What happened in the step shown (events.describe), in a line under the seats."""
    return f"<div data-event><b>Step {step}:</b> {escape(event)}</div>"


CHAT_STATUS = {  # a request's status (viz.replies) in the words of a chat window
    "running": "writing…",
    "waiting": "waiting for a seat",
    "preempted": "preempted: back in the queue",
    "held": "done, but its seat is still held",
    "finished (eos)": "done",
    "finished (length)": "cut off at its length limit",
    "finished (aborted)": "stopped: the user hung up",
    "finished (handed-over)": "first token made: handed over to the decode engine",
}


def status_html(status: str) -> str:
    color = "#2a7d2a" if status.startswith("finished") else STATUS_COLORS.get(status, "#777777")
    mark = "✓ " if status == "finished (eos)" else ""
    words = CHAT_STATUS.get(status, status)
    return f'<span title="{escape(status)}" style="color:{color};font-weight:600">{mark}{escape(words)}</span>'


def mask_html(reply) -> str:
    """A constrained reply's mask at this step, after its status: how many tokens it let the model pick from."""
    if reply.allowed is not None:
        allowed, vocab = reply.allowed
        tip = f"this step its constraint's mask left the model {allowed} of its {vocab} tokens to pick from"
        return (f' <span data-allowed title="{escape(tip)}" style="color:#555">· {allowed} of {vocab} tokens '
                "allowed</span>")  # fmt: skip
    if reply.constrained:
        return ' <span data-allowed style="color:#555">· held to a pattern</span>'
    return ""


BUBBLE = "display:inline-block;border-radius:0.8em;padding:0.15em 0.7em;max-width:100%;overflow-wrap:anywhere"


def replies_html(replies, not_arrived: int = 0, max_height: int | None = 380) -> str:
    """A chat window: for each arrived request, the user's prompt in a bubble on the left, the model's reply so far
    in a bubble on the right, and under it where the request stands (writing, waiting for a seat, done...).
    max_height: a scroll box that high (None: as tall as its replies; the live view shows a few, none cut)."""
    rows = []
    for r in replies:
        text = r.text if len(r.text) <= REPLY_TAIL else "…" + r.text[-REPLY_TAIL:]
        text = escape(text) if r.guesses is None else guesses_html(text, *r.guesses)
        rows.append(
            f'<div data-request="{escape(r.id)}" style="display:grid;grid-template-columns:auto minmax(0,1fr) '
            f'minmax(0,1.6fr);gap:0.5em;align-items:start;margin:0.25em 0">'
            f"<div>{chip(r.id, r.color)}</div>"
            f'<div><span data-prompt style="{BUBBLE};background:#eeeeee">{escape(r.prompt)}</span></div>'
            f'<div><span data-reply style="{BUBBLE};background:#e3eef8;font-family:monospace;min-width:2em;'
            f'min-height:1.2em">{text}</span>'
            f'<div style="font-size:0.85em">{status_html(r.status)}{mask_html(r)}{r.service}</div></div></div>'
        )
    more = f"<div style='color:#777'>{not_arrived} more not arrived yet</div>" if not_arrived else ""
    legend = GUESS_LEGEND if any(r.guesses for r in replies) else ""
    scroll = f"max-height:{max_height}px;overflow-y:auto;" if max_height else ""
    return (
        f'<div style="{scroll}font-size:0.9em" data-chat>'
        "<div style='font-weight:600'>The users' chat windows</div>" + legend + "".join(rows) + f"{more}</div>"
    )


KEPT, REJECTED = "color:#1a7a1a;text-decoration:underline 2px", "color:#c03030;text-decoration:line-through"
GUESS_LEGEND = (f"<div style='font-size:0.85em'>speculative decoding, this step: <span style='{KEPT}'>guesses the "
                f"model kept</span>, then its own next token, <span style='{REJECTED}'>guesses it rejected</span>"
                "</div>")  # fmt: skip


def guesses_html(text: str, kept: str, own: str, rejected: str) -> str:
    """The reply with this step's speculation drawn on its end: kept guesses, the model's own token, rejected ones."""
    before = text[: max(0, len(text) - len(kept) - len(own))]
    return (f"{escape(before)}<span data-kept style='{KEPT}'>{escape(kept)}</span>{escape(own)}"
            f"<span data-rejected style='{REJECTED}'>{escape(rejected)}</span>")  # fmt: skip
