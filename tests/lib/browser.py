"""Headless Chromium (Debian's package) driven over the DevTools protocol with the standard
library only: a WebSocket client of a few lines, a PNG reader to look at screenshot pixels.

    with Chromium(tmp_path) as browser:
        page = browser.open(url)           # navigates and waits for the load event
        page.evaluate("document.title")    # a JSON-able value
        png = page.screenshot()            # bytes
        page.goto(other_url)               # the same tab, elsewhere
        page.problems()                    # failed loads, console errors, uncaught exceptions
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import shutil
import socket
import struct
import subprocess
import time
import zlib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--mute-audio", "--remote-debugging-address=127.0.0.1",
         "--remote-debugging-port=0")


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "no chromium on PATH: scripts/test.sh installs Debian's (apt-get install chromium)"
    return path


class Chromium:
    def __init__(self, workdir: Path, width: int = 1280, height: int = 900) -> None:
        self.profile = workdir / "chromium-profile"
        self.profile.mkdir(parents=True, exist_ok=True)
        self.log = open(workdir / "chromium.log", "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [chromium_path(), *FLAGS, f"--user-data-dir={self.profile}", f"--window-size={width},{height}",
             "about:blank"],
            stdout=self.log, stderr=self.log, start_new_session=True)
        self.port = self._devtools_port(timeout=60)

    def _devtools_port(self, timeout: float) -> int:
        """Chromium writes the port it picked to DevToolsActivePort in the profile."""
        marker = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"chromium exited {self.proc.returncode}; see {self.log.name}")
            with contextlib.suppress(OSError, ValueError, IndexError):
                return int(marker.read_text().splitlines()[0])
            time.sleep(0.05)  # a file another process writes: polled, with a deadline
        raise AssertionError(f"chromium did not open its DevTools port within {timeout}s")

    def _http(self, method: str, path: str) -> Any:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path)
            response = conn.getresponse()
            body = response.read()
            assert response.status == 200, (response.status, body[:200])
            return json.loads(body)
        finally:
            conn.close()

    def open(self, url: str, timeout: float = 60.0, *, width: int = 1280, height: int = 900,
             offline: bool = False) -> Page:
        """A new tab of `width` by `height` CSS pixels, at `url` once its load event fired. With
        `offline`, every request to the network fails at once (file: and data: URLs still load)."""
        target = self._http("PUT", "/json/new?about:blank")
        page = Page(target["webSocketDebuggerUrl"])
        for domain in ("Page", "Network", "Log", "Runtime"):
            page.call(f"{domain}.enable")
        page.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                  mobile=False)
        if offline:
            page.call("Network.emulateNetworkConditions", offline=True, latency=0, downloadThroughput=-1,
                      uploadThroughput=-1)
        page.goto(url, timeout)
        return page

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, 9)
        self.proc.wait(timeout=30)
        self.log.close()

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Page:
    """One tab, over its DevTools WebSocket."""

    def __init__(self, ws_url: str) -> None:
        parts = urlsplit(ws_url)
        self.ws = WebSocket(parts.hostname or "127.0.0.1", parts.port or 80, parts.path)
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, timeout: float = 60.0, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        ident = self._next_id
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self.ws.receive(deadline))
            if message.get("id") == ident:
                assert "error" not in message, (method, message["error"])
                result: dict[str, Any] = message.get("result", {})
                return result
            self.events.append(message)

    def goto(self, url: str, timeout: float = 60.0) -> None:
        """Navigate this tab to `url` and wait for its load event (images included); what the
        previous page reported is forgotten."""
        self.events.clear()
        self.call("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired", timeout)

    def wait_event(self, method: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        for event in self.events:
            if event.get("method") == method:
                return event
        while True:
            message = json.loads(self.ws.receive(deadline))
            self.events.append(message)
            if message.get("method") == method:
                return message

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def screenshot(self, clip: tuple[float, float, float, float] | None = None) -> bytes:
        """The whole page, or the box (x, y, width, height) in CSS pixels: decoding a small
        box's pixels in Python takes milliseconds, the whole page's seconds."""
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": True}
        if clip is not None:
            x, y, width, height = clip
            params["clip"] = {"x": x, "y": y, "width": width, "height": height, "scale": 1}
        return base64.b64decode(self.call("Page.captureScreenshot", **params)["data"])

    def requested_urls(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events
                if e.get("method") == "Network.requestWillBeSent"]

    def problems(self) -> list[str]:
        """What went wrong on the page so far, a line each: a load that failed (with its URL), an
        error on the console, an uncaught exception."""
        urls = {e["params"]["requestId"]: e["params"]["request"]["url"] for e in self.events
                if e.get("method") == "Network.requestWillBeSent"}
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Network.loadingFailed":
                found.append(f"failed load: {urls.get(params['requestId'], '?')}: {params.get('errorText')}")
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                found.append(f"console error: {params['entry']['text']} {params['entry'].get('url', '')}")
            elif method == "Runtime.consoleAPICalled" and params["type"] == "error":
                found.append("console.error: " + " ".join(str(a.get("value", a.get("description")))
                                                          for a in params["args"]))
            elif method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                thrown = details.get("exception", {}).get("description") or details["text"]
                found.append(f"uncaught: {thrown}")
        return found


class WebSocket:
    """RFC 6455, client side, text frames: enough for the DevTools protocol."""

    def __init__(self, host: str, port: int, path: str) -> None:
        self.sock = socket.create_connection((host, port), timeout=30)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            assert chunk, "DevTools closed the connection during the handshake"
            head += chunk
        head, self._buffer = head.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 101"), head[:200]

    def send(self, text: str) -> None:
        payload = text.encode()
        mask = os.urandom(4)
        length = len(payload)
        if length < 126:
            header = struct.pack("!BB", 0x81, 0x80 | length)
        elif length < 2**16:
            header = struct.pack("!BBH", 0x81, 0x80 | 126, length)
        else:
            header = struct.pack("!BBQ", 0x81, 0x80 | 127, length)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + mask + masked)

    def receive(self, deadline: float) -> str:
        """The next whole text message (fragments joined; pings answered)."""
        parts: list[bytes] = []
        while True:
            first, second = self._read(2, deadline)
            opcode, length = first & 0x0F, second & 0x7F
            if length == 126:
                (length,) = struct.unpack("!H", self._read(2, deadline))
            elif length == 127:
                (length,) = struct.unpack("!Q", self._read(8, deadline))
            mask = self._read(4, deadline) if second & 0x80 else b""
            payload = self._read(length, deadline)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            if opcode == 0x9:  # ping
                self.sock.sendall(struct.pack("!BB", 0x8A, 0x80 | len(payload)) + b"\0\0\0\0" + payload)
                continue
            assert opcode != 0x8, "DevTools closed the WebSocket"
            parts.append(payload)
            if first & 0x80:
                return b"".join(parts).decode()

    def _read(self, count: int, deadline: float) -> bytes:
        while len(self._buffer) < count:
            left = deadline - time.monotonic()
            assert left > 0, "no answer from DevTools in time"
            self.sock.settimeout(left)
            chunk = self.sock.recv(1 << 16)
            assert chunk, "DevTools closed the connection"
            self._buffer += chunk
        data, self._buffer = self._buffer[:count], self._buffer[count:]
        return data


# ---------------------------------------------------------------------- PNG pixels
class Png:
    """An 8-bit RGB or RGBA PNG's pixels (what Chromium's screenshots are)."""

    def __init__(self, data: bytes) -> None:
        assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
        pos, idat = 8, b""
        while pos < len(data):
            (length,) = struct.unpack("!I", data[pos:pos + 4])
            kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
            if kind == b"IHDR":
                self.width, self.height, depth, color = struct.unpack("!IIBB", body[:10])
                assert depth == 8 and color in (2, 6), (depth, color)
                self.channels = 3 if color == 2 else 4
            elif kind == b"IDAT":
                idat += body
            pos += 12 + length
        self.rows = self._unfilter(zlib.decompress(idat))

    def _unfilter(self, raw: bytes) -> list[bytearray]:
        stride, bpp = self.width * self.channels, self.channels
        rows: list[bytearray] = []
        previous = bytearray(stride)
        for y in range(self.height):
            kind = raw[y * (stride + 1)]
            row = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
            for i in range(stride):
                left = row[i - bpp] if i >= bpp else 0
                up = previous[i]
                corner = previous[i - bpp] if i >= bpp else 0
                if kind == 1:
                    row[i] = (row[i] + left) & 0xFF
                elif kind == 2:
                    row[i] = (row[i] + up) & 0xFF
                elif kind == 3:
                    row[i] = (row[i] + (left + up) // 2) & 0xFF
                elif kind == 4:
                    p = left + up - corner
                    pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                    row[i] = (row[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 0xFF
            rows.append(row)
            previous = row
        return rows

    def pixel(self, x: int, y: int) -> tuple[int, int, int]:
        row, i = self.rows[y], x * self.channels
        return row[i], row[i + 1], row[i + 2]

    def share_of(self, color: str, tolerance: int = 24) -> float:
        """The share of pixels within `tolerance` of `color` (#rrggbb) in every channel."""
        want = tuple(int(color[i:i + 2], 16) for i in (1, 3, 5))
        near = sum(all(abs(a - b) <= tolerance for a, b in zip(self.pixel(x, y), want, strict=True))
                   for y in range(self.height) for x in range(self.width))
        return near / (self.width * self.height)
