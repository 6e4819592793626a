"""An agent's profile: what its own policy requires before it changes state, with the evidence.

The built-in rules were written for conversational agents whose policy says "read the record, list
the change, get an explicit yes". An autonomous agent that acts on explicit instructions ("Please
perform ALL of the following operations: mark t6 as done, …") has no such rule, and a labeler that
assumes it calls every one of its successful runs LACKING. So each agent (its ``service.name``) gets
a profile, and the labelers consult it: a rule the agent's policy does not have is NA, never LACKING.

Each rule is decided, in this order, by
1. the agent's ``[[agents]]`` entry in the configuration (``source = "config"``);
2. a sentence of its system instructions (``"instructions"``, the sentence is the evidence);
3. its observed successful runs (``"observed"``): with at least ``MIN_OBSERVED`` successful runs
   that change state, a rule kept in at least ``KEPT`` of them is the agent's, one kept in fewer is
   not (the share is the evidence);
and is otherwise undecided (``"none"``: shown so, never assumed). An undecided rule leaves the
labeler's definition as it is, with one exception: where confirmation is not required by the
profile, a change the user's own message states (the entity and the change) is authorized by
that message (``request_authorizes``, undecided counts as yes).

``Profiles`` keeps them per agent: derived again from the agent's newest runs when the last
derivation is older than ``refresh_s`` and stored (``agent_profiles``); when an agent's profile
changes, its labels of the capabilities that consult profiles are dropped, so the next pass labels
them again under it.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from tracefix.daemon.core.settings import AgentSettings

MIN_OBSERVED = 10  # successful runs that change state before the observed share decides a rule
KEPT = 0.8  # a rule kept in at least this share of them is the agent's; in fewer, it is not
CONSULTING = ("precondition_verification", "multi_step_completion")  # the capabilities whose labels depend on profiles

_SENTENCES = re.compile(r"(?<=[.!?])\s+|\n+")
# "you must … obtain explicit user confirmation (yes)", "ask the user to confirm", "confirm with the customer".
_CONFIRMATION = re.compile(
    r"\b(?:obtain|get|ask for|request|require|requires|need|needs|wait for|receive)\b[^.]{0,60}?\bconfirm(?:ation|s|ed)?\b"
    r"|\b(?:ask|have|let) the (?:user|customer|requester|caller) (?:to )?confirm\b"
    r"|\bconfirm(?:ation)?\b[^.]{0,40}\b(?:with|from) the (?:user|customer|requester|caller)\b"
    r"|\bexplicit(?:ly)?\b[^.]{0,30}\b(?:yes|confirm(?:ation|s|ed)?|approv(?:al|e|es|ed))\b",
    re.IGNORECASE,
)
# "Never change a booking without the user's confirmation": a negated "without" requires it.
_NOT_WITHOUT_CONFIRMATION = re.compile(
    r"\b(?:not|never|no|don't|cannot|can't|must not)\b[^.]{0,60}?\bwithout\b[^.]{0,40}?\b(?:confirm(?:ation|ing|ed)?|approv(?:al|e)|a yes|asking)\b",
    re.IGNORECASE,
)
# "without asking back", "do not ask for confirmation", "never wait for approval", "no need to confirm".
_NO_CONFIRMATION = re.compile(
    r"\b(?:without|never|no need to|do not|don't|does not|doesn't|need not|not)\b[^.]{0,20}?"
    r"\b(?:ask(?:ing)?(?: back| again| the user)?|confirm(?:ation|ing)?|wait(?:ing)? for|approv(?:al|e))\b",
    re.IGNORECASE,
)
# "Perform every operation the user asks for", "carry out all of the user's requests", "act on the user's instructions".
_REQUEST_AUTHORIZES = re.compile(
    r"\b(?:perform|carry out|execute|do|complete|apply)\b[^.]{0,20}?\b(?:every|all|each)\b[^.]{0,40}?"
    r"\b(?:operations?|tasks?|requests?|changes?|instructions?|actions?)\b"
    r"|\bact(?:s)? on\b[^.]{0,30}?\b(?:instructions?|requests?)\b"
    r"|\bthe (?:user|customer)'s (?:request|instruction|message) (?:is|counts as|serves as) (?:the |its |their )?(?:confirmation|approval|authori[sz]ation)\b",
    re.IGNORECASE,
)
# "look up the account … before any change", "make sure the rules apply before calling the API".
_READ_FIRST = re.compile(
    r"\b(?:look(?:s)? up|check|verify|read|retrieve|fetch|get|review|make sure|confirm the facts)\b[^.]{0,80}?\bbefore\b[^.]{0,40}?"
    r"\b(?:chang|modif|updat|cancel|delet|writ|act|reset|book|call|perform|mak|tak|apply|edit|proceed)"
    r"|\bbefore\b[^.]{0,60}?\b(?:chang|modif|updat|cancel|delet|act|reset|book|edit)\w*[^.]{0,40}?\b(?:look(?:s)? up|check|verify|read|retrieve|fetch|review)\b",
    re.IGNORECASE,
)
_NO_READ_FIRST = re.compile(
    r"\b(?:no need to|do not need to|don't need to|need not|without)\b[^.]{0,20}?\b(?:look(?:ing)? up|check(?:ing)?|read(?:ing)?|verify(?:ing)?|fetch(?:ing)?)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule of an agent's policy: ``value`` True (it has it), False (it has not) or None
    (undecided); ``source`` "config", "instructions", "observed" or "none"; ``evidence`` the
    configuration entry, the sentence, or the observed share."""

    value: bool | None
    source: str
    evidence: str

    @property
    def lacks(self) -> bool:
        """Whether the policy is known not to have this rule (a labeler then says NA, never LACKING)."""
        return self.value is False


UNDECIDED = Rule(None, "none", "nothing in its instructions or runs decides it")


@dataclass(frozen=True, slots=True)
class Observation:
    """What one successful run that changed state did before its changes: whether each change was
    read first, confirmed by the user after the read, and stated (entity and change) in the user's
    own message."""

    read_first: bool
    confirmed: bool
    requested: bool


@dataclass(frozen=True, slots=True)
class AgentProfile:
    """What an agent's policy requires before a change of state, each rule with its evidence."""

    agent: str
    confirmation: Rule = UNDECIDED  # writes need the user's explicit confirmation
    read_first: Rule = UNDECIDED  # a read of the entity comes before a write
    request_authorizes: Rule = UNDECIDED  # the user's own request (entity and change) authorizes a write
    state_changing_tools: tuple[str, ...] | None = None  # from [[agents]]; None: the [capabilities] name patterns
    handoff_tools: tuple[str, ...] | None = None  # from [[agents]]; None: the [capabilities] name patterns
    observed_runs: int = 0  # successful runs that changed state, of those read
    refused: tuple[str, ...] = ()  # overrides not applied, with the reason

    def authorized_by_request(self) -> bool:
        """Whether a change the user's own message states needs no separate yes: unless the policy
        requires confirmation (then not even so) or says the request does not authorize."""
        return self.confirmation.value is not True and self.request_authorizes.value is not False

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["rules"] = {name: data.pop(name) for name in ("confirmation", "read_first", "request_authorizes")}
        return data

    @property
    def fingerprint(self) -> str:
        """What the labels depend on: the rules' values and the tool overrides (not their evidence)."""
        values = [self.confirmation.value, self.read_first.value, self.request_authorizes.value, self.state_changing_tools, self.handoff_tools]
        return hashlib.sha256(orjson.dumps(values)).hexdigest()[:16]


def from_instructions(text: str) -> dict[str, Rule]:
    """The rules the agent's instructions state, each with its sentence (only those they state)."""
    found: dict[str, Rule] = {}
    for sentence in (part.strip(" -*\t") for part in _SENTENCES.split(text or "")):
        if not sentence:
            continue
        quoted = sentence if len(sentence) <= 400 else sentence[:399] + "…"
        if "confirmation" not in found:
            if _NOT_WITHOUT_CONFIRMATION.search(sentence):
                found["confirmation"] = Rule(True, "instructions", quoted)
            elif _NO_CONFIRMATION.search(sentence) and not _CONFIRMATION.search(_NO_CONFIRMATION.sub("", sentence)):
                found["confirmation"] = Rule(False, "instructions", quoted)
                found.setdefault("request_authorizes", Rule(True, "instructions", quoted))
            elif _CONFIRMATION.search(sentence):
                found["confirmation"] = Rule(True, "instructions", quoted)
        if "request_authorizes" not in found and _REQUEST_AUTHORIZES.search(sentence):
            found["request_authorizes"] = Rule(True, "instructions", quoted)
        if "read_first" not in found:
            if _NO_READ_FIRST.search(sentence):
                found["read_first"] = Rule(False, "instructions", quoted)
            elif _READ_FIRST.search(sentence):
                found["read_first"] = Rule(True, "instructions", quoted)
    return found


def from_observations(observations: Sequence[Observation]) -> dict[str, Rule]:
    """The rules the agent's successful runs that changed state show: kept in at least ``KEPT`` of
    them, the agent's; in fewer, not. Nothing below ``MIN_OBSERVED`` runs."""
    if len(observations) < MIN_OBSERVED:
        return {}
    total = len(observations)
    rules = {}
    for name, kept, what in (
        ("read_first", sum(item.read_first for item in observations), "read the entity before changing it"),
        ("confirmation", sum(item.confirmed for item in observations), "had the user's confirmation after the read"),
    ):
        share = kept / total
        rules[name] = Rule(share >= KEPT, "observed", f"{what} in {kept} of {total} successful runs that changed state ({share:.0%})")
    if not rules["confirmation"].value:
        requested = sum(item.requested for item in observations)
        share = requested / total
        rules["request_authorizes"] = Rule(
            share >= KEPT, "observed", f"changed what the user's own message stated in {requested} of {total} successful runs without a yes ({share:.0%})"
        )
    return rules


def derive(
    agent: str, instructions: str, observations: Sequence[Observation], override: AgentSettings | None, known_tools: Iterable[str]
) -> AgentProfile:
    """The agent's profile: configuration first, then its instructions, then its observed runs (the
    module's order). An override naming a tool the agent has never declared or called is refused
    with the name, and that override is not applied."""
    rules: dict[str, Rule] = {name: UNDECIDED for name in ("confirmation", "read_first", "request_authorizes")}
    rules |= from_observations(observations)
    rules |= from_instructions(instructions)
    refused: list[str] = []
    tools: dict[str, tuple[str, ...] | None] = {"state_changing_tools": None, "handoff_tools": None}
    if override is not None:
        for name in rules:
            value = getattr(override, name)
            if value is not None:
                rules[name] = Rule(value, "config", f"[[capabilities.agents]] name = {agent!r}: {name} = {str(value).lower()}")
        known = set(known_tools)
        for name in tools:
            listed = getattr(override, name)
            if listed is None:
                continue
            unknown = sorted(set(listed) - known)
            if unknown:
                refused.append(
                    f"[[capabilities.agents]] {agent!r} {name} names {', '.join(map(repr, unknown))}, which the agent never declared or called"
                    f" (its tools: {', '.join(sorted(known)[:12]) or 'none seen yet'}); not applied"
                )  # fmt: skip
                continue
            tools[name] = tuple(listed)
    return AgentProfile(
        agent, rules["confirmation"], rules["read_first"], rules["request_authorizes"], tools["state_changing_tools"], tools["handoff_tools"],
        len(observations), tuple(refused),
    )  # fmt: skip


def unknown_agents(overrides: Sequence[AgentSettings], agents: Iterable[str]) -> list[str]:
    """The refusals of ``[[agents]]`` entries that name no agent that has sent runs."""
    seen = set(agents)
    return [
        f"[[capabilities.agents]] names {item.name!r}, which no agent that has sent runs is called (agents: {', '.join(sorted(seen)[:12]) or 'none yet'});"
        " not applied"
        for item in overrides
        if item.name not in seen
    ]  # fmt: skip


def instructions_of(system_turns: Sequence[str]) -> str:
    """An agent's instructions: the system prompt its runs carry most often."""
    counted = Counter(text for text in system_turns if text and text.strip())
    return counted.most_common(1)[0][0] if counted else ""


@dataclass(slots=True)
class Profiles:
    """Each agent's profile, derived again when older than ``refresh_s``, stored, and compared with
    the one stored: ``refresh`` returns the agents whose profile changed (their labels are stale)."""

    derive_one: Callable[[str], AgentProfile]
    load: Callable[[], dict[str, tuple[str, dict[str, Any]]]]  # agent -> (fingerprint, profile) as stored
    save: Callable[[AgentProfile], None]
    successes: Callable[[str], int]  # how many successful runs the agent has sent
    refresh_s: float = 300.0
    profiles: dict[str, AgentProfile] = field(default_factory=dict)
    derived_at: dict[str, float] = field(default_factory=dict)
    basis: dict[str, int] = field(default_factory=dict)  # the agent's successful runs when last derived
    stored: dict[str, str] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)  # the analysis pass and the API both refresh

    def get(self, agent: str) -> AgentProfile | None:
        return self.profiles.get(agent)

    def _due(self, agent: str, now: float, successes: int) -> bool:
        """Due after ``refresh_s``, or at once when the agent's successful runs have doubled since (at
        least ``MIN_OBSERVED`` of them): a profile derived from the first runs of an import is not
        kept while the rest arrive."""
        grown = successes >= 2 * max(self.basis.get(agent, 0), MIN_OBSERVED // 2)
        return grown or now - self.derived_at.get(agent, 0.0) >= self.refresh_s

    def refresh(self, agents: Iterable[str], force: bool = False) -> list[str]:
        """Derive the profiles of `agents` that are due (all with `force`); the agents whose
        profile differs from the one stored before."""
        with self.lock:
            return self._refresh(agents, force)

    def _refresh(self, agents: Iterable[str], force: bool) -> list[str]:
        if self.stored is None:
            self.stored = {agent: fingerprint for agent, (fingerprint, _) in self.load().items()}
        now = time.monotonic()
        changed = []
        for agent in agents:
            successes = self.successes(agent)
            if not force and agent in self.profiles and not self._due(agent, now, successes):
                continue
            profile = self.derive_one(agent)
            self.profiles[agent], self.derived_at[agent], self.basis[agent] = profile, now, successes
            if self.stored.get(agent) != profile.fingerprint:
                if agent in self.stored:
                    changed.append(agent)
                self.stored[agent] = profile.fingerprint
            self.save(profile)
        return changed
