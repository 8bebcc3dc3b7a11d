"""The Observer in a real selector loop shaped like the supervisor's: the metrics file and the
endpoint read by prometheus_client's parser, a real HTTP client, slow and oversized clients."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import pytest
from full_snapshot import NOW, snapshot
from prometheus_client.parser import text_string_to_metric_families

from esiwrap.core.snapshot import Snapshot
from esiwrap.shell.endpoint import HttpEndpoint, Page
from esiwrap.shell.log import capture_logs
from esiwrap.shell.observe import Observer, ObserveSettings

T = TypeVar("T")


class Loop:
    """One thread, one selector, callables as key.data, the Observer's next_wake bounding select
    and its tick after every wake: the supervisor's loop, with a way to run calls inside it."""

    def __init__(self, settings: ObserveSettings) -> None:
        self.selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = \
            queue.SimpleQueue()
        self.selector.register(self._wake_r, selectors.EVENT_READ, self._on_wake)
        self.observer = Observer(self.selector, settings)
        self.wakes = 0
        self.timeouts: list[float | None] = []
        self._stopping = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def call(self, fn: Callable[[], T]) -> T:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._calls.put((fn, future))
        self._wake_w.send(b"x")
        return future.result(timeout=10)

    def _on_wake(self, _: selectors.SelectorKey) -> None:
        self._wake_r.recv(512)
        while not self._calls.empty():
            fn, future = self._calls.get()
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

    def _run(self) -> None:
        while not self._stopping:
            mono = time.monotonic()
            wake = self.observer.next_wake(mono)
            timeout = None if wake is None else max(0.0, wake - mono)
            self.timeouts.append(timeout)
            for key, _ in self.selector.select(timeout):
                key.data(key)
            self.wakes += 1
            self.observer.tick(time.monotonic())

    def stop(self) -> None:
        def leave() -> None:
            self._stopping = True
            self.observer.close()

        self.call(leave)
        self._thread.join(timeout=10)
        self.selector.close()
        self._wake_r.close()
        self._wake_w.close()


@pytest.fixture
def loop_with() -> Iterator[Callable[[ObserveSettings], Loop]]:
    loops: list[Loop] = []

    def start(settings: ObserveSettings) -> Loop:
        loops.append(Loop(settings))
        return loops[-1]

    yield start
    for loop in loops:
        loop.stop()


def get(url_host: tuple[str, int], path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(*url_host, timeout=10)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def parse(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_endpoint_and_file_agree_and_parse(
        loop_with: Callable[[ObserveSettings], Loop], tmp_path: Path) -> None:
    """GET /metrics and the metrics file: both parse, with the snapshot's values; the endpoint
    computes time-dependent figures at the scrape, the file at the snapshot."""
    metrics_file = tmp_path / "esiwrap.prom"
    loop = loop_with(ObserveSettings(metrics_file=str(metrics_file), metrics_port=0))
    assert loop.observer.endpoint is not None
    address = loop.observer.endpoint.address
    assert address[0] == "127.0.0.1"  # loopback unless --metrics-address widens it
    now = time.time()
    current = replace(snapshot(), time=now, deadline_at=now + 600)
    loop.call(lambda: loop.observer.update(current))

    status, headers, body = get(address, "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    served = parse(body.decode())
    from_file = parse(metrics_file.read_text())
    for fams in (served, from_file):
        deadline = fams["esiwrap_deadline_timestamp_seconds"].samples[0]
        assert deadline.labels["source"] == "volcengine" and deadline.value == current.deadline_at
        assert fams["esiwrap_saves_completed"].samples[0].value == 2
    file_remaining = from_file["esiwrap_deadline_remaining_seconds"].samples[0].value
    served_remaining = served["esiwrap_deadline_remaining_seconds"].samples[0].value
    assert file_remaining == pytest.approx(600.0) and served_remaining <= file_remaining

    status, headers, body = get(address, "/status")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert Snapshot.from_json(body) == current
    assert get(address, "/")[0] == 200
    assert get(address, "/nothing-here")[0] == 404
    status, headers, _ = get(address, "/metrics", method="POST")
    assert status == 405 and headers["Allow"] == "GET, HEAD"
    status, headers, body = get(address, "/metrics", method="HEAD")
    assert status == 200 and body == b"" and int(headers["Content-Length"]) > 0


def test_no_snapshot_yet_is_503(loop_with: Callable[[ObserveSettings], Loop]) -> None:
    """Scraped before the supervisor's first snapshot: unavailable, not an empty 200."""
    loop = loop_with(ObserveSettings(metrics_port=0))
    assert loop.observer.endpoint is not None
    assert get(loop.observer.endpoint.address, "/metrics")[0] == 503


def raw_exchange(address: tuple[str, int], data: bytes, timeout: float = 10.0) -> bytes:
    """Send `data` as is, read until the server closes."""
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_oversized_and_malformed_requests(loop_with: Callable[[ObserveSettings], Loop]) -> None:
    """A request head over 8 KiB gets 431, garbage gets 400; the answer arrives intact although
    the client sent more than was read (the server drains before closing)."""
    loop = loop_with(ObserveSettings(metrics_port=0))
    assert loop.observer.endpoint is not None
    address = loop.observer.endpoint.address
    huge = b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"a" * 20000 + b"\r\n\r\n"
    assert raw_exchange(address, huge).startswith(b"HTTP/1.1 431 ")
    assert raw_exchange(address, b"HELLO\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert raw_exchange(address, b"GET /metrics\r\n\r\n").startswith(b"HTTP/1.1 400 ")  # HTTP/0.9
    loop.call(lambda: loop.observer.update(snapshot()))
    ok = raw_exchange(address, b"GET /metrics?x=1 HTTP/1.0\n\n")  # bare newlines, a query string
    assert ok.startswith(b"HTTP/1.1 200 ") and b"esiwrap_phase" in ok


def test_slow_clients_time_out_without_blocking_the_loop(tmp_path: Path) -> None:
    """Idle connections hold nothing up: a real request is answered while they wait, each is
    closed when its time is up, and the loop wakes for that (next_wake), not in a busy poll."""
    selector = selectors.DefaultSelector()
    answered: list[str] = []

    def pages(path: str) -> Page | None:
        answered.append(path)
        return Page("text/plain", b"ok\n")

    server = HttpEndpoint(selector, "127.0.0.1", 0, pages, timeout_s=0.5)
    try:
        idle = [socket.create_connection(server.address, timeout=10) for _ in range(5)]
        half = socket.create_connection(server.address, timeout=10)
        half.sendall(b"GET /metr")  # a request that never ends
        result: dict[str, Any] = {}

        def client() -> None:
            result["response"] = raw_exchange(server.address, b"GET /x HTTP/1.1\r\n\r\n")

        requester = threading.Thread(target=client)
        requester.start()
        wakes = 0
        started = time.monotonic()
        while (server.open_connections or requester.is_alive()) and time.monotonic() - started < 60:
            mono = time.monotonic()
            wake = server.next_wake()
            # whatever is open was accepted before now: its time is up timeout_s after that at most
            assert wake is None or wake <= mono + 0.5
            for key, _ in selector.select(None if wake is None else max(0.0, wake - mono)):
                key.data(key)
            server.expire(time.monotonic())
            wakes += 1
        requester.join(timeout=10)
        assert result["response"].startswith(b"HTTP/1.1 200 ") and answered == ["/x"]
        assert server.open_connections == 0 and server.next_wake() is None
        assert time.monotonic() - started > 0.4  # the idle ones were held for their timeout_s
        assert wakes < 40, f"{wakes} wake-ups: the loop polled"
        for sock in [*idle, half]:
            sock.settimeout(5)
            assert sock.recv(100) == b""  # closed by the server, with nothing said
            sock.close()
    finally:
        server.close()
        selector.close()


def test_connections_over_the_limit_make_room_by_closing_the_oldest() -> None:
    """A flood of connections is bounded: past max_connections, the oldest connection that has not
    finished its request is closed to make room for the new one."""
    selector = selectors.DefaultSelector()
    server = HttpEndpoint(selector, "127.0.0.1", 0, lambda path: None, max_connections=2)
    socks = [socket.create_connection(server.address, timeout=10) for _ in range(4)]
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until every connection is accepted: nothing left to do
            ready = selector.select(0.2 if server.open_connections == 2 else 1.0)
            if not ready and server.open_connections == 2:
                break
            for key, _ in ready:
                key.data(key)
        assert server.open_connections == 2
        for sock in socks[:2]:
            sock.settimeout(5)
            assert sock.recv(10) == b""
    finally:
        for sock in socks:
            sock.close()
        server.close()
        selector.close()


def test_port_in_use_is_a_one_line_usage_error() -> None:
    """Two esiwraps asking for one port: the second is told which port and what to do."""
    from esiwrap.errors import UsageError

    selector = selectors.DefaultSelector()
    first = HttpEndpoint(selector, "127.0.0.1", 0, lambda path: None)
    try:
        with pytest.raises(UsageError, match=r"--metrics-port \d+: 127\.0\.0\.1:\d+ is already in use"):
            HttpEndpoint(selector, "127.0.0.1", first.address[1], lambda path: None)
        with pytest.raises(UsageError, match=r"192\.0\.2\.1: not an address of this machine"):
            HttpEndpoint(selector, "192.0.2.1", 0, lambda path: None)
    finally:
        first.close()
        selector.close()


def test_files_are_rewritten_only_on_change_and_step_noise_is_throttled(tmp_path: Path) -> None:
    """A new phase or deadline is written at once; a new step number only after min_interval_s
    (the loop is woken for it by next_wake); the same text is never rewritten."""
    selector = selectors.DefaultSelector()
    status_file, metrics_file = tmp_path / "s.json", tmp_path / "m.prom"
    observer = Observer(selector, ObserveSettings(status_file=str(status_file),
                                                  metrics_file=str(metrics_file), min_interval_s=5.0))
    try:
        first = snapshot()
        observer.update(first, mono=100.0)
        inode = os.stat(metrics_file).st_ino
        assert Snapshot.from_json(status_file.read_text()) == first
        assert observer.next_wake(100.0) is None

        observer.update(first, mono=101.0)  # the same snapshot: nothing written
        observer.update(replace(first, time=NOW + 0.5), mono=101.0)  # only later: not a change
        assert os.stat(metrics_file).st_ino == inode
        assert Snapshot.from_json(status_file.read_text()).time == NOW

        stepped = replace(first, time=NOW + 1, last_step=1301, work_at_risk_s=363.5)
        observer.update(stepped, mono=101.0)
        assert os.stat(metrics_file).st_ino == inode  # held back...
        assert observer.next_wake(101.0) == 105.0  # ...until here
        observer.tick(104.9)
        assert os.stat(metrics_file).st_ino == inode
        observer.tick(105.0)
        assert Snapshot.from_json(status_file.read_text()) == stepped
        assert os.stat(metrics_file).st_ino != inode and observer.next_wake(105.0) is None
        inode = os.stat(metrics_file).st_ino

        requested = replace(stepped, time=NOW + 2, phase="save_requested")
        observer.update(requested, mono=105.5)  # what people act on: at once
        assert json.loads(status_file.read_text())["phase"] == "save_requested"
        assert os.stat(metrics_file).st_ino != inode
        families = {f.name: f for f in text_string_to_metric_families(metrics_file.read_text())}
        phase = {s.labels["phase"]: s.value for s in families["esiwrap_phase"].samples}
        assert phase["save_requested"] == 1.0
        assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no temporary left
    finally:
        observer.close()
        selector.close()
    assert not status_file.exists() and not metrics_file.exists()  # gone with esiwrap


def test_a_file_that_cannot_be_written_is_logged_once_and_the_run_goes_on(tmp_path: Path) -> None:
    """The directory vanished under the metrics file: one warning, no exception, and the status
    file (elsewhere) still follows."""
    selector = selectors.DefaultSelector()
    gone = tmp_path / "gone"
    gone.mkdir()
    status_file = tmp_path / "s.json"
    observer = Observer(selector, ObserveSettings(status_file=str(status_file),
                                                  metrics_file=str(gone / "m.prom"), min_interval_s=0))
    gone.rmdir()
    try:
        with capture_logs() as logs:
            for phase in ("running", "save_requested", "draining"):
                observer.update(snapshot(phase=phase), mono=time.monotonic())
        failures = [e for e in logs if e["event"] == "observe_write_failed"]
        assert len(failures) == 1 and failures[0]["path"] == str(gone / "m.prom")
        assert "FileNotFoundError" in failures[0]["error"]
        assert json.loads(status_file.read_text())["phase"] == "draining"
    finally:
        observer.close()
        selector.close()
