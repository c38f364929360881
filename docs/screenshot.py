"""Screenshot the running app with headless chromium, driven over the DevTools protocol (localhost only).

    python docs/screenshot.py http://localhost:8599/?step=300 docs/app.png [--play SECONDS] [--view what-if]

Waits until the app has drawn a frame (a plain --screenshot fires before the engine's first run
is done), optionally presses play for a while, then saves the PNG. Prints the step caption
before and after, so it doubles as a check that playback advances in a real browser.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import subprocess
import time
import urllib.request

from tornado.websocket import websocket_connect

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
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
PLAY_JS = "[...document.querySelectorAll('button')].find(b => b.innerText.includes('play')).click()"


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


async def screenshot(url: str, out: str, play: float, port: int, size: str) -> None:
    browser = subprocess.Popen(
        ["chromium", *CHROMIUM_FLAGS, f"--window-size={size}", f"--remote-debugging-port={port}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        tools = DevTools(await websocket_connect(page_socket(port), max_message_size=64 * 2**20))
        await tools.call("Page.navigate", url=url)
        caption, began = "", time.time()
        deadline = began + 180
        while not caption and time.time() < deadline:  # the first visit waits for the engine runs
            await asyncio.sleep(0.5)
            caption = await tools.evaluate(CAPTION_JS)
        print(f"drawn after {time.time() - began:.1f} s:", caption or "nothing (timed out)")
        while await tools.evaluate(RUNNING_JS):  # a click while the first run finishes would be lost
            await asyncio.sleep(0.3)
        if play:
            await tools.evaluate(PLAY_JS)
            for _ in range(int(play)):  # the caption is blank for a moment while a frame redraws
                await asyncio.sleep(1)
                print("playing:", await tools.evaluate(CAPTION_JS))
        await asyncio.sleep(1.0)  # let the last images land
        shot = await tools.call("Page.captureScreenshot", format="png")
        with open(out, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
    finally:
        browser.terminate()
        browser.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("out")
    parser.add_argument("--play", type=float, default=0, help="seconds to play before the screenshot")
    parser.add_argument("--port", type=int, default=9333, help="chromium's DevTools port")
    parser.add_argument("--size", default="1600,1000", help="browser window, width,height")
    parser.add_argument("--view", default=None, help="the tab to open, e.g. what-if (default: the step player)")
    args = parser.parse_args()
    url = args.url + (("&" if "?" in args.url else "?") + f"view={args.view}" if args.view else "")
    asyncio.run(screenshot(url, args.out, args.play, args.port, args.size))
