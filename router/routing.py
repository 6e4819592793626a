"""The routing table: which adapter serves each request, and hot swaps that never break one in flight.

Modes: ``off`` (always the base model), ``fixed`` (one capability's live version, or base),
``classifier`` (the paper's: the frozen base model reads the first user turn and picks a one-token
label) and ``gate`` (the token-level mixture of ``trainer.gate``, with gate weights trained for
exact adapter versions). A request takes a lease on the version it starts with. Loading
``<capability>@v<N+1>`` points the capability at it at once; the old version stops taking requests
and is unloaded when its last lease comes back. A gate cannot mix a version it was not trained
for, so replacing or removing one of its adapters falls back to classifier routing.

In classifier mode routing is per conversation, as the paper routes per task: the first request of
a conversation (``metadata.conversation_id``) is classified, and the capability chosen (or the base
model) is held for all its later requests without asking the classifier again (reason ``held``),
so a new adapter going live, a changed candidate set or an evicted cache never moves a conversation
mid-way. The capability is held, not the version: a hot swap still sends the conversation's next
request to the new version, and a canary keeps it on its arm. A held capability with no live or
canary version left is forgotten and the conversation routed afresh. The memory holds the last
`CONVERSATIONS` conversations and is the process's. A request without an id is classified on its
first user turn each time (cached).

With ``hold_conversations`` false (``[router] hold_conversations``) the table keeps no memory of
conversations: every request is classified on its own, on its latest user turn (what is being asked
now) rather than its first (what the task is). A canary still keeps a conversation on its arm.

Adapters of one agent's track (``daemon.core.tracks``: ``<capability>.<agent>``) are candidates only
for that agent's requests: the agent named in ``metadata.agent``, or for a request naming none, the
only agent whose tracks are served. A bare capability's adapters are candidates for every request.

A generalist (``daemon.core.generalist``: the capability ``generalist.<agent>``) is its agent's
default, not a classifier candidate: where the classifier picks the base model (or has no targeted
candidate, or no first user turn to read), the generalist of the agent the request names in
``metadata.agent`` serves (reason ``generalist``); a request naming no agent gets the only live
generalist, if there is exactly one; otherwise the base model serves.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracefix.daemon.core import generalist, tracks
from tracefix.daemon.core.states import ServingRole
from tracefix.router import metrics
from tracefix.router.backend import AdapterConflict, Backend, BackendUnavailable, GateSpec
from tracefix.router.split import CANARY_ARM, Split
from tracefix.trainer.adapters import AdapterRejected, read_manifest

log = logging.getLogger(__name__)

MODES = ("classifier", "gate", "fixed", "off")
BASE = "base"  # the fixed target and classifier label that mean "no adapter"
GATE = "gate"  # the expert name of requests the token-level gate serves
LABELS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
CLASSIFIER_INSTRUCTIONS = (
    "Choose the expert that should answer the user's request below. Reply with the expert's label only.\n"
)
CLASSIFIER_CHARS = 4000  # of the first user turn; the label depends on what the task is, not its details
CLASSIFIER_CACHE = 1024  # an agent repeats its first user turn on every step of a run
CONVERSATIONS = 65_536  # conversations whose routing is held: far more than are under way at once


class RoutingError(ValueError):
    """A routing change that cannot be made; the message says why."""


class UnknownAdapter(LookupError):
    """No live adapter has this name."""


def adapter_name(capability: str, version: int) -> str:
    """Adapters are served under versioned names, never reloaded under an old one."""
    return f"{capability}@v{version}"


@dataclass(slots=True)
class LiveAdapter:
    name: str
    capability: str
    version: int
    description: str
    path: str
    loaded_at: float
    in_flight: int = 0
    retiring: bool = False
    split: Split | None = field(default=None, repr=False)  # a canary's: which conversations it takes
    # Digests of its agent's system instructions (``daemon.core.tracks.instructions_key``): a request
    # that names no agent but carries one of them is that agent's.
    instructions: frozenset[str] = frozenset()

    @property
    def canary(self) -> float | None:
        """A canary's share of its capability's traffic."""
        return self.split.share if self.split is not None else None

    @property
    def role(self) -> ServingRole:
        return ServingRole.RETIRING if self.retiring else ServingRole.CANARY if self.canary is not None else ServingRole.LIVE

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "capability": self.capability,
            "version": self.version,
            "description": self.description,
            "path": self.path,
            "loaded_at": self.loaded_at,
            "in_flight": self.in_flight,
            "state": ServingRole.RETIRING if self.retiring else ServingRole.LIVE,
            "role": self.role,
            "canary": self.canary,
            "instructions": len(self.instructions),
        }


@dataclass(slots=True)
class Lease:
    """Where one request goes: an adapter name, `GATE`, or None for the base model. ``experts`` are
    the adapter versions the request holds until it is released."""

    adapter: str | None
    reason: str
    experts: tuple[str, ...] = ()
    gate: GateSpec | None = None
    capability: str | None = None  # whose traffic this request is, when routing picked a capability
    arm: str | None = None  # while that capability has a canary: "canary" or "control"
    released: bool = field(default=False, repr=False)


def classifier_messages(first_user: str, options: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
    """The classifier's prompt: each label with its capability's description, then the user turn it
    routes on (the first; the latest when conversations are not held)."""
    listing = "".join(f"{label}: {description}\n" for label, description in options)
    system = f"{CLASSIFIER_INSTRUCTIONS}{listing}{BASE}: none of the above; answer as a general assistant."
    return [{"role": "system", "content": system}, {"role": "user", "content": first_user[:CLASSIFIER_CHARS]}]


class Classifier:
    """Routes by the base model's next-token logits over the label tokens A, B, C… and "base"."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.label_ids = [backend.token_id(label) for label in (*LABELS, BASE)]
        if len(set(self.label_ids)) != len(self.label_ids):
            raise ValueError("the tokenizer starts two classifier labels with the same token")
        self._cache: OrderedDict[tuple[Any, ...], str | None] = OrderedDict()
        self._cache_lock = threading.Lock()

    def scores(self, first_user: str, descriptions: Sequence[str]) -> list[float]:
        """Logits of the labels of `descriptions` (in order), then of "base"."""
        options = list(zip(LABELS, descriptions))
        prompt = self.backend.encode_chat(classifier_messages(first_user, options))
        return self.backend.next_token_scores(prompt, [*self.label_ids[: len(options)], self.label_ids[-1]])

    def choose(self, first_user: str, candidates: Sequence[tuple[str, str]]) -> str | None:
        """The name of the candidate (name, description) whose label scores highest, or None for base."""
        key = (first_user, tuple(candidates))
        with self._cache_lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        scores = self.scores(first_user, [description for _, description in candidates])
        best = max(range(len(scores)), key=scores.__getitem__)
        # A backend that reports only its top tokens scores an unseen label -inf; none seen is base.
        choice = candidates[best][0] if best < len(candidates) and scores[best] > float("-inf") else None
        with self._cache_lock:
            self._cache[key] = choice
            while len(self._cache) > CLASSIFIER_CACHE:
                self._cache.popitem(last=False)
        return choice


class RoutingTable:
    """Live adapters, the mode, and the leases requests hold on adapter versions."""

    def __init__(
        self, backend: Backend, mode: str = "classifier", fixed: str | None = None, hold_conversations: bool = True
    ) -> None:
        self.backend = backend
        self.hold_conversations = hold_conversations  # false: every request classified on its latest user turn
        self.classifier = Classifier(backend)
        self.adapters: dict[str, LiveAdapter] = {}
        self.current: dict[str, str] = {}  # capability -> the version its traffic goes to
        self.canaries: dict[str, str] = {}  # capability -> a new version taking a share of that traffic
        self.mode = "off"
        self.fixed: str | None = None  # in mode fixed: the capability it follows; None is the base model
        self.gate: GateSpec | None = None  # in mode gate: the gate weights and the versions they mix
        # conversation id -> the capability its first request was routed to (`BASE`: the base model)
        self.conversations: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()  # the table itself; held only for bookkeeping
        self._admin = threading.Lock()  # loads, removals and mode changes take turns
        self._retirements = ThreadPoolExecutor(1, thread_name_prefix="retire")
        if mode == GATE:
            raise RoutingError(
                "routing 'gate' cannot be the mode at start: a gate mixes live adapters, and none are loaded yet; "
                "start with 'classifier' and switch with PUT /admin/routing once its adapters are live"
            )
        self.set_mode(mode, fixed if mode == "fixed" else None, strict=False)

    # -- requests ---------------------------------------------------------------------------------

    def acquire(
        self,
        pinned: str | None,
        first_user: str | None,
        conversation: str | None = None,
        agent: str | None = None,
        latest_user: str | None = None,
        instructions: str | None = None,
    ) -> Lease:
        """Route one request and hold its adapter version until `release`. `pinned` is a live adapter
        name the client asked for by model name; otherwise the mode decides. `conversation` (the
        client's conversation id) holds a conversation's classifier choice and keeps it on one canary
        arm; without it, its first user turn keeps the arm. `agent` names whose generalist serves
        where the classifier picks no targeted capability. `latest_user`, the request's last user
        turn, is what the classifier reads instead of the first when conversations are not held.
        `instructions`, the request's system message, names its agent where `agent` does not."""
        started = time.perf_counter()
        lease = self._route(pinned, first_user, conversation, agent, latest_user, instructions)
        metrics.ROUTING_SECONDS.labels(lease.reason).observe(time.perf_counter() - started)
        return lease

    def _route(
        self,
        pinned: str | None,
        first_user: str | None,
        conversation: str | None,
        agent: str | None,
        latest_user: str | None,
        instructions: str | None = None,
    ) -> Lease:
        unit = conversation or first_user
        turn = first_user if self.hold_conversations else latest_user or first_user
        with self._lock:
            if pinned is not None:
                adapter = self.adapters.get(pinned)
                if adapter is None or adapter.retiring:
                    raise UnknownAdapter(pinned)
                lease = self._hold("pinned", [pinned])
                lease.capability = adapter.capability
                return lease
            if self.mode == "off":
                return Lease(None, "off")
            if self.mode == "fixed":
                if self.fixed is None:
                    return Lease(None, "fixed")
                return self._serve("fixed", self._fixed_for(agent, instructions), unit, agent)
            if self.mode == GATE and self.gate is not None:
                lease = self._hold(GATE, list(self.gate.adapters))
                lease.adapter, lease.gate = GATE, self.gate
                return lease
            held = self._recall(conversation) if self.hold_conversations else None
            if held is not None:
                return self._serve("held", None if held == BASE else held, unit, agent)
            agent = self._agent(agent, instructions)
            candidates = [
                (capability, self.adapters[self.current.get(capability) or self.canaries[capability]].description)
                for capability in self._serving()
                if not generalist.is_generalist(capability) and tracks.serves(capability, agent)
            ][: len(LABELS)]
        # The forward pass runs outside the table lock; a swap meanwhile sends the request to the
        # capability's new version, as it would any request that starts after the swap.
        capability = self.classifier.choose(turn, candidates) if candidates and turn else None
        with self._lock:
            reason = "classifier"
            if capability is None and (default := self._generalist(agent)) is not None:
                capability, reason = default, "generalist"
            # Without a user turn nothing was chosen yet.
            if self.hold_conversations and conversation is not None and first_user:
                self._remember(conversation, capability)
            return self._serve(reason, capability, unit, agent)

    def _serving(self) -> list[str]:
        """Capabilities with a live or canary version, by name (table lock held)."""
        return sorted(set(self.current) | set(self.canaries))

    def _fixed_for(self, agent: str | None, instructions: str | None) -> str:
        """The capability fixed routing sends this request to (table lock held): the one it names;
        where that is a bare capability served under no such name, the request's agent's track of
        it (``tool_call_precision`` → ``tool_call_precision.<agent>``)."""
        fixed = self.fixed or ""
        if fixed in self.current or fixed in self.canaries or tracks.agent_of(fixed) is not None:
            return fixed
        owner = self._agent(agent, instructions)
        track = tracks.name(fixed, owner) if owner else fixed
        return track if track in self.current or track in self.canaries else fixed

    def _agent(self, agent: str | None, instructions: str | None = None) -> str | None:
        """The agent a request is served for: the one it names; where it names none, the agent whose
        adapters were loaded with its system instructions' digest, else the only agent whose tracks
        (or generalist) are served (table lock held). An agent's track serves that agent only
        (``daemon.core.tracks``); a bare capability's adapters serve everyone."""
        if agent:
            return agent
        serving = [self.adapters[name] for name in (*self.current.values(), *self.canaries.values())]
        if instructions:
            key = tracks.instructions_key(instructions)
            recognised = {tracks.agent_of(adapter.capability) for adapter in serving if key in adapter.instructions} - {None}
            if len(recognised) == 1:
                return recognised.pop()
        owners = {owner for adapter in serving if (owner := tracks.agent_of(adapter.capability)) is not None}
        return owners.pop() if len(owners) == 1 else None

    def _generalist(self, agent: str | None) -> str | None:
        """The generalist capability that serves `agent`'s requests, if it has a live or canary
        version; for a request naming no agent, the only such generalist (table lock held)."""
        generalists = [capability for capability in self._serving() if generalist.is_generalist(capability)]
        if agent:
            wanted = generalist.capability(agent)
            return wanted if wanted in generalists else None
        return generalists[0] if len(generalists) == 1 else None

    def _recall(self, conversation: str | None) -> str | None:
        """The capability (`BASE`: the base model) held for `conversation`, or None when it has none
        or its capability has no live or canary version left, which forgets it (table lock held)."""
        if conversation is None or conversation not in self.conversations:
            return None
        held = self.conversations[conversation]
        if held != BASE and held not in self.current and held not in self.canaries:
            del self.conversations[conversation]
            return None
        self.conversations.move_to_end(conversation)
        return held

    def _remember(self, conversation: str, capability: str | None) -> None:
        """Hold `capability` (None: the base model) for the conversation's later requests (table lock held)."""
        self.conversations[conversation] = capability or BASE
        self.conversations.move_to_end(conversation)
        while len(self.conversations) > CONVERSATIONS:
            self.conversations.popitem(last=False)

    def _serve(self, reason: str, capability: str | None, unit: str | None, agent: str | None = None) -> Lease:
        """Hold the version that serves `capability`'s request (table lock held): its live version, or
        its canary for the canary's share of conversations (`router.split`: permuted blocks). A
        conversation keeps its arm for all of its requests: the split remembers `unit`, its id or
        else its first user turn. (The turn alone splits by what users ask: an agent whose users open
        with the same words puts them all on one arm, and the arms then differ by task as well as by
        version.)"""
        if capability is None:
            return Lease(None, reason)
        current, canary = self.current.get(capability), self.canaries.get(capability)
        arm = None
        if canary is not None:
            arm = self.adapters[canary].split.arm(unit)  # type: ignore[union-attr]  # under the table lock
            current = canary if arm == CANARY_ARM else current
        if current is None and not generalist.is_generalist(capability) and (default := self._generalist(agent)) is not None:
            # The control arm of a targeted capability's first canary: what serves the agent without
            # it, its generalist (whose weights the canary started from), not the bare base.
            current = self.current.get(default)
        lease = self._hold(reason, [current] if current else [])
        lease.capability, lease.arm = capability, arm
        return lease

    def _hold(self, reason: str, names: list[str]) -> Lease:
        for name in names:
            self.adapters[name].in_flight += 1
        return Lease(names[0] if len(names) == 1 else None, reason, tuple(names))

    def release(self, lease: Lease) -> None:
        """Give the lease's versions back; a retiring version whose last request ended is unloaded."""
        if lease.released:
            return
        lease.released = True
        due = []
        with self._lock:
            for name in lease.experts:
                adapter = self.adapters[name]
                adapter.in_flight -= 1
                if adapter.retiring and adapter.in_flight == 0:
                    due.append(adapter)
        for adapter in due:
            # Off the caller's thread: unloading waits for the current decode step.
            self._retirements.submit(self._unload, adapter)

    # -- administration ---------------------------------------------------------------------------

    def add(
        self,
        capability: str,
        version: int,
        path: Path,
        description: str,
        canary: float | None = None,
        instructions: Sequence[str] = (),
    ) -> dict[str, Any]:
        """Load `<capability>@v<version>` and switch the capability's traffic to it; the previous
        version retires. With `canary`, the new version takes only that share of the traffic (the
        rest stays where it was) until `promote`; a canary it replaces retires. `instructions`: the
        digests of its agent's system instructions. A rejected adapter raises `AdapterRejected` and
        changes nothing."""
        name = adapter_name(capability, version)
        if canary is not None and not 0 < canary < 1:
            raise RoutingError(f"a canary takes a share of the traffic strictly between 0 and 1, not {canary}")
        with self._admin:
            with self._lock:
                if name in self.adapters:
                    state = ServingRole.RETIRING if self.adapters[name].retiring else ServingRole.LIVE
                    raise AdapterConflict(f"{name} is already loaded ({state}); load new weights under a new version")
            started = time.perf_counter()
            try:
                manifest = read_manifest(path)
                if manifest.get("capability") != capability or manifest.get("version") != version:
                    found = f"{manifest.get('capability')!r} v{manifest.get('version')}"
                    raise AdapterRejected(f"{path} holds {found}, not {capability!r} v{version}")
                self.backend.load(name, path)
            except (AdapterRejected, AdapterConflict, BackendUnavailable):
                metrics.SWAPS.labels("refused").inc()
                raise
            with self._lock:
                self.adapters[name] = LiveAdapter(
                    name, capability, version, description or capability.replace("_", " "), str(path), time.time(),
                    split=Split(canary) if canary is not None else None, instructions=frozenset(instructions),
                )
                replaced = [self.canaries.pop(capability, None)]
                if canary is None:
                    replaced.append(self.current.get(capability))
                    self.current[capability] = name
                else:
                    self.canaries[capability] = name
                retired = [self._retire(old) for old in replaced if old]
            seconds = time.perf_counter() - started
            metrics.SWAPS.labels("loaded").inc()
            metrics.SWAP_SECONDS.observe(seconds)
            previous = ", ".join(old for old in replaced if old) or None
            role = f"{ServingRole.CANARY} at {canary:.0%}" if canary is not None else ServingRole.LIVE
            log.info("%s %s (%s) in %.3f s", name, role, f"replacing {previous}" if previous else "new", seconds)
            for adapter in retired:
                if adapter is not None:
                    self._unload(adapter)
            return {**self.adapters[name].describe(), "replaced": previous, "seconds": round(seconds, 4)}

    def promote(self, name: str) -> dict[str, Any]:
        """A canary takes all of its capability's traffic; the version it replaces retires."""
        with self._admin:
            with self._lock:
                adapter = self.adapters.get(name)
                if adapter is None or adapter.retiring:
                    raise UnknownAdapter(name)
                if self.canaries.get(adapter.capability) != name:
                    raise RoutingError(f"{name} is not a canary; only a canary can be promoted")
                del self.canaries[adapter.capability]
                previous = self.current.get(adapter.capability)
                self.current[adapter.capability] = name
                adapter.split = None
                retired = self._retire(previous) if previous else None
                description = adapter.describe()
            metrics.SWAPS.labels("promoted").inc()
            log.info("%s promoted to all %s traffic%s", name, adapter.capability, f", replacing {previous}" if previous else "")
            if retired is not None:
                self._unload(retired)
            return {**description, "replaced": previous}

    def remove(self, name: str) -> dict[str, Any]:
        """Stop routing to a live adapter; it is unloaded once its in-flight requests end."""
        with self._admin:
            with self._lock:
                adapter = self.adapters.get(name)
                if adapter is None or adapter.retiring:
                    raise UnknownAdapter(name)
                if self.current.get(adapter.capability) == name:
                    del self.current[adapter.capability]
                if self.canaries.get(adapter.capability) == name:
                    del self.canaries[adapter.capability]
                retired = self._retire(name)
                description = adapter.describe()
            if retired is not None:
                self._unload(retired)
            return description

    def _retire(self, name: str) -> LiveAdapter | None:
        """Mark a version retiring (table lock held); returns it when nothing uses it any more."""
        adapter = self.adapters[name]
        adapter.retiring = True
        if self.gate is not None and name in self.gate.adapters:
            log.warning("%s retires and the gate was trained with it; routing falls back to classifier", name)
            self.mode, self.gate = "classifier", None
        return adapter if adapter.in_flight == 0 else None

    def _unload(self, adapter: LiveAdapter) -> None:
        try:
            self.backend.unload(adapter.name)
        finally:
            with self._lock:
                self.adapters.pop(adapter.name, None)
        log.info("%s unloaded", adapter.name)

    def set_mode(
        self, mode: str, adapter: str | None = None, gate: str | None = None, strict: bool = True
    ) -> dict[str, Any]:
        """Change the routing mode. With `strict`, a fixed adapter must be live now (an API caller's
        typo is refused); at start-up it may name a capability whose adapter is loaded later."""
        with self._admin:
            if mode not in MODES:
                raise RoutingError(f"unknown routing mode {mode!r}; one of {', '.join(MODES)}")
            if mode != "fixed" and adapter is not None:
                raise RoutingError(f"'adapter' applies to mode 'fixed' only, not {mode!r}")
            if mode != GATE and gate is not None:
                raise RoutingError(f"'gate' applies to mode 'gate' only, not {mode!r}")
            spec = self._gate_spec(gate) if mode == GATE else None
            fixed = self._fixed_target(adapter, strict) if mode == "fixed" else None
            with self._lock:
                self.mode, self.fixed, self.gate = mode, fixed, spec
            return self.snapshot()

    def _gate_spec(self, path: str | None) -> GateSpec:
        """Gate weights whose adapters are all live, installed once to prove they fit."""
        if not self.backend.supports_gate:
            raise RoutingError(
                "routing mode 'gate' needs the embedded backend: vLLM applies one LoRA adapter per request and "
                "cannot mix adapters token by token; use classifier, fixed or off with backend 'vllm'"
            )
        try:
            from tracefix.trainer.gate import gate_adapters
        except Exception as error:  # missing or broken, the caller's answer is the same
            raise RoutingError(f"routing mode 'gate' needs trainer.gate, which cannot be imported: {error}") from None
        if not path:
            raise RoutingError("mode 'gate' needs 'gate': the path of gate weights trained for live adapters")
        try:
            spec = GateSpec(Path(path), tuple(gate_adapters(Path(path))))
        except (OSError, ValueError) as error:
            raise RoutingError(f"cannot read gate weights {path}: {error}") from None
        with self._lock:
            missing = [name for name in spec.adapters if name not in self.current.values()]
        if missing:
            raise RoutingError(f"the gate mixes {', '.join(missing)}, which are not live; load them first")
        try:
            self.backend.check_gate(spec)
        except Exception as error:  # the gate module's own refusal, whatever its type
            raise RoutingError(f"the gate does not fit the live adapters: {error}") from None
        return spec

    def _fixed_target(self, adapter: str | None, strict: bool) -> str | None:
        """The capability fixed routing follows, None for the base model: naming a version follows its
        capability, so a later swap moves the fixed traffic to the new version too."""
        if not adapter:
            raise RoutingError("mode 'fixed' needs 'adapter': a live adapter name, its capability, or 'base'")
        if adapter == BASE:
            return None
        capability = adapter.partition("@")[0]
        with self._lock:
            # A bare capability also names every agent's track of it (_fixed_for).
            serving = {
                name for served, name in (*self.current.items(), *self.canaries.items())
                if served == capability or (tracks.agent_of(capability) is None and tracks.capability_of(served) == capability)
            }  # fmt: skip
            known = ", ".join(sorted({*self.current.values(), *self.canaries.values()})) or "none"
        # A capability whose only version is a canary is a target too: its traffic splits between
        # the canary and the base model, as it does when fixed routing names it from the start.
        if strict and (not serving or ("@" in adapter and adapter not in serving)):
            raise RoutingError(f"{adapter!r} is not a live or canary adapter, or their capability (serving: {known})")
        return capability

    def live(self) -> list[LiveAdapter]:
        """Adapters that take new requests, by name."""
        with self._lock:
            return sorted((adapter for adapter in self.adapters.values() if not adapter.retiring), key=lambda a: a.name)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "mode": self.mode,
                "fixed": (self.fixed or BASE) if self.mode == "fixed" else None,
                "gate": {"path": str(self.gate.path), "adapters": list(self.gate.adapters)} if self.gate else None,
                "capabilities": dict(sorted(self.current.items())),
                "canaries": {
                    capability: {"name": name, "share": self.adapters[name].canary, "control": self.current.get(capability)}
                    for capability, name in sorted(self.canaries.items())
                },
                "adapters": [adapter.describe() for _, adapter in sorted(self.adapters.items())],
                "hold_conversations": self.hold_conversations,
                "held_conversations": len(self.conversations),
            }

    def close(self) -> None:
        self._retirements.shutdown(wait=True)
