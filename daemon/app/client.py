"""The client of the daemon API, shared by the CLI, the demo and the dashboard: where the API is,
which token it sends, and HTTP calls whose failures become one-line messages a person can act on."""

from __future__ import annotations

from typing import Any

import httpx

from tracefix.daemon.core.auth import api_token
from tracefix.daemon.core.settings import Settings

# What the message of an unreachable daemon tells a CLI user to do; the dashboard says its own.
START_ADVICE = "start it with `tracefix up` (or pass the --config it runs with)"


class ApiError(RuntimeError):
    """A failed call to the daemon API, phrased for a person: `status` is the HTTP status (None when
    no answer came) and `reason` the server's one-line reason (empty when it gave none)."""

    def __init__(self, message: str, status: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class DaemonUnavailable(ApiError):
    """The daemon API could not be reached or did not answer in time."""


def daemon_url(settings: Settings) -> str:
    """The daemon's own [api] address (loopback when it binds every interface)."""
    host = settings.api.host if settings.api.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{settings.api.port}"


class DaemonClient:
    """GET and POST against the daemon API, with the bearer token that mutating calls need."""

    def __init__(
        self, settings: Settings | None = None, timeout_s: float = 10.0, *,
        base_url: str = "", token: str | None = None, advice: str = START_ADVICE, actor: str | None = None,
    ) -> None:  # fmt: skip
        """The API at `base_url` with `token`; either, when not given, is the one `settings` names
        ([api] address, API token). `advice` ends the message of an unreachable daemon. `actor`: the
        person a delegate token acts for (X-Tracefix-Actor)."""
        if base_url:
            self.base_url = base_url.rstrip("/")
        elif settings is not None:
            self.base_url = daemon_url(settings)
        else:
            raise ValueError("DaemonClient needs settings or a base_url")
        if token is None:
            token = api_token(settings) if settings is not None else ""
        self.has_token = bool(token)
        self.advice = advice
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if actor:
            headers["X-Tracefix-Actor"] = actor
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout_s, headers=headers)

    def get(self, path: str, **params: Any) -> Any:
        """GET `path`; parameters that are None are left out."""
        return self._request("GET", path, params={key: value for key, value in params.items() if value is not None})

    def get_optional(self, path: str, **params: Any) -> Any | None:
        """Like get, but None when the daemon has no such endpoint (an older daemon) instead of an error."""
        try:
            return self.get(path, **params)
        except ApiError as error:
            if error.status in (404, 405):
                return None
            raise

    def post(self, path: str, body: Any = None) -> Any:
        return self._request("POST", path, json=body)

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TimeoutException:
            raise DaemonUnavailable(
                f"the daemon at {self.base_url} did not answer {method} {path} in time; is it overloaded?"
            ) from None
        except httpx.TransportError:
            raise DaemonUnavailable(f"the tracefix daemon is not reachable at {self.base_url}; {self.advice}") from None
        if response.status_code >= 400:
            reason = _reason(response)
            raise ApiError(f"{method} {path} failed ({response.status_code}): {reason}", response.status_code, reason)
        try:
            return response.json()
        except ValueError:
            raise ApiError(f"{method} {path} answered with something that is not JSON", response.status_code) from None

    def close(self) -> None:
        self._http.close()


def _reason(response: httpx.Response) -> str:
    """FastAPI's `detail` (a string, or a list of validation errors) as one line."""
    try:
        detail = response.json().get("detail", response.text)
    except (ValueError, AttributeError):
        return response.text[:300] or response.reason_phrase
    if isinstance(detail, list):
        return "; ".join(str(item.get("msg", item)) if isinstance(item, dict) else str(item) for item in detail)
    return str(detail)
