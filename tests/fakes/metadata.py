"""A fake instance metadata service with the IMDSv2 token flow (Volcengine or AWS headers).

    PUT /latest/api/token  (TTL header)  -> a token
    GET /latest/<item>     (token header) -> the item's text, 404 when absent, 401 without a token

`items` maps paths to text and may be changed while a test runs (a spot notice appearing).
"""

from __future__ import annotations

import secrets
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
        super().__init__(_MetadataHandler)

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
        if not fake.tokens_supported:
            self.reply(405, b"", "text/plain")
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
        if fake.require_token and fake.tokens_supported and not token_ok:
            self.reply(401, b"token required", "text/plain")
            return
        with fake.lock:
            text = fake.items.get(self.path)
        if text is None:
            self.reply(404, b"Not Found", "text/plain")
        else:
            self.reply(200, text.encode(), "text/plain")
