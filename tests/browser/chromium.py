"""Headless Chromium driven through the DevTools protocol over a pipe: no WebSocket, no driver binary, no
Python package beyond the standard library.

``--remote-debugging-pipe`` makes Chromium read protocol commands from file descriptor 3 and write replies
and events to descriptor 4, each message JSON ended by a NUL byte (what Puppeteer's ``pipe: true`` uses). A
``sh`` wrapper moves our two pipes from the child's stdin and stdout onto 3 and 4, so nothing runs in the
child between fork and exec (``preexec_fn`` is not safe with the broker threads a test runs).

Only what the dashboard test needs: open a page, evaluate JavaScript, wait for a condition, take a screenshot.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

#: Debian's package installs the browser here (``apt-get install chromium``).
EXECUTABLE = shutil.which("chromium") or "/usr/bin/chromium"
#: Headless, without a sandbox (tests may run as root in a container), and quiet: no update checks, no sync,
#: no first-run pages, nothing fetched from the network but what the page asks for.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
         "--hide-scrollbars", "--mute-audio")


class BrowserError(Exception):
    """The browser refused a command, or did not answer in time."""


class Chromium:
    """One headless browser process with one page."""

    def __init__(self, user_data_dir: Path, log_file: Path, *, width: int = 1366, height: int = 900) -> None:
        command_read, self._command_write = os.pipe()
        self._reply_read, reply_write = os.pipe()
        self._log = log_file.open("wb")
        self.process = subprocess.Popen(
            ["/bin/sh", "-c", 'exec "$@" 3<&0 4>&1 </dev/null >/dev/null', "sh", EXECUTABLE, *FLAGS,
             f"--user-data-dir={user_data_dir}", f"--window-size={width},{height}", "--remote-debugging-pipe",
             "about:blank"],
            stdin=command_read, stdout=reply_write, stderr=self._log,
        )
        os.close(command_read)
        os.close(reply_write)
        self._buffer = b""
        self._ids = 0
        self.width, self.height = width, height
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.page("Page.enable")
        self.page("Runtime.enable")
        self.resize(width, height)

    # ------------------------------------------------------------------------------------------- protocol

    def send(self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None,
             timeout: float = 30.0) -> dict[str, Any]:
        """One command; its result (events that arrive meanwhile are dropped)."""
        self._ids += 1
        message: dict[str, Any] = {"id": self._ids, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._command_write, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._receive(deadline)
            if reply.get("id") != self._ids:
                continue
            if "error" in reply:
                raise BrowserError(f"{method}: {reply['error'].get('message')}")
            return reply.get("result", {})

    def _receive(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrowserError("the browser did not answer in time")
            readable, _, _ = select.select([self._reply_read], [], [], remaining)
            if readable:
                chunk = os.read(self._reply_read, 1 << 20)
                if not chunk:
                    raise BrowserError(f"the browser exited (code {self.process.poll()})")
                self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def page(self, method: str, params: dict[str, Any] | None = None, **options: Any) -> dict[str, Any]:
        """A command to the page's session."""
        return self.send(method, params, session=self.session, **options)

    # ---------------------------------------------------------------------------------------------- pages

    def resize(self, width: int, height: int) -> None:
        self.page("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    def open(self, url: str) -> None:
        self.page("Page.navigate", {"url": url})

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.page("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True})
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 15.0) -> Any:
        """The first truthy value of ``expression``, polled every 100 ms; BrowserError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"still false after {timeout} s: {expression}")
            time.sleep(0.1)

    def screenshot(self, path: Path, *, full_page: bool = True) -> Path:
        """A PNG of the page (its whole height with ``full_page``)."""
        if full_page:
            height = int(self.evaluate("document.documentElement.scrollHeight"))
            self.resize(self.width, max(self.height, height))
        data = self.page("Page.captureScreenshot", {"format": "png"})["data"]
        if full_page:
            self.resize(self.width, self.height)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        with contextlib.suppress(BrowserError, OSError):
            self.send("Browser.close", timeout=5)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        os.close(self._command_write)
        os.close(self._reply_read)
        self._log.close()
