"""Small HTML snippets for the app: colour legends, the waiting queue, the users' replies."""

from __future__ import annotations

from html import escape

from viz.colors import FREE_BLOCK, STATE_COLORS, STATE_NAMES

REPLY_TAIL = 180  # characters of a long reply kept on screen: the end is where the typing happens
STATUS_COLORS = {"running": "#0072b2", "held": "#b03030", "waiting": "#777777", "preempted": "#d55e00"}


def swatch(color: str, border: str = "#999999") -> str:
    return (
        f'<span style="display:inline-block;width:0.9em;height:0.9em;background:{color};'
        f'border:1px solid {border};vertical-align:middle;margin-right:0.3em"></span>'
    )


def occupancy_legend() -> str:
    items = [f"{swatch(STATE_COLORS[c])}{STATE_NAMES[c]}" for c in (1, 2, 3, 0)]
    return '<div style="font-size:0.95em">' + " &nbsp; ".join(items) + "</div>"


def kv_legend() -> str:
    return (
        f'<div style="font-size:0.85em;color:#444">{swatch("#555555")}tokens stored (a colour per request) &nbsp; '
        f"{swatch('#d5d5d5')}reserved but empty &nbsp; {swatch(FREE_BLOCK)}free</div>"
    )


def chip(request_id: str, color: str) -> str:
    return (
        f'<span style="background:{color};color:white;border-radius:0.3em;padding:0.05em 0.4em;'
        f'margin-right:0.2em;font-weight:600">{escape(request_id)}</span>'
    )


def queue_html(waiting: list[str], colors: dict[str, str]) -> str:
    if not waiting:
        return "<div><b>Waiting queue:</b> empty</div>"
    chips = "".join(chip(rid, colors.get(rid, "#777777")) for rid in waiting)
    return f"<div><b>Waiting queue ({len(waiting)}):</b> {chips}</div>"


def status_html(status: str) -> str:
    color = "#2a7d2a" if status.startswith("finished") else STATUS_COLORS.get(status, "#777777")
    mark = "✓ " if status.startswith("finished") else ""
    return f'<span style="color:{color};font-weight:600">{mark}{escape(status)}</span>'


def replies_html(replies, not_arrived: int = 0, max_height: int = 380) -> str:
    """One row per arrived request: who, where it stands, its prompt, and the reply so far."""
    rows = []
    for r in replies:
        text = r.text if len(r.text) <= REPLY_TAIL else "…" + r.text[-REPLY_TAIL:]
        rows.append(
            f"<tr><td>{chip(r.id, r.color)}</td><td>{status_html(r.status)}</td>"
            f"<td><code>{escape(r.prompt)}</code></td><td style='font-family:monospace'>{escape(text)}</td></tr>"
        )
    more = f"<div style='color:#777'>{not_arrived} more not arrived yet</div>" if not_arrived else ""
    return (
        f'<div style="max-height:{max_height}px;overflow-y:auto;font-size:0.9em">'
        "<table style='width:100%'><tr><th>user</th><th>status</th><th>prompt</th><th>reply so far</th></tr>"
        + "".join(rows)
        + f"</table>{more}</div>"
    )
