"""Screenshot the running app with headless chromium, driven over the DevTools protocol (localhost only).

    python docs/screenshot.py http://localhost:8599/?step=300 docs/app.png [--play SECONDS] [--view what-if]
        [--size 1280,720] [--present] [--press KEY ...] [--open LABEL] [--check-labels] [--check-layout [--kv]]
        [--check-lettering [PX]] [--measure]

Waits until the app has drawn a frame (a plain --screenshot fires before the engine's first run
is done), optionally presses play for a while, then saves the PNG (in at most 256 colours: a
screenshot of flat colours and text loses nothing and shrinks several times). Prints the step
caption before and after, so it doubles as a check that playback advances in a real browser.
A page that is not a Streamlit app (a file:// page the tests build) is read once it has loaded.

--size sets the page's viewport exactly (a projector at 1280x720 shows a full-screen browser's page at that size).
--press sends keys to the page (Space, ArrowRight, ...: what a presenter's clicker sends) and prints the caption after
each; --open clicks the button (a popover) whose text starts with LABEL before the checks. Each check prints what it
measured and makes the exit status 1 when it fails (tests/test_presenter.py runs them where chromium is installed):
  --check-labels     every text the browser drew wider than its box (cut, ellipsized, or running into the next one),
                     and every input (a select box's value) too narrow for its text
  --check-layout     the step player's first screen: both seat charts start on it and each shows at least half the
                     viewport's height, the step's event, the queue and the play button are on it (--kv: the KV map)
  --check-lettering  every picture marked with its lettering (data-text-px): its letters on screen, scaled by the
                     width the browser shows it at, are at least PX px (default 14 in --present, else 10)
--measure prints one line "measure: {JSON}" (screenshot_checks.measure): the seat charts' share of the first screen,
their tops before and while playing, and for 20 frames of play the position of the caption, the slider and each panel
(and each panel's step): the step player's, or with --view what-if the crowd's (its slider counts simulated seconds).
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
from screenshot_checks import CUT_LABELS_JS, LAYOUT_JS, layout_problems, lettering_problems, measure
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
# the player's caption: "step 300 (of 996 steps: 0–995)" (the tiny model), "12.5 s of 75.6 s (simulated)" (what-if),
# or the live view's "step 2,971 · the last 300 steps ..." ("engine idle for 5 s · ..." once the load has stopped)
CAPTION_JS = (  # (the step player's caption is marked data-caption; the live view's is a paragraph)
    "[...document.querySelectorAll('[data-caption], p')].map(p => p.innerText)"
    ".find(t => /^(step \\d+ \\(of|[\\d.]+ s of|step [\\d,]+ · the last|engine idle)/.test(t)) || ''"
)
RUNNING_JS = "document.querySelector('[data-test-script-state]')?.dataset.testScriptState !== 'notRunning'"
STREAMLIT_JS = "!!document.getElementById('root')"  # (a Streamlit page draws into #root; a plain page has none)
LOADED_JS = "document.readyState === 'complete'"
# a widget whose code has not loaded yet is drawn as a grey placeholder (a fresh browser profile loads each one once)
LOADING_JS = "document.querySelectorAll('[data-testid=\"stSkeleton\"]').length"
PLAY_JS = "[...document.querySelectorAll('button')].find(b => b.innerText.includes('play')).click()"
OPEN_JS = (  # (the button's text: a popover's icon is a ligature's name, "info", before its label)
    "(b => b ? (b.click(), true) : false)([...document.querySelectorAll('button')]"
    ".find(b => b.innerText.replace(/^[a-z_]+\\n/, '').trim().startsWith(%s)))"
)


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
    """The screenshot in at most 256 colours: its 256 commonest, exactly (the flat colours of swatches, charts and
    chips; a median cut once painted prefill's orange swatch as a chip's yellow), the rest (text's anti-aliasing)
    mapped to the nearest of them."""
    image = Image.open(io.BytesIO(png)).convert("RGB")
    common = sorted(image.getcolors(image.width * image.height), reverse=True)[:256]
    palette = Image.new("P", (1, 1))
    palette.putpalette([channel for _, color in common for channel in color])
    buffer = io.BytesIO()
    image.quantize(palette=palette, dither=Image.Dither.NONE).save(buffer, "PNG", optimize=True)
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
        if not caption and await tools.evaluate(LOADED_JS) and not await tools.evaluate(STREAMLIT_JS):
            print("a plain page, loaded")
            return
    print(f"drawn after {time.time() - began:.1f} s:", caption or "nothing (timed out)")
    while await tools.evaluate(RUNNING_JS):  # a click while the first run finishes would be lost
        await asyncio.sleep(0.3)
    for _ in range(100):
        if not await tools.evaluate(LOADING_JS):
            break
        await asyncio.sleep(0.3)
    await asyncio.sleep(1.5)  # let the last fragments and images land


KEYS = {
    "Space": (" ", 32),
    "ArrowRight": ("ArrowRight", 39),
    "ArrowLeft": ("ArrowLeft", 37),
    "Home": ("Home", 36),
    "PageUp": ("PageUp", 33),
    "PageDown": ("PageDown", 34),
}


async def press(tools: DevTools, name: str) -> None:
    """One key, pressed and released, on the page (nothing focused: a clicker's key goes to the page)."""
    key, code = KEYS[name]
    await tools.evaluate("document.activeElement && document.activeElement.blur()")
    for kind in ("keyDown", "keyUp"):
        text = " " if name == "Space" and kind == "keyDown" else ""
        await tools.call("Input.dispatchKeyEvent", type=kind, key=key, code=name, windowsVirtualKeyCode=code,
                         nativeVirtualKeyCode=code, text=text)  # fmt: skip


async def screenshot(url: str, out: str | None, args) -> int:
    if shutil.which("chromium") is None:
        raise SystemExit("no chromium here: apt-get install -y chromium (Debian), or your system's package")
    profile = tempfile.mkdtemp(prefix="minillm-chromium-")  # a fresh, empty profile every time
    browser = subprocess.Popen(
        ["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={args.size}",
         f"--remote-debugging-port={args.port}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        tools = DevTools(await websocket_connect(page_socket(args.port), max_message_size=64 * 2**20))
        await open_page(tools, url, args.size)
        if args.play:
            await tools.evaluate(PLAY_JS)
            for _ in range(int(args.play)):  # the caption is blank for a moment while a frame redraws
                await asyncio.sleep(1)
                print("playing:", await tools.evaluate(CAPTION_JS))
            await asyncio.sleep(1.0)
        for key in args.press:
            await press(tools, key)
            await asyncio.sleep(1.5)
            print(f"after {key}:", await tools.evaluate(CAPTION_JS))
        if args.open:
            opened = await tools.evaluate(OPEN_JS % json.dumps(args.open))
            print(f"opened {args.open!r}" if opened else f"no button {args.open!r} to open")
            await asyncio.sleep(1.0)
        if args.measure:
            print("measure:", json.dumps(await measure(tools.evaluate, PLAY_JS)))
        problems = []
        if args.check_labels:
            cut = json.loads(await tools.evaluate(CUT_LABELS_JS))
            print(f"{len(cut)} cut label(s) at {args.size}" + "".join(f"\n  {c}" for c in cut))
            problems += cut
        if args.check_layout or args.check_lettering is not None:
            layout = json.loads(await tools.evaluate(LAYOUT_JS))
            for picture in layout["pictures"]:
                lettering = "" if picture["text_px"] is None else f", lettering {picture['text_px']:.1f} px"
                print(f"picture {picture['alt'][:40]!r}: top {picture['top']:.0f}, height {picture['height']:.0f}, "
                      f"width {picture['width']:.0f} (drawn {picture['drawn']}){lettering}")  # fmt: skip
            found = []
            if args.check_layout:
                found += layout_problems(layout, args.kv)
            if args.check_lettering is not None:
                goal = args.check_lettering or (14 if args.present else 10)
                found += lettering_problems(layout, goal)
            print(f"{len(found)} layout problem(s) at {args.size}" + "".join(f"\n  {f}" for f in found))
            problems += found
        if out:
            shot = await tools.call("Page.captureScreenshot", format="png")
            with open(out, "wb") as f:
                f.write(small_png(base64.b64decode(shot["data"])))
        return 1 if problems else 0
    finally:
        browser.terminate()
        browser.wait()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("out", nargs="?", default=None, help="the PNG to write (none: only the checks)")
    parser.add_argument("--play", type=float, default=0, help="seconds to play before the screenshot")
    parser.add_argument("--port", type=int, default=9333, help="chromium's DevTools port")
    parser.add_argument("--size", default="1600,1000", help="the page's viewport, width,height")
    parser.add_argument("--view", default=None, help="the tab to open, e.g. what-if (default: the step player)")
    parser.add_argument("--present", action="store_true", help="the presenter view (?present=1)")
    parser.add_argument("--press", action="append", default=[], choices=list(KEYS), help="a key to press (repeat)")
    parser.add_argument("--open", default=None, help="click the button whose text starts with this (a popover)")
    parser.add_argument("--check-labels", action="store_true", help="list the texts the browser cut; exit 1 if any")
    parser.add_argument("--check-layout", action="store_true", help="the step player's first screen (docstring)")
    parser.add_argument("--measure", action="store_true", help="print the charts' share, tops, 20 frames (JSON)")
    parser.add_argument("--kv", action="store_true", help="with --check-layout: the KV map on the first screen too")
    parser.add_argument(
        "--check-lettering",
        type=float,
        nargs="?",
        const=0,
        default=None,
        metavar="PX",
        help="pictures' lettering on screen at least PX px (default 14 presenter, 10 normal)",
    )
    args = parser.parse_args()
    url = args.url
    for flag, value in (("view", args.view), ("present", "1" if args.present else None)):
        if value:
            url += ("&" if "?" in url else "?") + f"{flag}={value}"
    raise SystemExit(asyncio.run(screenshot(url, args.out, args)))
