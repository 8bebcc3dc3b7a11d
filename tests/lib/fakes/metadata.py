"""A fake instance metadata service with the IMDSv2 token flow (Volcengine or AWS headers).

    PUT /latest/api/token  (TTL header)  -> a token
    GET /latest/<item>     (token header) -> the item's text, 404 when absent, 401 without a token

`items` maps paths to text and may be changed while a test runs (a spot notice appearing).

Faults, for the token flow: `answer_token_puts(429, 503, ...)` answers the next PUTs with these
statuses (then normally), `delay_token_puts(3.0, ...)` makes the next PUTs that slow (a read
timeout), `refuse_tokens_with = 403` answers every PUT so (a service without tokens),
`reject_tokens = True` hands out tokens but answers every GET 401 (it refuses them), and
`forget_tokens()` drops the tokens handed out so far (they expired early).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from fakes._server import QuietHandler, Running


@dataclass(frozen=True)
class Headers:
    ttl: str
    token: str


VOLCENGINE_HEADERS = Headers("X-volc-ecs-metadata-token-ttl-seconds", "X-volc-ecs-metadata-token")
AWS_HEADERS = Headers("X-aws-ec2-metadata-token-ttl-seconds", "X-aws-ec2-metadata-token")


@dataclass(frozen=True)
class Hit:
    method: str
    path: str
    token_ok: bool


class FakeMetadata(Running):
    def __init__(self, items: dict[str, str] | None = None, headers: Headers = VOLCENGINE_HEADERS,
                 require_token: bool = True, tokens_supported: bool = True) -> None:
        self.items = dict(items or {})
        self.headers = headers
        self.require_token = require_token
        self.tokens_supported = tokens_supported
        self.tokens: set[str] = set()
        self.hits: list[Hit] = []
        self.token_put_statuses: list[int] = []
        self.token_put_delays: list[float] = []
        self.refuse_tokens_with: int | None = None
        self.reject_tokens = False
        super().__init__(_MetadataHandler)

    def answer_token_puts(self, *statuses: int) -> None:
        with self.lock:
            self.token_put_statuses.extend(statuses)

    def delay_token_puts(self, *seconds: float) -> None:
        with self.lock:
            self.token_put_delays.extend(seconds)

    def forget_tokens(self) -> None:
        with self.lock:
            self.tokens.clear()

    def puts(self) -> list[Hit]:
        return [h for h in self.hits if h.method == "PUT"]

    def set(self, path: str, text: str | None) -> None:
        with self.lock:
            if text is None:
                self.items.pop(path, None)
            else:
                self.items[path] = text

    def gets(self, path: str) -> list[Hit]:
        return [h for h in self.hits if h.method == "GET" and h.path == path]


class _MetadataHandler(QuietHandler):
    server: object

    @property
    def fake(self) -> FakeMetadata:
        return self.server.owner  # type: ignore[attr-defined,no-any-return]

    def do_PUT(self) -> None:
        fake = self.fake
        ttl = self.headers.get(fake.headers.ttl)
        fake.hits.append(Hit("PUT", self.path, bool(ttl)))
        with fake.lock:
            delay = fake.token_put_delays.pop(0) if fake.token_put_delays else 0.0
            injected = fake.token_put_statuses.pop(0) if fake.token_put_statuses else None
        if delay:
            time.sleep(delay)
        if not fake.tokens_supported:
            self.reply(405, b"", "text/plain")
            return
        refusal = injected or fake.refuse_tokens_with
        if refusal is not None:
            self.reply(refusal, f"HTTP {refusal}".encode(), "text/plain")
            return
        if self.path != "/latest/api/token" or not ttl or not ttl.isdigit():
            self.reply(400, b"missing or bad TTL header", "text/plain")
            return
        token = secrets.token_hex(16)
        with fake.lock:
            fake.tokens.add(token)
        self.reply(200, token.encode(), "text/plain")

    def do_GET(self) -> None:
        fake = self.fake
        token_ok = self.headers.get(fake.headers.token) in fake.tokens
        fake.hits.append(Hit("GET", self.path, token_ok))
        if fake.reject_tokens or (fake.require_token and fake.tokens_supported and not token_ok):
            self.reply(401, b"token required", "text/plain")
            return
        with fake.lock:
            text = fake.items.get(self.path)
        if text is None:
            self.reply(404, b"Not Found", "text/plain")
        else:
            self.reply(200, text.encode(), "text/plain")
