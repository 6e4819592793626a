"""A small client of the daemon API, shared by the CLI and the dashboard."""

from __future__ import annotations

from typing import Any

import httpx

from daemon.core.settings import Settings


class DaemonUnavailable(RuntimeError):
    """The daemon API could not be reached."""


class ApiError(RuntimeError):
    """The daemon answered with an error status."""


class DaemonClient:
    """Calls the daemon API named by the settings ([api] host/port/token)."""

    def __init__(self, settings: Settings, timeout_s: float = 10.0) -> None:
        host = settings.api.host if settings.api.host not in ("0.0.0.0", "::") else "127.0.0.1"
        self.base_url = f"http://{host}:{settings.api.port}"
        from daemon.core.auth import api_token

        token = api_token(settings)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout_s, headers=headers)

    def get(self, path: str, **params: Any) -> Any:
        return self._request("GET", path, params=params)

    def post(self, path: str, body: Any = None) -> Any:
        return self._request("POST", path, json=body)

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError:
            raise DaemonUnavailable(
                f"the tracefix daemon is not reachable at {self.base_url}; start it with `tracefix up` "
                "(or pass the --config it runs with)"
            ) from None
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise ApiError(f"{method} {path} failed with {response.status_code}: {detail}")
        return response.json()

    def close(self) -> None:
        self._http.close()
