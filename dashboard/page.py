"""What every dashboard page shares: the connection to the daemon, auto-refresh, API errors shown as
messages (never tracebacks), the empty state for a daemon without traces, and number formatting."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import streamlit as st

from tracefix.daemon.app.client import ApiError, DaemonClient
from tracefix.daemon.core.settings import ConfigError, Settings
from tracefix.dashboard.connection import START_ADVICE, api_url, load
from tracefix.dashboard.identity import Identity, identity


@dataclass(frozen=True, slots=True)
class PageContext:
    """The settings the daemon runs with, a client of its API, and who acts through it."""

    settings: Settings
    api: DaemonClient
    identity: Identity


@st.cache_resource(show_spinner=False)
def _client(base_url: str, token: str, timeout_s: float, actor: str | None) -> DaemonClient:
    # One HTTP connection pool per address, token and person, shared by every rerun and browser tab.
    return DaemonClient(timeout_s=timeout_s, base_url=base_url, token=token, advice=START_ADVICE, actor=actor)


def connect() -> PageContext:
    """Settings from the launch's --config (or $TRACEFIX_CONFIG) and who acts in this session
    (``dashboard.identity``); the token is re-read each run, so a dashboard started before the
    daemon picks up the token the daemon creates."""
    settings = load(sys.argv[1:])
    who = identity(settings)
    return PageContext(settings, _client(api_url(settings), who.token, settings.dashboard.timeout_s, who.actor), who)


def show(render: Callable[[PageContext], None]) -> None:
    """Run a page body, reloading its data every [dashboard] refresh_s; an API failure becomes an
    error message on the page."""
    try:
        context = connect()
    except ConfigError as error:
        st.error(f"The dashboard cannot read its configuration: {error}")
        return
    interval = context.settings.dashboard.refresh_s

    @st.fragment(run_every=interval if interval > 0 else None)
    def body() -> None:
        try:
            render(context)
        except ApiError as error:
            st.error(str(error), icon=":material/cloud_off:")

    body()


def otlp_address(settings: Settings, status: Mapping[str, Any] | None = None) -> str:
    """Where agents send traces, as the daemon reports it (or as configured)."""
    endpoint = ((status or {}).get("endpoints") or {}).get("otlp_http")
    if endpoint:
        return str(endpoint)
    host = settings.collector.host if settings.collector.host not in ("0.0.0.0", "::") else "127.0.0.1"
    return f"http://{host}:{settings.collector.http_port}"


def no_traces(settings: Settings, status: Mapping[str, Any] | None = None) -> None:
    """The empty state of a daemon that has assembled no trajectory yet."""
    st.info(
        f"No traces yet — point your agent at {otlp_address(settings, status)} (OTLP/HTTP; gRPC on "
        f"{settings.collector.grpc_port}), see README. `python -m examples.traffic` sends a demo agent's traffic.",
        icon=":material/hourglass_empty:",
    )


def rate(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def interval(low: float | None, high: float | None) -> str:
    return "—" if low is None or high is None else f"{low:.2f}–{high:.2f}"


def short_id(identifier: str, keep: int = 8) -> str:
    return identifier if len(identifier) <= keep + 1 else identifier[:keep] + "…"
