"""The tracefix dashboard, a thin client of the daemon API.

Run it with `tracefix dashboard [--config PATH]`, which runs
`streamlit run dashboard/app.py -- --config PATH` on the [dashboard] host and port.
"""

from __future__ import annotations

import sys
from pathlib import Path

# `streamlit run` puts this folder, not the repository, on sys.path; a source checkout that is not
# installed still finds the `tracefix` package (tracefix/__init__.py beside this folder).
_REPOSITORY = Path(__file__).resolve().parent.parent
if (_REPOSITORY / "tracefix" / "__init__.py").is_file() and str(_REPOSITORY) not in sys.path:
    sys.path.insert(1, str(_REPOSITORY))

import streamlit as st  # noqa: E402

from tracefix.daemon.core.settings import ConfigError  # noqa: E402
from tracefix.daemon.app.client import ApiError  # noqa: E402
from tracefix.dashboard import identity  # noqa: E402
from tracefix.dashboard.page import PageContext, connect  # noqa: E402

st.set_page_config(page_title="tracefix", page_icon=":material/healing:", layout="wide")

PAGES = [
    st.Page("views/health.py", title="Capability health", icon=":material/monitor_heart:", url_path="health", default=True),
    st.Page("views/evidence.py", title="Evidence", icon=":material/forum:", url_path="evidence"),
    st.Page("views/pipeline.py", title="Pipeline", icon=":material/model_training:", url_path="pipeline"),
    st.Page("views/adapters.py", title="Adapters", icon=":material/verified:", url_path="adapters"),
    st.Page("views/routing.py", title="Routing", icon=":material/alt_route:", url_path="routing"),
]


def daemon_summary(context: PageContext) -> None:
    """Health of the daemon and what the dashboard is connected to, in the sidebar."""
    try:
        status = context.api.get("/api/status")
    except ApiError as problem:
        st.error(str(problem), icon=":material/cloud_off:")
        return
    if status["healthy"]:
        st.success(f"daemon {status['version']} healthy · up {status['uptime_s']:.0f} s", icon=":material/check_circle:")
    else:
        st.warning("daemon degraded: " + "; ".join(status["problems"]), icon=":material/warning:")
    counts, outcomes = status["counts"], status["outcomes"]
    st.caption(
        f"{counts['trajectories']} trajectories ({outcomes['failure']} failed, {outcomes['success']} succeeded, "
        f"{outcomes['unknown']} unknown) · {counts['spans']} spans"
    )


def sidebar() -> None:
    try:
        context = connect()
    except ConfigError as error:
        st.error(f"configuration: {error}")
        return
    st.caption(f"API {context.api.base_url}")
    acting_as = None
    if context.api.has_token:
        try:
            acting_as = context.api.get("/api/whoami")["actor"]
        except ApiError as error:
            st.error("the daemon does not accept this token" if error.status == 401 else str(error), icon=":material/key_off:")
    identity.render_sidebar(context.settings, acting_as)
    if context.identity.needs:
        st.caption(context.identity.needs)
    elif not context.api.has_token:
        st.caption("no API token found: approvals are disabled ([api] token or <store dir>/api.token)")
    refresh = context.settings.dashboard.refresh_s
    st.caption(f"refreshes every {refresh:g} s" if refresh > 0 else "auto-refresh off ([dashboard] refresh_s = 0)")

    @st.fragment(run_every=refresh if refresh > 0 else None)
    def summary() -> None:
        daemon_summary(context)

    summary()


navigation = st.navigation(PAGES)
with st.sidebar:
    sidebar()
navigation.run()
