"""Source `volcengine`: the elastic scheduled instance's `auto_release_at`, from the ECS OpenAPI.

    metadata /latest/instance_id, /latest/region_id
      -> DescribeInstances(InstanceIds=[id])                 -> ScheduledInstanceId (ExpiredAt logged)
      -> DescribeScheduledInstances(ScheduledInstanceIds=[]) -> AutoReleaseAt

The SDK (`esiwrap[volcengine]`: volcenginesdk-ecs, volcenginesdk-core) is imported on the first
resolve, never at esiwrap import time. Credentials come from the SDK's own default chain
(VOLCENGINE_ACCESS_KEY/SECRET_KEY/SESSION_TOKEN, the CLI config, the instance's IAM role).
Every failure becomes a `SourceUnavailable` whose reason says what to do; nothing raises past it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from esiwrap.core.values import CapacityKind, Deadline
from esiwrap.errors import SourceUnavailable
from esiwrap.sources.metadata import MetadataClient, MetadataError, MetadataUnreachable
from esiwrap.times import TimeParseError, implausible, parse_iso

INSTANCE_ID_PATH = "/latest/instance_id"
REGION_PATH = "/latest/region_id"  # Volcengine's metadata item list: region_id
INSTALL_HINT = ("the Volcengine SDK is not installed; pip install volcenginesdk-ecs volcenginesdk-core "
                "(the volcengine extra)")
PERMISSIONS = "ecs:DescribeInstances and ecs:DescribeScheduledInstances"
DENIED_CODES = frozenset({"AccessDenied", "UnauthorizedOperation", "LackPolicy", "Forbidden",
                          "NoPermission", "OperationDenied.NoPermission"})
BAD_CREDENTIAL_CODES = frozenset({"InvalidAccessKey", "SignatureDoesNotMatch", "InvalidSecretKey",
                                  "MissingAuthenticationToken", "InvalidAuthorization",
                                  "InvalidSecurityToken", "SessionTokenInvalid", "AccessKeyIsExpire",
                                  "InvalidTimestamp"})
THROTTLED_CODES = frozenset({"FlowLimitExceeded", "Throttling", "RequestLimitExceeded",
                             "TooManyRequests", "Throttling.User", "Throttling.Api"})


@dataclass(frozen=True)
class VolcengineSettings:
    endpoint: str | None = None  # host or URL of the ECS OpenAPI; None: the SDK's own for the region
    region: str | None = None  # None: the metadata service's region_id
    timeout_s: float = 5.0  # read timeout per API attempt
    retries: int = 2  # SDK retries after the first attempt (throttling, 5xx, timeouts)
    refresh_s: float = 300.0


class VolcengineSource:
    """Re-resolved every `--refresh`: a renewed scheduled instance moves `auto_release_at` later."""

    name = "volcengine"

    capacity: CapacityKind | None = None  # what DescribeInstances says the instance is

    def __init__(self, metadata: MetadataClient, settings: VolcengineSettings) -> None:
        self.metadata = metadata
        self.settings = settings
        self._api: Any = None
        self._api_region: str | None = None

    @property
    def period_s(self) -> float | None:
        return self.settings.refresh_s

    def resolve(self, now: float) -> Deadline:
        instance_id = self._metadata_item(INSTANCE_ID_PATH, "instance_id")
        region = self.settings.region or self._metadata_item(REGION_PATH, "region_id")
        api = self._ecs_api(region)
        instance = self._describe_instance(api, instance_id)
        scheduled_id = _text_field(instance, "scheduled_instance_id")
        self.capacity = _capacity_of(_text_field(instance, "spot_strategy"), scheduled_id)
        if not scheduled_id:
            msg = f"instance {instance_id} is not an elastic scheduled instance (no ScheduledInstanceId)"
            raise SourceUnavailable(msg, expected=True)
        raw = self._auto_release_at(api, scheduled_id)
        try:
            at = parse_iso(raw)
        except TimeParseError as exc:
            msg = f"scheduled instance {scheduled_id}: AutoReleaseAt {raw!r} is unparsable: {exc}"
            raise SourceUnavailable(msg) from None
        problem = implausible(at, now)
        if problem is not None:
            msg = f"scheduled instance {scheduled_id}: AutoReleaseAt {raw!r} is implausible: {problem}"
            raise SourceUnavailable(msg)
        detail = {"instance_id": instance_id, "scheduled_instance_id": scheduled_id, "region": region}
        expired_at = _text_field(instance, "expired_at")
        if expired_at:
            detail["expired_at"] = expired_at
        return Deadline(at=at, source=self.name, raw=raw, detail=detail, capacity="reserved")

    # ------------------------------------------------------------------ metadata
    def _metadata_item(self, path: str, item: str) -> str:
        try:
            value = self.metadata.get(path)
        except MetadataUnreachable as exc:
            msg = f"metadata service unreachable, not on {self.metadata.dialect.where}? ({exc})"
            raise SourceUnavailable(msg, expected=True) from None
        except MetadataError as exc:
            msg = f"metadata service failed for {item}: {exc}"
            raise SourceUnavailable(msg) from None
        if value is None or not value.strip():
            msg = f"the metadata service has no {item} ({self.metadata.base_url}{path}); " \
                  f"not on {self.metadata.dialect.where}?"
            raise SourceUnavailable(msg, expected=True)
        return value.strip()

    # ------------------------------------------------------------------ OpenAPI
    def _ecs_api(self, region: str) -> Any:
        if self._api is not None and self._api_region == region:
            return self._api
        try:
            import volcenginesdkcore
            import volcenginesdkecs
        except ImportError:
            raise SourceUnavailable(INSTALL_HINT) from None
        config = volcenginesdkcore.Configuration()
        _quiet_sdk_logging(config)
        config.region = region
        if self.settings.endpoint:
            config.host = self.settings.endpoint  # an http:// or https:// prefix sets the scheme
        config.connect_timeout = min(3.0, self.settings.timeout_s)
        config.read_timeout = self.settings.timeout_s
        config.num_max_retries = self.settings.retries
        config.min_retry_delay_ms = 300
        config.max_retry_delay_ms = 2000
        client = volcenginesdkcore.ApiClient(config)
        client.interceptor_chain.insert_response_interceptor(_answer_check())  # first: before decoding
        self._api = volcenginesdkecs.ECSApi(client)
        self._api_region = region
        return self._api

    def _describe_instance(self, api: Any, instance_id: str) -> Any:
        import volcenginesdkecs

        request = volcenginesdkecs.DescribeInstancesRequest(instance_ids=[instance_id])
        response = self._call(api.describe_instances, request, "DescribeInstances")
        instances = list(getattr(response, "instances", None) or [])
        matching = [i for i in instances if getattr(i, "instance_id", None) == instance_id]
        if not matching:
            msg = f"DescribeInstances does not know instance {instance_id} in region {self._api_region}; " \
                  "wrong region (--volcengine-region) or account?"
            raise SourceUnavailable(msg)
        return matching[0]

    def _auto_release_at(self, api: Any, scheduled_id: str) -> str:
        import volcenginesdkecs

        request = volcenginesdkecs.DescribeScheduledInstancesRequest(scheduled_instance_ids=[scheduled_id])
        response = self._call(api.describe_scheduled_instances, request, "DescribeScheduledInstances")
        infos = [i for i in list(getattr(response, "scheduled_instance_info", None) or [])
                 if getattr(i, "scheduled_instance_id", None) == scheduled_id]
        if not infos:
            msg = f"DescribeScheduledInstances does not know scheduled instance {scheduled_id}"
            raise SourceUnavailable(msg)
        raw = _text_field(infos[0], "auto_release_at")
        if not raw:
            msg = f"scheduled instance {scheduled_id} has an empty AutoReleaseAt (no release time set)"
            raise SourceUnavailable(msg)
        return raw

    def _call(self, method: Any, request: Any, action: str) -> Any:
        """One API call; every way it can fail becomes a reason a person can act on."""
        try:
            return method(request)
        except SourceUnavailable:
            raise
        except MalformedAnswer as exc:
            raise SourceUnavailable(f"{action} answered {exc}; the next refresh tries again") from None
        except (AttributeError, TypeError, ValueError, KeyError, IndexError) as exc:
            # The SDK could not map a well-formed JSON answer onto its model: a shape we do not know.
            msg = f"{action} answered an unexpected shape ({type(exc).__name__}: {_first_line(exc)}); " \
                  "the next refresh tries again"
            raise SourceUnavailable(msg) from None
        except Exception as exc:
            raise SourceUnavailable(explain_failure(exc, action, self.settings)) from None


def explain_failure(exc: BaseException, action: str, settings: VolcengineSettings) -> str:
    """A reason for the log from whatever the SDK raised (stable text: the log dedups on it)."""
    status = getattr(exc, "status", None)
    if type(exc).__name__ == "ApiException" and status:
        code, message = _error_code(exc)
        if code in DENIED_CODES or status == 403:
            return f"{action}: {code or 'HTTP 403'}: the credentials lack {PERMISSIONS}"
        if code in BAD_CREDENTIAL_CODES or status == 401:
            return f"{action}: {code or 'HTTP 401'}: the Volcengine credentials are invalid or expired " \
                   "(check VOLCENGINE_ACCESS_KEY/SECRET_KEY/SESSION_TOKEN)"
        if code in THROTTLED_CODES or status == 429:
            return f"{action}: throttled ({code or 'HTTP 429'}) after {settings.retries} retries; " \
                   "the next refresh tries again"
        if status >= 500:
            return f"{action}: the ECS API failed (HTTP {status} {code}) after {settings.retries} retries"
        return f"{action}: {code or f'HTTP {status}'}: {message}".rstrip(": ")
    text = f"{type(exc).__name__}: {exc}"
    if "credentials" in text.lower() and "unable to resolve" in text.lower():
        return "no Volcengine credentials: set VOLCENGINE_ACCESS_KEY and VOLCENGINE_SECRET_KEY, " \
               "configure the volcengine CLI, or attach an IAM role to the instance"
    if "timeout" in text.lower() or "timed out" in text.lower():
        return f"{action}: the ECS API did not answer within {settings.timeout_s:g}s " \
               f"({settings.retries} retries); the next refresh tries again"
    if any(word in text for word in ("NewConnectionError", "Connection refused", "MaxRetryError",
                                     "NameResolution", "gaierror")):
        where = settings.endpoint or "the regional endpoint"
        return f"{action}: cannot connect to the ECS API at {where} " \
               "(check --volcengine-endpoint and the network)"
    return f"{action}: unexpected {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def _error_code(exc: Any) -> tuple[str, str]:
    """(Code, Message) from the OpenAPI error body: ResponseMetadata.Error."""
    body = getattr(exc, "body", None)
    data: Any = None
    if body:
        try:
            data = json.loads(body)
        except (ValueError, TypeError):
            data = None
    if isinstance(data, dict):
        error = (data.get("ResponseMetadata") or {}).get("Error") or {}
    else:  # an HTTP 200 with an Error: the SDK puts str(dict) in `reason`
        import ast

        try:
            error = ast.literal_eval(str(getattr(exc, "reason", "")))
        except (ValueError, SyntaxError):
            error = {}
    if not isinstance(error, Mapping):
        return "", ""
    return str(error.get("Code") or ""), str(error.get("Message") or "")


class MalformedAnswer(Exception):
    """An HTTP 200 from the OpenAPI whose body is not the JSON envelope it always sends."""


def check_answer(body: Any) -> None:
    """Raise MalformedAnswer unless `body` is a JSON object with a `ResponseMetadata` object."""
    try:
        data = json.loads(body)
    except (ValueError, TypeError):
        raise MalformedAnswer(f"unparsable JSON ({_excerpt(body)})") from None
    if not isinstance(data, dict):
        raise MalformedAnswer(f"JSON that is not an object ({_excerpt(body)})")
    if not isinstance(data.get("ResponseMetadata"), dict):
        raise MalformedAnswer(f"JSON without a ResponseMetadata object ({_excerpt(body)})")


def _answer_check() -> Any:
    """An SDK response interceptor that runs `check_answer` before the SDK decodes the body, so
    a garbled answer is named as such (the SDK itself would fail on it with an AttributeError)."""
    from volcenginesdkcore.interceptor import ResponseInterceptor

    class AnswerCheck(ResponseInterceptor):  # type: ignore[misc]
        def name(self) -> str:
            return "esiwrap-answer-check"

        def intercept(self, context: Any) -> Any:
            if context.request.preload_content:
                check_answer(getattr(context.response.http_response, "data", None))
            return context

    return AnswerCheck()


def _excerpt(body: Any) -> str:
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
    text = " ".join(text.split())
    return repr(text[:60] + ("..." if len(text) > 60 else ""))


def _capacity_of(spot_strategy: str, scheduled_id: str) -> CapacityKind | None:
    """DescribeInstances' SpotStrategy: NoSpot for pay-as-you-go and scheduled instances,
    SpotAsPriceGo or SpotWithPriceLimit for spot ones (what sets the periodic-save rate)."""
    if spot_strategy.startswith("Spot"):
        return "spot"
    if scheduled_id:
        return "reserved"
    return "on-demand" if spot_strategy == "NoSpot" else None


def _text_field(model: Any, name: str) -> str:
    """A string attribute of an SDK model, stripped; "" when absent or not a string."""
    value = getattr(model, name, None)
    return value.strip() if isinstance(value, str) else ""


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else ""


def _quiet_sdk_logging(config: Any) -> None:
    """The SDK attaches plain-text stderr handlers to its loggers; our log is JSON lines only."""
    import logging  # the SDK has imported it already; esiwrap's own start-up does not need it

    for logger in list(getattr(config, "logger", {}).values()):
        for handler in list(logger.handlers):
            if getattr(handler, "_volcengine_sdk_handler", False):
                logger.removeHandler(handler)
        logger.addHandler(logging.NullHandler())
        logger.propagate = False
    for name in ("volcenginesdkcore", "volcenginesdkecs"):
        package_logger = logging.getLogger(name)
        package_logger.addHandler(logging.NullHandler())
        package_logger.propagate = False
