"""Who acts in the dashboard: every approval, rejection and rollback names a person in the audit log.

- ``[dashboard] login``: the person logs in with Streamlit's own login (OIDC, ``st.login``; the
  identity provider is configured in ``.streamlit/secrets.toml``, ``[auth]``). The dashboard's calls
  carry the ``[api.tokens]`` entry ``[dashboard] delegate``, which ``[api] delegates`` lets act for
  a person named in ``X-Tracefix-Actor``: the audit log records "alice@example.com (via dashboard)".
- ``[api.tokens]`` without a login: each person gives their own token before the first approval;
  it is kept for their browser session only, and the audit log records its name.
- Neither (a dashboard on loopback only, one local user): the daemon's own token, recorded as admin.

A dashboard bound beyond loopback with neither refuses to start (``Settings``).
"""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from tracefix.daemon.core.auth import api_token
from tracefix.daemon.core.settings import Settings

TOKEN_KEY = "tracefix_personal_token"  # the session's own token, in st.session_state


@dataclass(frozen=True, slots=True)
class Identity:
    """What the dashboard's mutating calls carry, and what the person must do before one."""

    mode: str  # "login" | "personal" | "local"
    token: str  # the bearer token ("" : none yet)
    actor: str | None = None  # the person a delegate token acts for
    needs: str | None = None  # what to do before approving, when something is missing


def identity(settings: Settings) -> Identity:
    """Who the dashboard acts for in this browser session."""
    if settings.dashboard.login:
        if not st.user.is_logged_in:
            return Identity("login", "", needs="Log in to approve, reject or roll back.")
        person = st.user.get("email") or st.user.get("name") or st.user.get("sub")
        return Identity("login", settings.api.tokens.get(settings.dashboard.delegate, ""), actor=str(person))
    if settings.api.tokens:
        token = st.session_state.get(TOKEN_KEY, "")
        return Identity("personal", token, needs=None if token else "Give your API token ([api.tokens]) to approve.")
    return Identity("local", api_token(settings))


def render_sidebar(settings: Settings, acting_as: str | None) -> None:
    """The login button or the token field, and whom the audit log will name."""
    mode = identity(settings).mode
    if mode == "login":
        if st.user.is_logged_in:
            st.caption(f"approving as {acting_as or st.user.get('email')}")
            st.button("Log out", on_click=st.logout, key="logout")
        else:
            st.button("Log in", on_click=st.login, key="login", type="primary")
    elif mode == "personal":
        st.text_input("Your API token", type="password", key=TOKEN_KEY, help="Your [api.tokens] entry: the audit log records its name.")
        if acting_as:
            st.caption(f"approving as {acting_as}")
