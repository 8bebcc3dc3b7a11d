"""A small client for a cloud's instance metadata service (IMDS), with the IMDSv2 token flow.

Volcengine (`http://100.96.0.96`) and AWS (`http://169.254.169.254`) speak the same protocol:
PUT `/latest/api/token` with a TTL header returns a session token, then GETs carry it in another
header. Where tokens are not required (or the PUT is refused with an HTTP error) plain GETs work.

The address is link-local-ish and answers in milliseconds on a VM; off a VM it is unroutable, so
timeouts are short and attempts few, and a failed connection is remembered for a moment so the
sources that share this client (`volcengine`, `volcengine-spot`) do not each pay the timeout.
Only the stdlib is used: no proxy is ever consulted for the metadata address.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

VOLCENGINE_METADATA_URL = "http://100.96.0.96"
AWS_METADATA_URL = "http://169.254.169.254"
TOKEN_PATH = "/latest/api/token"
TOKEN_TTL_S = 21600
TOKEN_REUSE_S = TOKEN_TTL_S - 60  # renew a minute before the service forgets it


class MetadataUnreachable(Exception):
    """Nothing answered at the metadata address (refused, timed out, unroutable)."""


class MetadataError(Exception):
    """The metadata service answered, but not with what was asked for."""


@dataclass(frozen=True)
class Dialect:
    """The header names of one cloud's IMDSv2 flavour."""

    where: str  # for "not on <where>?"
    ttl_header: str
    token_header: str


VOLCENGINE = Dialect("a Volcengine ECS instance", "X-volc-ecs-metadata-token-ttl-seconds",
                     "X-volc-ecs-metadata-token")
AWS = Dialect("an AWS EC2 instance", "X-aws-ec2-metadata-token-ttl-seconds", "X-aws-ec2-metadata-token")


@dataclass(frozen=True)
class Timeouts:
    connect_s: float = 1.0
    read_s: float = 2.0
    attempts: int = 2  # bounded: one retry
    backoff_s: float = 0.2  # before the retry; doubles per further attempt
    remember_unreachable_s: float = 4.0  # answer "unreachable" at once for this long


class MetadataClient:
    """GET items from one metadata service. Thread-safe: the sources share one instance."""

    def __init__(self, base_url: str, dialect: Dialect, timeouts: Timeouts | None = None) -> None:
        from urllib.parse import urlsplit  # only when a metadata source is configured

        parts = urlsplit(base_url if "://" in base_url else "http://" + base_url)
        if parts.scheme != "http" or not parts.hostname:
            msg = f"metadata URL {base_url!r}: use http://HOST[:PORT]"
            raise ValueError(msg)
        self.base_url = f"http://{parts.netloc}"
        self._host = parts.hostname
        self._port = parts.port or 80
        self.dialect = dialect
        self.timeouts = timeouts or Timeouts()
        self._lock = threading.Lock()
        self._token: str | None = None
        self._token_until = 0.0
        self._tokens_supported = True
        self._unreachable_until = 0.0
        self._unreachable_reason = ""

    def get(self, path: str) -> str | None:
        """The item's text, or None when the service says 404 (the item does not exist here)."""
        headers = {}
        token = self._session_token()
        if token is not None:
            headers[self.dialect.token_header] = token
        status, body = self._request("GET", path, headers)
        if status == 401 and token is not None:  # the token expired early: one fresh try
            with self._lock:
                self._token = None
            headers[self.dialect.token_header] = self._session_token() or ""
            status, body = self._request("GET", path, headers)
        if status == 404:
            return None
        if status != 200:
            msg = f"{self.base_url}{path} answered HTTP {status}"
            raise MetadataError(msg)
        return body

    def _session_token(self) -> str | None:
        """A cached IMDSv2 token; None where the service does not hand out tokens."""
        with self._lock:
            if not self._tokens_supported:
                return None
            if self._token is not None and time.monotonic() < self._token_until:
                return self._token
        status, body = self._request("PUT", TOKEN_PATH, {self.dialect.ttl_header: str(TOKEN_TTL_S)})
        with self._lock:
            if status == 200 and body.strip():
                self._token, self._token_until = body.strip(), time.monotonic() + TOKEN_REUSE_S
                return self._token
            # It answered, but without a token (404/405/403): tokens are not required here.
            self._tokens_supported = False
            return None

    def _request(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, str]:
        """One HTTP exchange with bounded retries on connection failures and 5xx."""
        with self._lock:
            if time.monotonic() < self._unreachable_until:
                raise MetadataUnreachable(self._unreachable_reason)
        t = self.timeouts
        failure = ""
        for attempt in range(max(1, t.attempts)):
            if attempt:
                time.sleep(t.backoff_s * 2 ** (attempt - 1))
            try:
                status, body = self._exchange(method, path, headers)
            except OSError as exc:  # refused, unreachable, timed out, reset
                failure = _describe(exc)
                continue
            if status >= 500:
                failure = f"HTTP {status}"
                continue
            return status, body
        if failure.startswith("HTTP"):
            msg = f"{self.base_url}{path} answered {failure}"
            raise MetadataError(msg)
        reason = f"{self.base_url}: {failure}"
        with self._lock:
            self._unreachable_until = time.monotonic() + t.remember_unreachable_s
            self._unreachable_reason = reason
        raise MetadataUnreachable(reason)

    def _exchange(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, str]:
        import http.client  # only when a metadata source is asked: keeps `esiwrap -- cmd` start-up light

        conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeouts.connect_s)
        try:
            try:
                conn.connect()
            except TimeoutError:
                raise TimeoutError(f"connect timed out after {self.timeouts.connect_s:g}s") from None
            assert conn.sock is not None
            conn.sock.settimeout(self.timeouts.read_s)
            conn.request(method, path, headers=headers)
            try:
                response = conn.getresponse()
                return response.status, response.read(65536).decode("utf-8", "replace")
            except TimeoutError:
                raise TimeoutError(f"no answer within {self.timeouts.read_s:g}s") from None
        except http.client.HTTPException as exc:  # a garbled answer counts as a failed exchange
            raise ConnectionError(f"bad HTTP answer: {type(exc).__name__}") from None
        finally:
            conn.close()


def _describe(exc: OSError) -> str:
    if isinstance(exc, TimeoutError):
        return str(exc) or "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    return exc.strerror or str(exc) or type(exc).__name__
