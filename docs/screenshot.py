"""Screenshot the running app with headless chromium, driven over the DevTools protocol (localhost only).

    python docs/screenshot.py http://localhost:8599/?step=300 docs/app.png [--play SECONDS] [--view what-if]
        [--size 1280,720] [--present] [--check-labels]

Waits until the app has drawn a frame (a plain --screenshot fires before the engine's first run
is done), optionally presses play for a while, then saves the PNG (in at most 256 colours: a
screenshot of flat colours and text loses nothing and shrinks several times). Prints the step
caption before and after, so it doubles as a check that playback advances in a real browser.

--size sets the page's viewport exactly (a projector at 1280x720 shows a full-screen browser's page at
that size). --check-labels prints every control, figure or metric label the browser had to cut (text
wider than its box, hidden or ending in an ellipsis) and exits with status 1 if there is one; the test
tests/test_presenter.py runs it when chromium is installed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request

from PIL import Image
from tornado.websocket import websocket_connect

CHROMIUM_FLAGS = [  # the flags this project's machines need (no network, no sandbox for root, no GPU)
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
]
# the player's caption: "step 300 of 993" (the tiny model) or "12.5 s of 75.6 s (simulated)" (the what-if view)
CAPTION_JS = (
    "[...document.querySelectorAll('p')].map(p => p.innerText).find(t => /^(step \\d+|[\\d.]+ s) of/.test(t)) || ''"
)
RUNNING_JS = "document.querySelector('[data-test-script-state]')?.dataset.testScriptState !== 'notRunning'"
# a widget whose code has not loaded yet is drawn as a grey placeholder (a fresh browser profile loads each one once)
LOADING_JS = "document.querySelectorAll('[data-testid=\"stSkeleton\"]').length"
PLAY_JS = "[...document.querySelectorAll('button')].find(b => b.innerText.includes('play')).click()"
# Text the browser cut: a label, a button's text, a select box's value, a figure's label, wider than the box that
# clips it (overflow hidden or an ellipsis). Each as "text (needs N px, has M px)".
CUT_LABELS_JS = """(() => {
  const cut = [];
  const boxes = document.querySelectorAll(
    'label, label *, button *, [data-baseweb="select"] *, [data-testid="stMetricLabel"] *, ' +
    '[data-testid="stMetricValue"] *, [data-figure], [data-headline], [data-testid="stExpander"] summary *, ' +
    '[data-testid="stTab"] *, [data-testid="stCaptionContainer"] *');
  for (const el of boxes) {
    const text = (el.innerText || '').trim();
    if (!text || el.children.length > 1 || el.offsetParent === null || el.clientWidth <= 2) continue;  // (<= 2 px:
    // text for screen readers only, hidden on purpose)
    const style = getComputedStyle(el);
    const clips = style.overflow !== 'visible' || style.overflowX !== 'visible' || style.textOverflow === 'ellipsis';
    if (clips && el.scrollWidth > el.clientWidth + 1)
      cut.push(`${text.slice(0, 60)} (needs ${el.scrollWidth} px, has ${el.clientWidth} px)`);
  }
  return JSON.stringify([...new Set(cut)]);
})()"""


class DevTools:
    def __init__(self, socket):
        self.socket, self.next_id = socket, 0

    async def call(self, method: str, **params) -> dict:
        self.next_id += 1
        await self.socket.write_message(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:  # events arrive in between: skip them until our answer comes
            reply = json.loads(await self.socket.read_message())
            if reply.get("id") == self.next_id:
                return reply.get("result", {})

    async def evaluate(self, expression: str):
        return (await self.call("Runtime.evaluate", expression=expression))["result"].get("value")


def page_socket(port: int) -> str:
    for _ in range(100):
        try:
            with urllib.request.urlopen(f"http://localhost:{port}/json") as answer:
                return next(t for t in json.load(answer) if t["type"] == "page")["webSocketDebuggerUrl"]
        except (OSError, StopIteration):
            time.sleep(0.2)
    raise SystemExit("chromium did not open its DevTools port")


def small_png(png: bytes) -> bytes:
    """The screenshot in at most 256 colours (flat colours and text: nothing visible is lost)."""
    image = Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    buffer = io.BytesIO()
    image.save(buffer, "PNG", optimize=True)
    return buffer.getvalue()


async def open_page(tools: DevTools, url: str, size: str) -> None:
    """Open `url` in a viewport of exactly `size` and wait until the app has drawn and stopped running."""
    width, height = (int(v) for v in size.split(","))
    await tools.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                     mobile=False)  # fmt: skip
    await tools.call("Page.navigate", url=url)
    caption, began = "", time.time()
    deadline = began + 180
    while not caption and time.time() < deadline:  # the first visit waits for the engine runs
        await asyncio.sleep(0.5)
        caption = await tools.evaluate(CAPTION_JS)
    print(f"drawn after {time.time() - began:.1f} s:", caption or "nothing (timed out)")
    while await tools.evaluate(RUNNING_JS):  # a click while the first run finishes would be lost
        await asyncio.sleep(0.3)
    for _ in range(100):
        if not await tools.evaluate(LOADING_JS):
            break
        await asyncio.sleep(0.3)
    await asyncio.sleep(1.5)  # let the last fragments and images land


async def screenshot(url: str, out: str | None, play: float, port: int, size: str, check_labels: bool) -> int:
    if shutil.which("chromium") is None:
        raise SystemExit("no chromium here: apt-get install -y chromium (Debian), or your system's package")
    profile = tempfile.mkdtemp(prefix="minillm-chromium-")  # a fresh, empty profile every time
    browser = subprocess.Popen(
        ["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={size}",
         f"--remote-debugging-port={port}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        tools = DevTools(await websocket_connect(page_socket(port), max_message_size=64 * 2**20))
        await open_page(tools, url, size)
        if play:
            await tools.evaluate(PLAY_JS)
            for _ in range(int(play)):  # the caption is blank for a moment while a frame redraws
                await asyncio.sleep(1)
                print("playing:", await tools.evaluate(CAPTION_JS))
            await asyncio.sleep(1.0)
        status = 0
        if check_labels:
            cut = json.loads(await tools.evaluate(CUT_LABELS_JS))
            print(f"{len(cut)} cut label(s) at {size}" + "".join(f"\n  {c}" for c in cut))
            status = 1 if cut else 0
        if out:
            shot = await tools.call("Page.captureScreenshot", format="png")
            with open(out, "wb") as f:
                f.write(small_png(base64.b64decode(shot["data"])))
        return status
    finally:
        browser.terminate()
        browser.wait()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("out", nargs="?", default=None, help="the PNG to write (none: only --check-labels)")
    parser.add_argument("--play", type=float, default=0, help="seconds to play before the screenshot")
    parser.add_argument("--port", type=int, default=9333, help="chromium's DevTools port")
    parser.add_argument("--size", default="1600,1000", help="the page's viewport, width,height")
    parser.add_argument("--view", default=None, help="the tab to open, e.g. what-if (default: the step player)")
    parser.add_argument("--present", action="store_true", help="the presenter view (?present=1)")
    parser.add_argument("--check-labels", action="store_true", help="list the labels the browser cut; exit 1 if any")
    args = parser.parse_args()
    url = args.url
    for flag, value in (("view", args.view), ("present", "1" if args.present else None)):
        if value:
            url += ("&" if "?" in url else "?") + f"{flag}={value}"
    raise SystemExit(asyncio.run(screenshot(url, args.out, args.play, args.port, args.size, args.check_labels)))
