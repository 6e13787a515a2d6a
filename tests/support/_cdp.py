"""A minimal headless-Chromium driver over the DevTools protocol on a pipe (no extra packages).

Chromium started with ``--remote-debugging-pipe`` reads protocol messages from file
descriptor 3 and writes its answers to descriptor 4, each message a JSON object ended by a NUL
byte. :class:`Browser` starts it, opens one page, and offers what the site test needs: load a
URL and wait for it, evaluate JavaScript (awaiting promises), and take a screenshot.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """Path of a Chromium/Chrome executable on PATH (or in ``$GMA_REF_CHROMIUM``), else None."""
    explicit = os.environ.get("GMA_REF_CHROMIUM")
    if explicit:
        return explicit if Path(explicit).exists() else None
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


class BrowserError(RuntimeError):
    """Chromium answered with a protocol error or did not answer in time."""


class Browser:
    """One headless Chromium with one page, driven over ``--remote-debugging-pipe``."""

    def __init__(self, executable: str, width: int = 1400, height: int = 1000, timeout: float = 60.0) -> None:
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def wire_fds() -> None:  # runs in the child before exec: its fd 3 reads, fd 4 writes
            high_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10)  # out of the way of 3 and 4 first
            high_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        args = [
            executable, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
            "--hide-scrollbars", "--mute-audio", "--no-first-run", "--disable-extensions",
            f"--window-size={width},{height}", "about:blank",
        ]
        self._proc = subprocess.Popen(
            args, pass_fds=(3, 4), preexec_fn=wire_fds,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict[str, Any]] = []
        self.timeout = timeout
        target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self._call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self._call("Page.enable", session=True)
        self._call("Runtime.enable", session=True)
        self._call("Emulation.setDeviceMetricsOverride",
                   {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=True)

    # -- protocol ---------------------------------------------------------------------------

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise BrowserError("Chromium did not answer in time")
            chunk = os.read(self._from_child, 1 << 16)
            if not chunk:
                raise BrowserError("Chromium closed the DevTools pipe")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def _call(self, method: str, params: dict[str, Any] | None = None, *, session: bool = False) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self._session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            answer = self._read_message(deadline)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise BrowserError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self._events.append(answer)

    def _wait_event(self, method: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        for i, event in enumerate(self._events):
            if event.get("method") == method:
                return self._events.pop(i)
        while True:
            event = self._read_message(deadline)
            if event.get("method") == method:
                return event
            self._events.append(event)

    # -- what the tests use -----------------------------------------------------------------

    def load(self, url: str) -> None:
        """Navigate to ``url`` and wait for its load event."""
        self._events.clear()
        result = self._call("Page.navigate", {"url": url}, session=True)
        if result.get("errorText"):
            raise BrowserError(f"cannot open {url}: {result['errorText']}")
        self._wait_event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises are awaited)."""
        result = self._call("Runtime.evaluate",
                            {"expression": expression, "awaitPromise": True, "returnByValue": True},
                            session=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"JavaScript error: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: str | Path, full_page: bool = True) -> None:
        """Save a PNG of the page (the whole scroll height when ``full_page``)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
            size = self._call("Page.getLayoutMetrics", session=True)["cssContentSize"]
            params["clip"] = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 12000),
                              "scale": 1}
        data = self._call("Page.captureScreenshot", params, session=True)["data"]
        Path(path).write_bytes(base64.b64decode(data))

    def close(self) -> None:
        """Close the browser and its pipes."""
        try:
            self._call("Browser.close")
        except BrowserError:
            pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        os.close(self._to_child)
        os.close(self._from_child)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
