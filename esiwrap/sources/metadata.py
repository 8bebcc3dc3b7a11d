"""A small client for a cloud's instance metadata service (IMDS), with the IMDSv2 token flow.

Volcengine (`http://100.96.0.96`) and AWS (`http://169.254.169.254`; the defaults of
`--metadata-url` and `--aws-metadata-url`) speak the same protocol:
PUT `/latest/api/token` with a TTL header returns a session token, then GETs carry it in another
header. Where tokens are not offered (the PUT is refused with 403/404/405) plain GETs are used; a
throttled or failed token request (429, 5xx) is retried with backoff and never turns tokens off,
and a 401 on a GET fetches a fresh token and asks once more.

Azure (`Metadata: true`) and GCP (`Metadata-Flavor: Google`) have no tokens: every request carries
a fixed header instead (`Dialect.headers`, `token_path=None`). A request may bring its own
timeouts (Azure's first Scheduled Events call, GCP's hanging GET) and sees the answer's headers
(GCP's `ETag`).

The address is link-local-ish and answers in milliseconds on a VM; off a VM it is unroutable, so
timeouts are short and attempts few, and a failed connection is remembered for a moment so the
sources that share this client (`volcengine`, `volcengine-spot`) do not each pay the timeout.
Only the stdlib is used: no proxy is ever consulted for the metadata address.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import NamedTuple

TOKEN_PATH = "/latest/api/token"
TOKEN_TTL_S = 21600
TOKEN_REUSE_S = TOKEN_TTL_S - 60  # renew a minute before the service forgets it
# A definite "no tokens here" to the token PUT (AWS: 403 when IMDSv2 is off; 404/405 where the
# path or method does not exist). Anything else (429, 5xx, 400, 401) is not a reason to give up.
TOKEN_REFUSED = frozenset({403, 404, 405})
MAX_ANSWER_BYTES = 65536  # an item, a Scheduled Events document: far smaller


class MetadataUnreachable(Exception):
    """Nothing answered at the metadata address (refused, timed out, unroutable)."""


class MetadataError(Exception):
    """The metadata service answered, but not with what was asked for (`status`: its HTTP status)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Dialect:
    """How one cloud's metadata service wants to be asked: its IMDSv2 token headers, or none
    (`token_path=None`) and a fixed header on every request instead."""

    where: str  # for "not on <where>?"
    ttl_header: str = ""
    token_header: str = ""
    token_path: str | None = TOKEN_PATH
    headers: tuple[tuple[str, str], ...] = ()


VOLCENGINE = Dialect("a Volcengine ECS instance", "X-volc-ecs-metadata-token-ttl-seconds",
                     "X-volc-ecs-metadata-token")
AWS = Dialect("an AWS EC2 instance", "X-aws-ec2-metadata-token-ttl-seconds", "X-aws-ec2-metadata-token")
AZURE = Dialect("an Azure VM", token_path=None, headers=(("Metadata", "true"),))
GCP = Dialect("a Google Compute Engine VM", token_path=None, headers=(("Metadata-Flavor", "Google"),))


class Reply(NamedTuple):
    status: int
    body: str
    headers: Mapping[str, str]  # names in lower case
    attempts: int = 1


@dataclass(frozen=True)
class Timeouts:
    connect_s: float = 1.0
    read_s: float = 2.0
    attempts: int = 2  # bounded: one retry
    backoff_s: float = 0.2  # before the retry; doubles per further attempt
    remember_unreachable_s: float = 4.0  # answer "unreachable" at once for this long

    def reading_for(self, read_s: float) -> Timeouts:
        """These timeouts with a longer read wait and a single attempt (a slow first answer, a
        hanging GET: retrying it would double a wait that is already long)."""
        return replace(self, read_s=read_s, attempts=1)


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
        self._tokens_supported = dialect.token_path is not None
        self._token_refusal = ""  # how the token request was refused, for reasons
        self._unreachable_until = 0.0
        self._unreachable_reason = ""

    def get(self, path: str, timeouts: Timeouts | None = None) -> str | None:
        """The item's text, or None when the service says 404 (the item does not exist here)."""
        reply = self.read(path, timeouts)
        return None if reply is None else reply.body

    def read(self, path: str, timeouts: Timeouts | None = None) -> Reply | None:
        """The item's answer with its headers, or None on 404; MetadataError for any other
        answer but 200, MetadataUnreachable when nothing answers."""
        token, token_trouble = self._session_token()
        reply = self._request("GET", path, self._token_headers(token), timeouts=timeouts)
        if reply.status == 401 and self.dialect.token_path is not None:
            reply = self._get_with_fresh_token(path, token, token_trouble)
        if reply.status == 404:
            return None
        if reply.status != 200:
            raise MetadataError(_answered(f"{self.base_url}{path}", reply), reply.status)
        return reply

    def post(self, path: str, body: str) -> Reply:
        """POST a JSON body; MetadataError unless the service answers 200."""
        headers = {"Content-Type": "application/json"}
        reply = self._request("POST", path, headers, body=body.encode())
        if reply.status != 200:
            raise MetadataError(_answered(f"POST {self.base_url}{path}", reply), reply.status)
        return reply

    def _get_with_fresh_token(self, path: str, stale: str | None, token_trouble: str) -> Reply:
        """A 401: the item needs a token we do not hold (it expired early, or the flow was off).
        Fetch a fresh one and ask once more; a second 401 means the service refuses our tokens."""
        where = f"{self.base_url}{path}"
        if token_trouble:  # the token request failed a moment ago: asking again now fails the same way
            msg = f"metadata token request failed ({token_trouble}), and {where} needs a token (HTTP 401)"
            raise MetadataError(msg)
        self._forget_token(stale)
        fresh, token_trouble = self._session_token()
        if fresh is None:
            why = token_trouble or f"refused: {self._token_refusal}"
            msg = f"metadata token request failed ({why}), and {where} needs a token (HTTP 401)"
            raise MetadataError(msg)
        reply = self._request("GET", path, self._token_headers(fresh))
        if reply.status == 401:
            msg = f"metadata token refused: HTTP 401 on {where} with a fresh token"
            raise MetadataError(msg)
        return reply

    def _token_headers(self, token: str | None) -> dict[str, str]:
        return {} if token is None else {self.dialect.token_header: token}

    def _session_token(self) -> tuple[str | None, str]:
        """(a cached IMDSv2 token, "") or (None, why not).

        Only a definite refusal of the token request (403/404/405: this service hands out no
        tokens) switches to plain GETs for good, with an empty reason. A transient answer (429,
        5xx, retried with backoff) leaves the flow on: the next call asks for a token again, and
        the reason says what happened, for the item that then needs one.
        """
        with self._lock:
            if not self._tokens_supported:
                return None, ""
            if self._token is not None and time.monotonic() < self._token_until:
                return self._token, ""
        ttl = {self.dialect.ttl_header: str(TOKEN_TTL_S)}
        status, body, _, attempts = self._request("PUT", self.dialect.token_path or TOKEN_PATH, ttl)
        with self._lock:
            if status == 200 and body.strip():
                self._token, self._token_until = body.strip(), time.monotonic() + TOKEN_REUSE_S
                return self._token, ""
            if status in TOKEN_REFUSED:
                self._tokens_supported, self._token_refusal = False, f"HTTP {status}"
                return None, ""
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        return None, f"HTTP {status}{tries}" if status != 200 else "an empty token"

    def _forget_token(self, stale: str | None) -> None:
        """Drop a token the service no longer takes, and ask for tokens again even if it once
        refused to hand them out (it now wants one)."""
        with self._lock:
            if self._token == stale:
                self._token = None
            self._tokens_supported = True

    def _request(self, method: str, path: str, headers: dict[str, str], body: bytes | None = None,
                 timeouts: Timeouts | None = None) -> Reply:
        """One HTTP exchange, with the attempts it took. Connection failures and transient
        answers (429, 5xx) are retried with backoff, a bounded number of times; the last answer
        is returned. Nothing answering at all raises MetadataUnreachable."""
        with self._lock:
            if time.monotonic() < self._unreachable_until:
                raise MetadataUnreachable(self._unreachable_reason)
        t = timeouts or self.timeouts
        failure = ""
        answer: Reply | None = None
        attempts = max(1, t.attempts)
        for attempt in range(attempts):
            if attempt:
                time.sleep(t.backoff_s * 2 ** (attempt - 1))
            try:
                answer = self._exchange(method, path, {**dict(self.dialect.headers), **headers}, body, t)
            except OSError as exc:  # refused, unreachable, timed out, reset, no such host
                failure = _describe(exc)
                continue
            if not _transient(answer.status):
                return answer._replace(attempts=attempt + 1)
        if answer is not None:  # it answered, if only with 429/5xx
            return answer._replace(attempts=attempts)
        reason = f"{self.base_url}: {failure}"
        with self._lock:
            self._unreachable_until = time.monotonic() + t.remember_unreachable_s
            self._unreachable_reason = reason
        raise MetadataUnreachable(reason)

    def _exchange(self, method: str, path: str, headers: dict[str, str], body: bytes | None,
                  t: Timeouts) -> Reply:
        import http.client  # only when a metadata source is asked: keeps `esiwrap -- cmd` start-up light

        conn = http.client.HTTPConnection(self._host, self._port, timeout=t.connect_s)
        try:
            try:
                conn.connect()
            except TimeoutError:
                raise TimeoutError(f"connect timed out after {t.connect_s:g}s") from None
            assert conn.sock is not None
            conn.sock.settimeout(t.read_s)
            conn.request(method, path, body=body, headers=headers)
            try:
                response = conn.getresponse()
                text = response.read(MAX_ANSWER_BYTES).decode("utf-8", "replace")
            except TimeoutError:
                raise TimeoutError(f"no answer within {t.read_s:g}s") from None
            names = {name.lower(): value for name, value in response.getheaders()}
            return Reply(response.status, text, names)
        except http.client.HTTPException as exc:  # a garbled answer counts as a failed exchange
            raise ConnectionError(f"bad HTTP answer: {type(exc).__name__}") from None
        finally:
            conn.close()


def _answered(what: str, reply: Reply) -> str:
    tries = f" after {reply.attempts} attempts" if reply.attempts > 1 else ""
    return f"{what} answered HTTP {reply.status}{tries}"


def _transient(status: int) -> bool:
    """Throttled or a server error: worth another try after a pause."""
    return status == 429 or status >= 500


def _describe(exc: OSError) -> str:
    if isinstance(exc, TimeoutError):
        return str(exc) or "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    import socket  # loaded with http.client already; not at start-up

    if isinstance(exc, socket.gaierror):  # metadata.google.internal off GCP
        return f"cannot resolve the host ({exc.strerror or exc})"
    return exc.strerror or str(exc) or type(exc).__name__
