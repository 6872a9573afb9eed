"""Screenshot of the web page answering a question, for docs/ (issue #35: the first ten minutes).

Starts `freetoken serve` (the default model unless --model), opens the page in the system's
Chromium under Playwright (the web-test extra), asks QUESTION at temperature 0, waits for the
answer, saves a PNG and prints the time to the first streamed character as the page saw it.

    .venv/bin/python tools/page_screenshot.py --out docs/images/web-page.png
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx

QUESTION = "Write a Python function that returns the sum of a list."
# the text of the last assistant bubble without its role label
LAST = ("(() => { const m = [...document.querySelectorAll('#messages .msg.assistant')].pop();"
        " if (!m) return ''; const c = m.cloneNode(true); c.querySelector('.role')?.remove();"
        " return c.textContent.trim() })()")


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"page_screenshot: the server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    sys.exit("page_screenshot: the server did not become ready in time")


def ask(pg, question: str) -> float:
    """Type the question, send it, return seconds from the click to the first answer text."""
    pg.click("#chat-options summary")
    pg.fill("#temperature", "0")
    pg.fill("#prompt", question)
    t0 = time.monotonic()
    pg.click("#send")
    while not pg.evaluate(f"{LAST}.length > 0"):
        time.sleep(0.01)
    first = time.monotonic() - t0
    while pg.evaluate("!document.querySelector('#stop').disabled"):
        time.sleep(0.1)
    return first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/images/web-page.png")
    ap.add_argument("--model", default=None)
    ap.add_argument("--port", type=int, default=8765)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright
    cmd = [str(Path(sys.executable).parent / "freetoken"), "serve", "--port", str(args.port)]
    cmd += ["--model", args.model] if args.model else []
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{args.port}"
    try:
        wait_ready(url, proc)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=shutil.which("chromium"), headless=True)
            pg = browser.new_page(viewport={"width": 1400, "height": 1000})
            pg.goto(url + "/")
            pg.wait_for_selector("#model-name:not(:empty)")
            first = ask(pg, QUESTION)
            time.sleep(2.5)                     # one dashboard poll after the answer
            pg.screenshot(path=args.out, full_page=True)
            answer = pg.evaluate(LAST)
            browser.close()
        print(f"first text after {first:.2f} s; screenshot: {args.out}\n--- answer ---\n{answer}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
