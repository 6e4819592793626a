"""The daemon's side of the router's admin API: load and unload adapter versions, read what it
serves. Errors are raised with the router's own message so promotion can show them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from tracefix.daemon.core.auth import ROUTER_TOKEN_FILE, stored_token
from tracefix.daemon.core.settings import Settings
from tracefix.daemon.core.states import ServingRole



class RouterError(RuntimeError):
    pass


class RouterAdmin:
    """One pooled HTTP client for the daemon's life: a client per call built a TLS context each
    time (20–30 ms of CPU on this machine), which the dashboard's and the demo's polls of /api/routing paid every
    few seconds beside the trainer."""

    def __init__(self, settings: Settings, timeout_s: float = 60.0) -> None:
        router = settings.router
        host = "127.0.0.1" if router.host in ("0.0.0.0", "::") else router.host
        self.base_url = f"http://{host}:{router.port}"
        self.token_path = settings.data_dir / ROUTER_TOKEN_FILE
        self.configured = router.token
        self._client = httpx.Client(base_url=self.base_url, timeout=timeout_s)

    def _call(self, method: str, path: str, **kwargs: object) -> httpx.Response:
        token = stored_token(self.configured, self.token_path)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            return self._client.request(method, path, headers=headers, **kwargs)  # type: ignore[arg-type]
        except httpx.HTTPError as error:
            raise RouterError(f"router at {self.base_url} unreachable: {error}") from None

    def metrics(self) -> str | None:
        """The router's Prometheus exposition; None when it does not answer."""
        try:
            return self._client.get("/metrics", timeout=5).text
        except httpx.HTTPError:
            return None

    def close(self) -> None:
        self._client.close()

    @staticmethod
    def _message(response: httpx.Response) -> str:
        try:
            return response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            return response.text[:300]

    def load(
        self,
        name: str,
        capability: str,
        version: int,
        path: str,
        description: str,
        canary: float | None = None,
        instructions: Sequence[str] = (),
    ) -> None:
        """Load ``<capability>@v<version>`` (as a canary taking `canary` of the capability's traffic,
        recognising its agent by the digests of its `instructions`); already serving it counts as
        loaded (never reloaded)."""
        body = {
            "capability": capability, "version": version, "path": path, "description": description, "canary": canary,
            "instructions": list(instructions),
        }  # fmt: skip
        response = self._call("POST", "/admin/adapters", json=body)
        if response.status_code == 409 or response.is_success:
            return
        raise RouterError(f"router refused {name} ({response.status_code}): {self._message(response)}")

    def promote(self, name: str) -> None:
        """A canary takes all of its capability's traffic; the version before it retires."""
        response = self._call("POST", f"/admin/adapters/{name}/promote")
        if not response.is_success:
            raise RouterError(f"router did not promote {name} ({response.status_code}): {self._message(response)}")

    def unload(self, name: str) -> None:
        response = self._call("DELETE", f"/admin/adapters/{name}")
        if response.status_code == 404 or response.is_success:
            return
        raise RouterError(f"router did not unload {name} ({response.status_code}): {self._message(response)}")

    def routing(self) -> dict[str, Any]:
        """The router's routing table: mode, capabilities, canaries and adapters."""
        response = self._call("GET", "/admin/routing")
        if not response.is_success:
            raise RouterError(f"router /admin/routing answered {response.status_code}: {self._message(response)}")
        return response.json()

    def set_routing(self, mode: str, adapter: str | None = None, gate: str | None = None) -> dict[str, Any]:
        response = self._call("PUT", "/admin/routing", json={"mode": mode, "adapter": adapter, "gate": gate})
        if not response.is_success:
            raise RouterError(f"router refused routing {mode!r} ({response.status_code}): {self._message(response)}")
        return response.json()

    def serving(self) -> dict[str, str]:
        """The adapter versions that take requests, each with its role: 'live' or 'canary'."""
        return {item["name"]: item["role"] for item in self.routing()["adapters"] if item["role"] != ServingRole.RETIRING}
