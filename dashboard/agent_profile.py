"""How the dashboard shows an agent's profile: what its policy requires before a change (confirmation,
a read first, whether the user's own request authorizes), each rule with where it comes from and the
evidence, from /api/agents/{agent}/profile (daemon/analysis/profile.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
import streamlit as st

RULES = {
    "confirmation": "changes need the user's explicit confirmation",
    "read_first": "an entity is read before it is changed",
    "request_authorizes": "the user's own request (entity and change) authorizes a change",
}
VALUES = {True: "yes", False: "no", None: "undecided"}


def profile_table(profile: Mapping[str, Any]) -> pd.DataFrame:
    """One row per rule: what it means, its value, its source and its evidence."""
    rules = profile.get("rules") or {}
    return pd.DataFrame(
        [
            {"rule": meaning, "its policy": VALUES[rules[name]["value"]], "from": rules[name]["source"], "evidence": rules[name]["evidence"]}
            for name, meaning in RULES.items()
            if name in rules
        ],
        columns=["rule", "its policy", "from", "evidence"],
    )


def render(agent: str, profile: Mapping[str, Any]) -> None:
    """The profile as a table under the agent's statistics, with the overrides not applied."""
    st.subheader(f"What {agent}'s policy requires before a change")
    st.dataframe(profile_table(profile), hide_index=True, width="stretch")
    tools = [
        f"{label}: {', '.join(profile[key])}" for key, label in (("state_changing_tools", "state-changing tools"), ("handoff_tools", "hand-off tools"))
        if profile.get(key) is not None
    ]  # fmt: skip
    st.caption(
        f"Observed on {profile.get('observed_runs', 0)} successful runs that changed state. A rule its policy does not have is never "
        "LACKING; an undecided one is the capability's own definition. Set one in [[capabilities.agents]]."
        + (" " + "; ".join(tools) + "." if tools else "")
    )
    for reason in profile.get("refused") or []:
        st.warning(reason, icon=":material/block:")
