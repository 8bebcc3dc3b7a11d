"""A fake Volcengine ECS OpenAPI on 127.0.0.1 that speaks the real wire format.

Requests: GET /?Action=...&Version=2020-04-01&InstanceIds.1=..., signed HMAC-SHA256
(`Authorization: HMAC-SHA256 Credential=AK/DATE/REGION/ecs/request, SignedHeaders=..., Signature=...`).
The fake recomputes the signature with the secret key it was given, so a request that is not
signed, or signed with another key, gets the API's own 401 error body.

Answers: `{"ResponseMetadata": {RequestId, Action, Version, Service, Region}, "Result": {...}}`,
errors `{"ResponseMetadata": {..., "Error": {"CodeN": N, "Code": "...", "Message": "..."}}}` with
the HTTP status the API uses. State (instances, release times, a failure to inject, a delay) may be
changed while a test runs. `answer_raw(action, body)` makes the API answer that action with these
bytes and HTTP 200, whatever they are (garbage, a JSON list, a wrong shape), once signed correctly.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

from fakes._server import QuietHandler, Running

VERSION = "2020-04-01"
ACCESS_KEY = "AKLTfakeaccesskey0000"
SECRET_KEY = "fake-secret-key-for-loopback-tests"
_AUTH = re.compile(r"^HMAC-SHA256 Credential=([^,]+), SignedHeaders=([^,]+), Signature=([0-9a-f]+)$")


@dataclass
class Failure:
    code: str
    status: int
    message: str = ""
    code_n: int = 100013


ACCESS_DENIED = Failure("AccessDenied", 403, "User is not authorized to perform: ecs:DescribeInstances")
THROTTLED = Failure("FlowLimitExceeded", 429, "You've reach the limit on request rate of resources.", 100018)


@dataclass
class Call:
    action: str
    version: str
    params: dict[str, str]
    signed: bool
    access_key: str
    region: str
    service: str


@dataclass
class FakeEcsState:
    instances: dict[str, dict[str, Any]] = field(default_factory=dict)
    scheduled: dict[str, dict[str, Any]] = field(default_factory=dict)
    failure: Failure | None = None
    delay_s: float = 0.0
    raw: dict[str, bytes] = field(default_factory=dict)  # action -> the whole body of a 200 answer


class FakeVolcengineApi(Running):
    def __init__(self, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY) -> None:
        self.access_key = access_key
        self.secret_key = secret_key
        self.state = FakeEcsState()
        self.calls: list[Call] = []
        super().__init__(_ApiHandler)

    def add_instance(self, instance_id: str, scheduled_instance_id: str = "",
                     expired_at: str = "", spot_strategy: str = "NoSpot") -> None:
        with self.lock:
            self.state.instances[instance_id] = {
                "InstanceId": instance_id, "ScheduledInstanceId": scheduled_instance_id,
                "ExpiredAt": expired_at, "Status": "RUNNING", "InstanceChargeType": "PostPaid",
                "SpotStrategy": spot_strategy,
            }

    def set_release(self, scheduled_instance_id: str, auto_release_at: str) -> None:
        with self.lock:
            self.state.scheduled[scheduled_instance_id] = {
                "ScheduledInstanceId": scheduled_instance_id, "AutoReleaseAt": auto_release_at,
                "Status": "Active", "DeliveryType": "Scheduled",
            }

    def answer_raw(self, action: str, body: bytes) -> None:
        with self.lock:
            self.state.raw[action] = body

    def actions(self) -> list[str]:
        return [c.action for c in self.calls]


class _ApiHandler(QuietHandler):
    server: object

    @property
    def fake(self) -> FakeVolcengineApi:
        return self.server.owner  # type: ignore[attr-defined,no-any-return]

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def _handle(self) -> None:
        fake = self.fake
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        query = urlsplit(self.path).query
        params = dict(parse_qsl(query, keep_blank_values=True))
        action, version = params.get("Action", ""), params.get("Version", "")
        signed, access_key, region, service = self._verify(params, body)
        fake.calls.append(Call(action, version, params, signed, access_key, region, service))
        with fake.lock:
            delay, failure, raw = fake.state.delay_s, fake.state.failure, fake.state.raw.get(action)
        if delay:
            time.sleep(delay)
        meta = {"RequestId": secrets.token_hex(12).upper(), "Action": action, "Version": version,
                "Service": "ecs", "Region": region}
        if access_key != fake.access_key:
            self._error(meta, Failure("InvalidAccessKey", 401, "The accesskey is invalid.", 100009))
        elif not signed:
            self._error(meta, Failure("SignatureDoesNotMatch", 401, "The request signature we "
                                      "calculated does not match the signature you provided.", 100010))
        elif version != VERSION:
            self._error(meta, Failure("InvalidActionOrVersion", 404, f"version {version}", 100008))
        elif failure is not None:
            self._error(meta, failure)
        elif raw is not None:
            self.reply(200, raw)
        elif action == "DescribeInstances":
            self._ok(meta, self._describe_instances(params))
        elif action == "DescribeScheduledInstances":
            self._ok(meta, self._describe_scheduled(params))
        else:
            self._error(meta, Failure("InvalidActionOrVersion", 404, f"no action {action}", 100008))

    def _describe_instances(self, params: dict[str, str]) -> dict[str, Any]:
        wanted = _indexed(params, "InstanceIds")
        with self.fake.lock:
            found = [dict(self.fake.state.instances[i]) for i in wanted if i in self.fake.state.instances]
        return {"Instances": found, "NextToken": "", "TotalCount": len(found)}

    def _describe_scheduled(self, params: dict[str, str]) -> dict[str, Any]:
        wanted = _indexed(params, "ScheduledInstanceIds")
        with self.fake.lock:
            found = [dict(self.fake.state.scheduled[i]) for i in wanted if i in self.fake.state.scheduled]
        return {"ScheduledInstanceInfo": found, "NextToken": ""}

    def _ok(self, meta: dict[str, Any], result: dict[str, Any]) -> None:
        self.reply(200, json.dumps({"ResponseMetadata": meta, "Result": result}).encode())

    def _error(self, meta: dict[str, Any], failure: Failure) -> None:
        meta = {**meta, "Error": {"CodeN": failure.code_n, "Code": failure.code,
                                  "Message": failure.message}}
        self.reply(failure.status, json.dumps({"ResponseMetadata": meta}).encode())

    def _verify(self, params: dict[str, str], body: str) -> tuple[bool, str, str, str]:
        """Recompute the HMAC-SHA256 signature; (valid, access key, region, service)."""
        match = _AUTH.match(self.headers.get("Authorization", ""))
        if not match:
            return False, "", "", ""
        credential, signed_names, signature = match.groups()
        parts = credential.split("/")
        if len(parts) != 5:
            return False, "", "", ""
        access_key, date, region, service, _ = parts
        x_date = self.headers.get("X-Date", "")
        names = signed_names.split(";")
        canonical_headers = "".join(f"{name}:{self._header(name)}\n" for name in names)
        body_hash = hashlib.sha256(body.encode()).hexdigest()
        if self.headers.get("X-Content-Sha256") != body_hash:
            return False, access_key, region, service
        canonical_query = "&".join(
            f"{k}={v}" for k, v in sorted((quote(k, safe="-_.~"), quote(v, safe="-_.~"))
                                          for k, v in params.items())
        )
        path = urlsplit(self.path).path or "/"
        canonical = "\n".join([self.command, path, canonical_query, canonical_headers, signed_names,
                               body_hash])
        scope = f"{date}/{region}/{service}/request"
        to_sign = "\n".join(["HMAC-SHA256", x_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
        key = self.fake.secret_key.encode()
        for part in (date, region, service, "request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        expected = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected, signature), access_key, region, service

    def _header(self, name: str) -> str:
        value = self.headers.get(name, "")
        if name == "host" and value.endswith((":80", ":443")):
            value = value.rsplit(":", 1)[0]
        return value


def _indexed(params: dict[str, str], prefix: str) -> list[str]:
    """`InstanceIds.1=a&InstanceIds.2=b` -> [a, b]."""
    pattern = re.compile(rf"^{re.escape(prefix)}\.(\d+)$")
    found = sorted((int(m.group(1)), v) for k, v in params.items() if (m := pattern.match(k)))
    return [v for _, v in found]
