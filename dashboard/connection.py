"""The dashboard's link to the daemon: which configuration it runs with, where the API is, which
token it sends, and HTTP calls whose failures become one-line messages a person can act on.

The dashboard never opens DuckDB (only the daemon may write it); everything goes through the API.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from daemon.core.settings import Settings, load_settings

# `tracefix dashboard --config PATH` hands the path to the app as `-- --config PATH`; tests and
# other launchers may name it in this variable instead.
CONFIG_ENV = "TRACEFIX_CONFIG"


def config_path(argv: Sequence[str], environ: dict[str, str] | None = None) -> Path | None:
    """The configuration file named by `--config PATH` (or `--config=PATH`) in argv, else by $TRACEFIX_CONFIG."""
    for index, argument in enumerate(argv):
        if argument == "--config" and index + 1 < len(argv):
            return Path(argv[index + 1])
        if argument.startswith("--config="):
            return Path(argument.partition("=")[2])
    value = (os.environ if environ is None else environ).get(CONFIG_ENV)
    return Path(value) if value else None


def load(argv: Sequence[str]) -> Settings:
    """The settings the daemon runs with; raises daemon.core.settings.ConfigError with a readable message."""
    return load_settings(config_path(argv))


def api_url(settings: Settings) -> str:
    """[dashboard] api_url, else the daemon's own [api] address (loopback when it binds every interface)."""
    if settings.dashboard.api_url:
        return settings.dashboard.api_url.rstrip("/")
    host = settings.api.host if settings.api.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{settings.api.port}"


def api_token(settings: Settings) -> str:
    """The bearer token for approvals: [api] token, else the one the daemon keeps in <store dir>/api.token."""
    from daemon.core.auth import api_token as daemon_token

    return daemon_token(settings)


class ApiProblem(RuntimeError):
    """A failed API call, phrased for the person looking at the page; `status` is None when unreachable."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class DaemonApi:
    """GET and POST against the daemon API with the configured token."""

    def __init__(self, base_url: str, token: str, timeout_s: float = 10.0) -> None:
        self.base_url = base_url
        self.has_token = bool(token)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=base_url, timeout=timeout_s, headers=headers)

    @classmethod
    def from_settings(cls, settings: Settings) -> DaemonApi:
        return cls(api_url(settings), api_token(settings), settings.dashboard.timeout_s)

    def get(self, path: str, **params: Any) -> Any:
        return self._request("GET", path, params={key: value for key, value in params.items() if value is not None})

    def get_optional(self, path: str, **params: Any) -> Any | None:
        """Like get, but None when the daemon has no such endpoint (an older daemon) instead of an error."""
        try:
            return self.get(path, **params)
        except ApiProblem as problem:
            if problem.status in (404, 405):
                return None
            raise

    def post(self, path: str, body: Any = None) -> Any:
        return self._request("POST", path, json=body)

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TimeoutException:
            raise ApiProblem(f"the daemon at {self.base_url} did not answer {method} {path} in time; is it overloaded?") from None
        except httpx.TransportError:
            raise ApiProblem(
                f"the tracefix daemon is not reachable at {self.base_url}; start it with `tracefix up` "
                "(or start the dashboard with the --config the daemon runs with)"
            ) from None
        if response.status_code >= 400:
            raise ApiProblem(f"{method} {path} failed ({response.status_code}): {_detail(response)}", response.status_code)
        try:
            return response.json()
        except ValueError:
            raise ApiProblem(f"{method} {path} answered with something that is not JSON", response.status_code) from None

    def close(self) -> None:
        self._http.close()


def _detail(response: httpx.Response) -> str:
    """FastAPI's `detail` (a string, or a list of validation errors) as one line."""
    try:
        detail = response.json().get("detail", response.text)
    except (ValueError, AttributeError):
        return response.text[:300] or response.reason_phrase
    if isinstance(detail, list):
        return "; ".join(str(item.get("msg", item)) if isinstance(item, dict) else str(item) for item in detail)
    return str(detail)
