"""Metrics file, metrics endpoint and `esiwrap status` during a real supervised run of the demo
trainer: what they say follows the log's events, and all of it is gone when esiwrap exits."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from esiwrap_harness import PYTHON, TINY_TRAINER
from prometheus_client.parser import text_string_to_metric_families

from esiwrap.errors import EXIT_CHECKPOINTED


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def one(fams: dict[str, Any], name: str, **labels: str) -> float:
    values = [s.value for s in fams[name].samples if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(values) == 1, (name, labels, fams[name].samples)
    return float(values[0])


def scrape(url: str) -> str:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request("GET", parts.path)
        response = conn.getresponse()
        assert response.status == 200
        return response.read().decode()
    finally:
        conn.close()


def status(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "esiwrap", "status", *args], capture_output=True, text=True,
                          timeout=60, env={k: v for k, v in os.environ.items() if k != "ESIWRAP_STATUS_FILE"})


def test_metrics_and_status_follow_a_supervised_run(esiwrap, tmp_path: Path) -> None:
    """Before the first save: deadline from cli, insurance save planned, a trainer, phase running.
    After it: one save completed, the checkpoint's step. At exit: files removed, status says so."""
    metrics_file, status_file = tmp_path / "esiwrap.prom", tmp_path / "status.json"
    run = esiwrap("--deadline", "+40s", "--redundant-time", "8", "--save-duration", "1",
                  "--final-margin", "2", "--metrics-file", str(metrics_file), "--metrics-port", "0",
                  "--status-file", str(status_file), "--", PYTHON, str(TINY_TRAINER),
                  "--ckpt-dir", str(tmp_path / "ckpt"), "--step-seconds", "0.3")
    url = run.wait_event("metrics_serving", timeout=30)["url"]
    assert url.startswith("http://127.0.0.1:")
    run.wait_for(lambda e: e["event"] == "save_scheduled" and e.get("step_estimate_s", 0) > 0, 90,
                 "a plan from measured steps")
    run_id = run.first("child_started")["run_id"]
    for text in (scrape(url), metrics_file.read_text()):
        fams = families(text)
        resolved = run.first("deadline_resolved")
        assert one(fams, "esiwrap_deadline_timestamp_seconds", source="cli", run_id=run_id) > 0
        assert one(fams, "esiwrap_next_save_timestamp_seconds", kind="insurance") > 0
        assert one(fams, "esiwrap_trainers") == 1
        assert one(fams, "esiwrap_phase", phase="running") == 1
        assert one(fams, "esiwrap_saves_completed") == 0
        assert resolved["source"] == "cli"
    shown = status("--status-file", str(status_file))
    assert shown.returncode == 0 and f"esiwrap {run.pid} (run {run_id})" in shown.stdout
    assert ") from cli" in shown.stdout and "insurance save at " in shown.stdout

    saved = run.wait_event("save_completed", timeout=60, kind="insurance")
    run.wait_for(lambda e: e["event"] == "save_scheduled" and e.get("kind") == "final", 30, "the final plan")
    fams = families(scrape(url))
    assert one(fams, "esiwrap_saves_completed") >= 1
    assert one(fams, "esiwrap_last_checkpoint_step") >= saved["step"]
    assert json.loads(status_file.read_text())["last_checkpoint_step"] >= saved["step"]

    assert run.finish(timeout=90) == EXIT_CHECKPOINTED
    assert not metrics_file.exists() and not status_file.exists()
    gone = status("--status-file", str(status_file))
    assert gone.returncode == 3 and "no esiwrap is running" in gone.stderr


def test_idle_connections_cannot_shut_a_scraper_out(esiwrap) -> None:
    """200 clients connect and send half a request each (no blank line), and hold on: a real
    scrape right after still gets its answer (with the table full, the oldest unfinished request
    is closed to make room; it used to be the scrape that was reset). That the room is made at
    once, not when the idle ones time out, test_observe.py shows on the endpoint itself, where
    nothing times out."""
    run = esiwrap("--deadline", "+2h", "--metrics-port", "0", "--", "sleep", "300")
    url = run.wait_event("metrics_serving", timeout=30)["url"]
    parts = urlsplit(url)
    idle = []
    try:
        for _ in range(200):
            sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            idle.append(sock)
        text = scrape(url)
        assert "esiwrap_info" in text
    finally:
        for sock in idle:
            sock.close()
