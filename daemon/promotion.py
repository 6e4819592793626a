"""Promotion: the adapter lifecycle after training, with a person in control and an audit log.

    candidate ──approve──▶ approved ──router loaded──▶ live ──newer version live──▶ retired
        │                     │                         │
        └──reject──▶ rejected ◀┘                        └──rollback──▶ rolled_back
                                                          (the version it replaced goes live again)

Approval only records the decision; the promote job loads the adapter into the router under
``<capability>@v<N>`` and marks it live only once the router has it, so nothing is half-live: a
router that is down or refuses leaves the adapter ``approved`` with the error shown, and the next
pass retries. Every human and automatic decision is written to the audit log (who, when, what, why).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol


from daemon.registry import Registry
from daemon.store import Store

log = logging.getLogger(__name__)

STATES = ("candidate", "approved", "live", "retired", "rejected", "rolled_back")
TRANSITIONS: dict[str, frozenset[str]] = {
    "candidate": frozenset({"approved", "rejected"}),
    "approved": frozenset({"live", "rejected"}),
    "live": frozenset({"retired", "rolled_back"}),
    "retired": frozenset({"live"}),  # restored when the version that replaced it is rolled back
    "rejected": frozenset(),
    "rolled_back": frozenset(),
}
NEEDS_REASON = frozenset({"rejected", "rolled_back"})


class IllegalTransition(ValueError):
    """The adapter is not in a state this move starts from; the message says which moves are legal."""


class NotFound(LookupError):
    pass


class RouterClient(Protocol):
    """What promotion needs from the router's admin API."""

    def load(self, name: str, capability: str, version: int, path: str, description: str) -> None: ...

    def unload(self, name: str) -> None: ...

    def live(self) -> set[str]: ...


def served_name(adapter: dict[str, Any]) -> str:
    return f"{adapter['capability']}@v{adapter['version']}"


@dataclass(slots=True)
class Decision:
    adapter_id: int
    from_state: str
    to_state: str
    actor: str
    reason: str


class Promotion:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.registry = Registry(store)

    # -- reads ---------------------------------------------------------------------------------

    def adapter(self, adapter_id: int) -> dict[str, Any]:
        found = self.registry.adapter(adapter_id)
        if found is None:
            raise NotFound(f"no adapter {adapter_id}")
        return found

    def audit(self, adapter_id: int | None = None, limit: int = 200) -> list[dict[str, Any]]:
        return self.store.query(
            "SELECT * FROM audit_log WHERE ? IS NULL OR adapter_id = ? ORDER BY audit_id DESC LIMIT ?",
            [adapter_id, adapter_id, limit],
        )

    def in_state(self, state: str) -> list[dict[str, Any]]:
        return self.store.query("SELECT * FROM adapters WHERE state = ? ORDER BY adapter_id", [state])

    # -- moves ---------------------------------------------------------------------------------

    def move(self, adapter_id: int, to_state: str, actor: str, reason: str, action: str | None = None) -> Decision:
        """One legal transition, recorded in the audit log in the same transaction."""
        if to_state in NEEDS_REASON and not reason.strip():
            raise ValueError(f"a reason is required to move an adapter to {to_state}")
        with self.store.transaction() as tx:
            rows = tx.execute("SELECT state, capability FROM adapters WHERE adapter_id = ?", [adapter_id]).fetchall()
            if not rows:
                raise NotFound(f"no adapter {adapter_id}")
            from_state, capability = rows[0]
            if to_state not in TRANSITIONS.get(from_state, frozenset()):
                legal = ", ".join(sorted(TRANSITIONS.get(from_state, frozenset()))) or "none (final state)"
                raise IllegalTransition(f"adapter {adapter_id} is {from_state}; it cannot become {to_state} (legal: {legal})")
            tx.execute(
                "UPDATE adapters SET state = ?, state_reason = ?, last_error = NULL, updated_at = now() WHERE adapter_id = ?",
                [to_state, reason, adapter_id],
            )
            tx.execute(
                "INSERT INTO audit_log (decided_at, actor, action, adapter_id, capability, from_state, to_state, reason) "
                "VALUES (now(), ?, ?, ?, ?, ?, ?, ?)",
                [actor, action or to_state, adapter_id, capability, from_state, to_state, reason],
            )
        log.info("adapter %d (%s): %s -> %s by %s: %s", adapter_id, capability, from_state, to_state, actor, reason)
        return Decision(adapter_id, from_state, to_state, actor, reason)

    def approve(self, adapter_id: int, actor: str, reason: str = "") -> Decision:
        return self.move(adapter_id, "approved", actor, reason or "approved", "approve")

    def reject(self, adapter_id: int, actor: str, reason: str) -> Decision:
        return self.move(adapter_id, "rejected", actor, reason, "reject")

    def record_error(self, adapter_id: int, error: str) -> None:
        with self.store.transaction() as tx:
            tx.execute("UPDATE adapters SET last_error = ?, updated_at = now() WHERE adapter_id = ?", [error, adapter_id])

    # -- going live ----------------------------------------------------------------------------

    def promote_pass(self, router: RouterClient) -> list[Decision]:
        """Load each approved adapter into the router, then mark it live and retire the version it
        replaces (the router retires that one itself once its in-flight requests finish)."""
        decisions = []
        for adapter in self.in_state("approved"):
            name = served_name(adapter)
            try:
                router.load(name, adapter["capability"], adapter["version"], adapter["path"], adapter["capability"])
            except Exception as error:  # the router is down or refused: stays approved, retried
                self.record_error(adapter["adapter_id"], f"router did not load {name}: {error}")
                log.warning("router did not load %s: %s", name, error)
                continue
            for previous in self.store.query(
                "SELECT adapter_id, version FROM adapters WHERE capability = ? AND state = 'live' AND adapter_id <> ?",
                [adapter["capability"], adapter["adapter_id"]],
            ):
                decisions.append(self.move(previous["adapter_id"], "retired", "promotion", f"replaced by {name}", "retire"))
            decisions.append(self.move(adapter["adapter_id"], "live", "promotion", f"loaded into the router as {name}", "go_live"))
        return decisions

    def rollback(self, adapter_id: int, actor: str, reason: str, router: RouterClient) -> list[Decision]:
        """Take a live version out of service; the version it replaced (if any) goes live again."""
        adapter = self.adapter(adapter_id)
        if adapter["state"] != "live":
            raise IllegalTransition(f"adapter {adapter_id} is {adapter['state']}; only a live adapter can be rolled back")
        if not reason.strip():
            raise ValueError("a reason is required to roll back an adapter")
        previous = self.store.query(
            "SELECT * FROM adapters WHERE capability = ? AND state = 'retired' AND version < ? ORDER BY version DESC LIMIT 1",
            [adapter["capability"], adapter["version"]],
        )
        if previous:
            router.load(served_name(previous[0]), previous[0]["capability"], previous[0]["version"], previous[0]["path"], previous[0]["capability"])
        router.unload(served_name(adapter))
        decisions = [self.move(adapter_id, "rolled_back", actor, reason, "rollback")]
        if previous:
            decisions.append(self.move(previous[0]["adapter_id"], "live", actor, f"restored: {served_name(adapter)} rolled back", "restore"))
        return decisions

    def reconcile(self, router: RouterClient) -> tuple[list[str], list[str]]:
        """Bring the router to exactly the live set the registry records (after either restarts)."""
        wanted = {served_name(adapter): adapter for adapter in self.in_state("live")}
        serving = router.live()
        loaded, unloaded = [], []
        for name, adapter in wanted.items():
            if name not in serving:
                router.load(name, adapter["capability"], adapter["version"], adapter["path"], adapter["capability"])
                loaded.append(name)
        for name in serving - set(wanted):
            router.unload(name)
            unloaded.append(name)
        return loaded, unloaded
