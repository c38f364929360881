"""What docs/screenshot.py asks the browser and what it makes of the answers: the label, layout and lettering checks,
and the measurements of --measure (the seat charts' share of the first screen, where they sit before and while
playing, and the step each part of a frame shows)."""

from __future__ import annotations

# What the browser drew wider than its box, whatever the element: each text's laid-out extent (a Range's rectangles,
# the whole text even where an ellipsis or a clip hides its end) against the content box of the block it sits in (its
# nearest ancestor that is not inline), and each text field's value (a select box shows its choice in an <input>,
# which has no text node) measured in the field's own font against the field's inner width. Text in a box meant to
# scroll sideways (a code block) and text a screen reader reads but nobody sees (boxes of 2 px or less) are left out.
# Each as "text (needs N px, has M px)".
CUT_LABELS_JS = """(() => {
  const cut = [];
  const px = v => parseFloat(v) || 0;
  const inner = el => {
    const r = el.getBoundingClientRect(), s = getComputedStyle(el);
    const left = r.left + px(s.borderLeftWidth) + px(s.paddingLeft);
    return {left, right: r.right - px(s.borderRightWidth) - px(s.paddingRight)};
  };
  const shown = el => el.getClientRects().length > 0 && getComputedStyle(el).visibility !== 'hidden';
  const scrolls = el => {
    for (let e = el; e && e !== document.body; e = e.parentElement)
      if (['auto', 'scroll'].includes(getComputedStyle(e).overflowX) && e.tagName !== 'BODY' &&
          e.scrollWidth > e.clientWidth + 1 && e.closest('pre, code, [data-testid="stCode"]')) return true;
    return false;
  };
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const text = node.textContent.trim();
    const parent = node.parentElement;
    if (!text || !parent || parent.closest('script, style, noscript, template') || !shown(parent)) continue;
    let box = parent;
    while (box.parentElement && ['inline', 'contents'].includes(getComputedStyle(box).display)) box = box.parentElement;
    if (box.clientWidth <= 2 || scrolls(box)) continue;
    const range = document.createRange();
    range.selectNodeContents(node);
    const rects = [...range.getClientRects()].filter(r => r.width > 0 && r.height > 0);
    if (!rects.length) continue;
    const left = Math.min(...rects.map(r => r.left)), right = Math.max(...rects.map(r => r.right));
    const has = inner(box);
    const needs = Math.ceil(right - left), room = Math.floor(has.right - has.left);
    if (right > has.right + 1 || left < has.left - 1)
      cut.push(`${text.slice(0, 60)} (needs ${needs} px, has ${room} px)`);
  }
  const context = document.createElement('canvas').getContext('2d');
  for (const field of document.querySelectorAll('input:not([type]), input[type="text"], input[type="number"]')) {
    if (!field.value || !shown(field) || field.clientWidth <= 2) continue;
    const s = getComputedStyle(field);
    context.font = `${s.fontStyle} ${s.fontWeight} ${s.fontSize} ${s.fontFamily}`;
    const needs = Math.ceil(context.measureText(field.value).width);
    const has = Math.floor(field.clientWidth - px(s.paddingLeft) - px(s.paddingRight));
    if (needs > has + 1) cut.push(`${field.value.slice(0, 60)} (needs ${needs} px, has ${has} px)`);
  }
  return JSON.stringify([...new Set(cut)]);
})()"""
# Where things fall on the first screen: each picture's box and the painted picture in it (a contained picture can be
# narrower or shorter than its box), its lettering scaled to the screen, and the boxes of the step's event, the queue,
# the play button and the KV map.
LAYOUT_JS = """(() => {
  const box = el => { const r = el.getBoundingClientRect(); return {top: r.top, bottom: r.bottom, height: r.height}; };
  const pictures = [...document.querySelectorAll('img')].filter(i => i.getClientRects().length).map(i => {
    const r = i.getBoundingClientRect(), s = getComputedStyle(i);
    let scale = Math.min(r.width / i.naturalWidth, r.height / i.naturalHeight);  // contain (and fill, near enough)
    if (s.objectFit === 'none' || (s.objectFit === 'scale-down' && scale > 1)) scale = 1;
    const shown = i.naturalHeight * scale, width = i.naturalWidth * scale;
    const top = r.top + (r.height - shown) * (parseFloat(s.objectPosition.split(' ')[1]) || 0) / 100;
    return {alt: i.alt, chart: i.hasAttribute('data-chart'), top, bottom: top + shown, height: shown, width,
            drawn: i.naturalWidth, text_px: i.dataset.textPx ? parseFloat(i.dataset.textPx) * scale : null};
  });
  const first = sel => {
    const e = document.querySelector(sel);
    return e && e.getClientRects().length ? box(e) : null;
  };
  const play = [...document.querySelectorAll('button')].find(b => /^(play|pause)/.test(b.innerText.trim()));
  return JSON.stringify({viewport: [innerWidth, innerHeight], pictures, event: first('[data-event]'),
    queue: first('[data-queue]'), play: play ? box(play) : null, kv_line: first('[data-kv]'),
    kv: pictures.find(p => p.alt.startsWith('KV blocks')) || null});
})()"""


def layout_problems(layout: dict, kv: bool = False) -> list[str]:
    """What --check-layout fails on (the step player in the presenter view): the seat charts must start on the first
    screen and each show at least half its height; the step's event, the queue and the play button must be wholly
    on it, and with kv the KV map too."""
    height = layout["viewport"][1]
    charts = [p for p in layout["pictures"] if p["chart"]]
    problems = [] if charts else ["no seat chart on the page"]
    for chart in charts:
        visible = min(chart["bottom"], height) - max(chart["top"], 0)
        if chart["top"] >= height or visible < height / 2:
            shows = f"shows {max(visible, 0):.0f} px of a {height} px screen (top {chart['top']:.0f})"
            problems.append(f"a seat chart {shows}")
    wanted = {"the step's event": layout["event"], "the queue": layout["queue"], "the play button": layout["play"]}
    if kv:
        wanted["the KV map"] = layout["kv"]
    for what, where in wanted.items():
        if where is None or where["top"] < 0 or where["bottom"] > height + 0.5:
            problems.append(f"{what} is not on the first screen ({where and round(where['top'])} to "
                            f"{where and round(where['bottom'])} of {height} px)")  # fmt: skip
    line = layout.get("kv_line")  # the KV memory's line: wholly on the first screen or wholly under it, never cut
    if line and line["top"] < height - 0.5 and line["bottom"] > height + 0.5:
        problems.append(f"the KV memory line is cut by the bottom edge ({line['top']:.0f} to {line['bottom']:.0f})")
    return problems


def lettering_problems(layout: dict, goal: float) -> list[str]:
    return [f"{p['alt'] or 'a picture'}: lettering {p['text_px']:.1f} px on screen (drawn {p['drawn']} px wide, shown "
            f"{p['width']:.0f}), under {goal:g}" for p in layout["pictures"]
            if p["text_px"] is not None and p["text_px"] < goal - 0.05]  # fmt: skip


# --measure: one reading of the page, taken at one instant (one evaluation: the page does not change during it). The
# seat charts' boxes and the share of the viewport they cover; the step the caption, the transport's slider (the last
# slider in the main column before the frame, as a position: the what-if's counts simulated seconds) and each panel
# shows (data-step: the step its run drew, a simulated run's own; data-position: the player's, as the caption's).
MEASURE_JS = """(() => {
  const [w, h] = [innerWidth, innerHeight];
  const charts = [...document.querySelectorAll('img[data-chart]')].filter(i => i.getClientRects().length).map(i => {
    const r = i.getBoundingClientRect();
    const seen = Math.max(0, Math.min(r.right, w) - Math.max(r.left, 0)) * Math.max(0, Math.min(r.bottom, h) -
      Math.max(r.top, 0));
    return {top: Math.round(r.top), bottom: Math.round(r.bottom), seen};
  });
  const frame = document.querySelector('[data-frame]');
  const sliders = [...document.querySelectorAll('[data-testid="stMain"] [data-testid="stSlider"] input[type=range]')]
    .filter(s => !frame || (s.compareDocumentPosition(frame) & Node.DOCUMENT_POSITION_FOLLOWING));
  const slider = sliders.length ? sliders[sliders.length - 1] : null;
  // (its position: its value in its steps; the what-if player's slider is in simulated seconds, a step of 0.1 s)
  const at = s => Math.round((Number(s.value) - Number(s.min)) / (Number(s.step) || 1));
  const caption = document.querySelector('[data-caption]');
  const int = v => (v === undefined || v === null || v === '') ? null : Number(String(v).replace(/,/g, ''));
  return JSON.stringify({viewport: [w, h], charts_share: charts.reduce((a, c) => a + c.seen, 0) / (w * h),
    chart_tops: charts.map(c => c.top), caption: caption ? int(caption.dataset.step) : null,
    caption_text: caption ? caption.innerText : null, caption_height: caption ? caption.offsetHeight : null,
    slider: slider ? at(slider) : null, slider_value: slider ? Number(slider.value) : null,
    panels: [...document.querySelectorAll('[data-panel]')].map(p => int(p.dataset.step)),
    positions: [...document.querySelectorAll('[data-panel]')].map(p => int(p.dataset.position))});
})()"""


async def measure(evaluate, play_js: str, frames: int = 20, timeout_s: float = 40.0) -> dict:
    """The charts' share of the first screen and their tops before play; then press play and read `frames` frames
    (each time the caption's step changes): what the caption, the slider and each panel show, the charts' tops."""
    import asyncio
    import json
    import time

    before = json.loads(await evaluate(MEASURE_JS))
    await evaluate(play_js)
    seen, last, deadline = [], before["caption"], time.time() + timeout_s
    while len(seen) < frames and time.time() < deadline:
        await asyncio.sleep(0.03)
        now = json.loads(await evaluate(MEASURE_JS))
        if now["caption"] is None or now["caption"] == last:
            continue
        last, began, now["slider_ms"] = now["caption"], time.time(), None
        while time.time() - began < 0.5:  # the slider is its own widget, drawn after the frame's block: how much later
            again = json.loads(await evaluate(MEASURE_JS))
            if again["caption"] != now["caption"]:
                break  # (the next frame came first: a slider a whole frame late)
            if again["slider"] == now["caption"]:
                now["slider_ms"] = round(1000 * (time.time() - began))
                break
            await asyncio.sleep(0.02)
        seen.append(now)
    await evaluate(play_js.replace("'play'", "'pause'"))  # (pause: a page left playing keeps its server busy)
    # (while playing the slider's number is hidden, playback.SLIDER_NUMBER_HIDDEN: the caption says the step)
    agree = [f["slider_ms"] is not None and all(p == f["caption"] for p in f["positions"]) for f in seen]
    return {
        "viewport": before["viewport"],
        "charts_share_of_first_screen": round(before["charts_share"], 3),
        "chart_tops_before_play": before["chart_tops"],
        "chart_tops_while_playing": [f["chart_tops"] for f in seen[:: max(1, len(seen) // 4)]],
        "caption_height_px": sorted({f["caption_height"] for f in [before, *seen]}),
        "frames": [
            {
                "caption": f["caption"],
                "slider_first_read": f["slider"],
                "slider_agrees_after_ms": f["slider_ms"],
                "panels": f["panels"],
                "positions": f["positions"],
            }
            for f in seen
        ],  # fmt: skip
        "frames_all_agree": all(agree) and len(seen) == frames,
        "caption_while_playing": seen[-1]["caption_text"] if seen else None,
    }
