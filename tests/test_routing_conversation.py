"""Routing decided once per conversation and held by its id, and the generalist that serves where no
targeted adapter does: a routing table over the embedded backend with a tiny random model and real
LoRA adapters, and one request through the real HTTP router."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import torch  # noqa: F401  (installed by make test: never skipped)
import transformers  # noqa: F401  (installed by make test: never skipped)
import peft  # noqa: F401  (installed by make test: never skipped)


from tracefix.daemon.core import generalist, tracks  # noqa: E402
from tracefix.router import routing  # noqa: E402
from tracefix.router.embedded import EmbeddedBackend  # noqa: E402
from tracefix.router.routing import Classifier, Lease, RoutingTable  # noqa: E402
from tests.conftest import serving_router  # noqa: E402
from tests.lora_support import make_adapter  # noqa: E402

TOKEN = "conversation-test-token"
DESCRIPTIONS = {"billing": "Questions about invoices, refunds and payments.", "shipping": "Tracking parcels and delivery dates."}
BILLING = [("billing", DESCRIPTIONS["billing"])]  # the classifier's candidates with billing live
BOTH = [*BILLING, ("shipping", DESCRIPTIONS["shipping"])]  # ... with shipping live too
PROMPTS = [f"Request {index}: " + words for index, words in enumerate(
    ["my invoice is wrong", "where is my parcel", "I want to send it back", "hello", "refund please",
     "delivery date?", "exchange size", "what is two plus two", "cancel everything", "is it raining"]
)]  # fmt: skip
AGENT = "airline-support-agent"
AIRLINE = generalist.capability(AGENT)  # generalist.airline-support-agent


@pytest.fixture(scope="module")
def backend(wide_tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBackend]:
    embedded = EmbeddedBackend(str(wide_tiny_model), tmp_path_factory.mktemp("cache"), max_context_tokens=1024)
    yield embedded
    embedded.stop()


@pytest.fixture(scope="module")
def adapter(wide_tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, int], Path]:
    """The directory of a real adapter `capability` v`version`, made once per module."""
    root = tmp_path_factory.mktemp("adapters")
    made: dict[tuple[str, int], Path] = {}

    def directory(capability: str, version: int) -> Path:
        if (capability, version) not in made:
            seed = 10 * len(made) + version
            made[capability, version] = make_adapter(wide_tiny_model, root / capability / f"v{version}", capability, version, seed)
        return made[capability, version]

    return directory


@pytest.fixture
def table(backend: EmbeddedBackend) -> Iterator[RoutingTable]:
    routes = RoutingTable(backend, "classifier")
    yield routes
    for live in routes.live():
        routes.remove(live.name)
    routes.close()


@pytest.fixture
def load(table: RoutingTable, adapter: Callable[[str, int], Path]) -> Callable[..., None]:
    """Load `capability` v`version` into the table, described as `DESCRIPTIONS` says."""

    def loaded(capability: str, version: int, canary: float | None = None) -> None:
        table.add(capability, version, adapter(capability, version), DESCRIPTIONS.get(capability, ""), canary)

    return loaded


@pytest.fixture
def candidates(table: RoutingTable, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The names the table's classifier is offered, one list per request it is asked about."""
    offered: list[list[str]] = []
    choose = table.classifier.choose

    def recorded(first_user: str, names: Any) -> str | None:
        offered.append([name for name, _ in names])
        return choose(first_user, names)

    monkeypatch.setattr(table.classifier, "choose", recorded)
    return offered


def route(table: RoutingTable, first_user: str | None, conversation: str | None = None, agent: str | None = None) -> Lease:
    """Route one request and end it at once."""
    lease = table.acquire(None, first_user, conversation, agent)
    table.release(lease)
    return lease


def prompt_where(backend: EmbeddedBackend, wanted: Callable[[Classifier, str], bool]) -> str:
    """A prompt of `PROMPTS` for which `wanted(classifier, prompt)` holds, under a classifier of its own."""
    classifier = Classifier(backend)
    found = next((prompt for prompt in PROMPTS if wanted(classifier, prompt)), None)
    assert found is not None, "no prompt makes the tiny model's classifier choose as this test needs"
    return found


# -- held by conversation -------------------------------------------------------------------------


def test_a_conversation_keeps_its_first_choice_after_an_adapter_the_classifier_prefers_goes_live(
    table: RoutingTable, load: Callable[..., None], backend: EmbeddedBackend
) -> None:
    # A prompt the classifier sends to billing alone, and elsewhere once shipping is a candidate too.
    prompt = prompt_where(backend, lambda c, p: c.choose(p, BILLING) == "billing" and c.choose(p, BOTH) != "billing")
    now_preferred = Classifier(backend).choose(prompt, BOTH)
    load("billing", 1)
    first = route(table, prompt, "c-1")
    assert (first.capability, first.reason, first.adapter) == ("billing", "classifier", "billing@v1")
    assert table.snapshot()["held_conversations"] == 1

    load("shipping", 1)
    table.classifier._cache.clear()  # as an evicted cache would
    later = route(table, prompt, "c-1")
    assert (later.capability, later.reason, later.adapter) == ("billing", "held", "billing@v1")
    fresh = route(table, prompt, "c-2")  # a new conversation with the same words goes where the classifier now says
    assert (fresh.capability, fresh.reason) == (now_preferred, "classifier")
    assert table.snapshot()["held_conversations"] == 2


def test_a_request_without_a_conversation_id_is_routed_afresh_each_time(
    table: RoutingTable, load: Callable[..., None], backend: EmbeddedBackend
) -> None:
    prompt = prompt_where(backend, lambda c, p: c.choose(p, BILLING) == "billing" and c.choose(p, BOTH) != "billing")
    load("billing", 1)
    assert (route(table, prompt).capability, route(table, prompt).reason) == ("billing", "classifier")
    load("shipping", 1)
    again = route(table, prompt)
    assert again.reason == "classifier" and again.capability != "billing"
    assert table.snapshot()["held_conversations"] == 0


def test_a_held_capability_follows_its_new_version_and_is_forgotten_once_removed(
    table: RoutingTable, load: Callable[..., None], backend: EmbeddedBackend
) -> None:
    prompt = prompt_where(backend, lambda c, p: c.choose(p, BILLING) == "billing")
    load("billing", 1)
    assert route(table, prompt, "c-1").adapter == "billing@v1"
    load("billing", 2)  # a hot swap: the capability is held, not the version
    swapped = route(table, prompt, "c-1")
    assert (swapped.adapter, swapped.reason) == ("billing@v2", "held")

    table.remove("billing@v2")
    afresh = route(table, prompt, "c-1")
    assert afresh.reason == "classifier" and afresh.adapter is None  # no candidate left: the base model
    assert route(table, prompt, "c-1").reason == "held"  # and that new choice is held in turn


def test_the_memory_of_conversations_is_bounded_and_forgets_the_oldest(
    table: RoutingTable, load: Callable[..., None], backend: EmbeddedBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(routing, "CONVERSATIONS", 2)
    load("billing", 1)
    for conversation in ("c-1", "c-2", "c-3"):
        assert route(table, PROMPTS[0], conversation).reason == "classifier"
    assert table.snapshot()["held_conversations"] == 2
    assert route(table, PROMPTS[0], "c-3").reason == "held"
    assert route(table, PROMPTS[0], "c-1").reason == "classifier"  # the oldest was forgotten


def test_modes_fixed_and_off_and_pinned_requests_ignore_the_memory(
    table: RoutingTable, load: Callable[..., None]
) -> None:
    load("billing", 1)
    load("shipping", 1)
    route(table, PROMPTS[0], "c-1")
    table.set_mode("fixed", "shipping")
    assert (route(table, PROMPTS[0], "c-1").capability, route(table, PROMPTS[0], "c-1").reason) == ("shipping", "fixed")
    table.set_mode("off")
    assert route(table, PROMPTS[0], "c-1").adapter is None
    pinned = table.acquire("billing@v1", PROMPTS[0], "c-1")
    table.release(pinned)
    assert (pinned.adapter, pinned.reason) == ("billing@v1", "pinned")


# -- the generalist -------------------------------------------------------------------------------


def test_the_generalist_serves_where_the_classifier_picks_base_and_is_never_a_candidate(
    table: RoutingTable, load: Callable[..., None], backend: EmbeddedBackend, candidates: list[list[str]]
) -> None:
    to_base = prompt_where(backend, lambda c, p: c.choose(p, BILLING) is None)
    to_billing = prompt_where(backend, lambda c, p: c.choose(p, BILLING) == "billing")
    load(AIRLINE, 1)
    served = route(table, to_base, agent=AGENT)  # no targeted candidate: the classifier is not asked
    assert (served.capability, served.reason, served.adapter) == (AIRLINE, "generalist", f"{AIRLINE}@v1")
    assert candidates == []
    load("billing", 1)

    served = route(table, to_base, agent=AGENT)
    assert (served.capability, served.reason, served.adapter) == (AIRLINE, "generalist", f"{AIRLINE}@v1")
    assert route(table, to_billing, agent=AGENT).capability == "billing"  # a targeted adapter still wins
    assert route(table, to_base, agent="hotel-agent").adapter is None  # another agent: the base model
    assert route(table, to_base).capability == AIRLINE  # no agent, one generalist: that one
    assert route(table, None, agent=AGENT).capability == AIRLINE  # no user turn to classify
    assert candidates and all(names == ["billing"] for names in candidates)

    load(generalist.capability("hotel-agent"), 1)
    assert route(table, to_base).adapter is None  # no agent and two generalists: the base model
    assert route(table, to_base, agent="hotel-agent").adapter == "generalist.hotel-agent@v1"


def test_an_agents_track_is_a_candidate_for_that_agents_requests_only(
    table: RoutingTable, adapter: Callable[[str, int], Path], candidates: list[list[str]]
) -> None:
    """One agent's track (``<capability>.<agent>``, ``daemon.core.tracks``) serves that agent; a bare
    capability serves everyone; a request naming no agent is the only served agent's."""
    airline_billing, hotel_billing = tracks.name("billing", AGENT), tracks.name("billing", "hotel agent")
    assert hotel_billing == "billing.hotel-agent"
    table.add(airline_billing, 1, adapter(airline_billing, 1), DESCRIPTIONS["billing"])
    route(table, PROMPTS[0], agent=AGENT)
    route(table, PROMPTS[0])  # no agent named, one agent served: its tracks
    route(table, PROMPTS[0], agent="hotel agent")  # another agent: not a candidate, nothing to ask
    assert candidates == [[airline_billing], [airline_billing]]
    table.add(hotel_billing, 1, adapter(hotel_billing, 1), DESCRIPTIONS["billing"])
    table.add("shipping", 1, adapter("shipping", 1), DESCRIPTIONS["shipping"])
    candidates.clear()
    route(table, PROMPTS[0], agent="hotel agent")
    route(table, PROMPTS[0], agent=AGENT)
    route(table, PROMPTS[0])  # two agents served and none named: only what serves everyone
    assert candidates == [[hotel_billing, "shipping"], [airline_billing, "shipping"], ["shipping"]]


def test_a_request_naming_no_agent_is_recognised_by_its_system_instructions(
    table: RoutingTable, adapter: Callable[[str, int], Path], candidates: list[list[str]]
) -> None:
    airline, hotel = "You are the support agent of SkyWays.\nConfirm before changing a booking.", "You are the hotel desk."
    airline_billing, hotel_billing = tracks.name("billing", AGENT), tracks.name("billing", "hotel-agent")
    table.add(airline_billing, 1, adapter(airline_billing, 1), DESCRIPTIONS["billing"], instructions=[tracks.instructions_key(airline)])
    table.add(hotel_billing, 1, adapter(hotel_billing, 1), DESCRIPTIONS["billing"], instructions=[tracks.instructions_key(hotel)])
    described = {item["name"]: item["instructions"] for item in table.snapshot()["adapters"]}
    assert described == {f"{airline_billing}@v1": 1, f"{hotel_billing}@v1": 1}

    def offered(instructions: str | None) -> list[str]:
        candidates.clear()
        table.release(table.acquire(None, PROMPTS[0], None, None, None, instructions))
        return candidates[0] if candidates else []

    assert offered("You are the support agent of SkyWays.  Confirm before changing a booking.") == [airline_billing]  # spacing aside
    assert offered(hotel) == [hotel_billing]
    assert offered("You are someone else.") == [] and offered(None) == []  # two agents, none recognised: nothing to offer
    # The agent the request names wins over its instructions.
    candidates.clear()
    table.release(table.acquire(None, PROMPTS[0], None, "hotel-agent", None, airline))
    assert candidates == [[hotel_billing]]


def test_fixed_routing_on_a_capability_serves_each_agent_its_own_track(table: RoutingTable, adapter: Callable[[str, int], Path]) -> None:
    track = tracks.name("billing", AGENT)
    table.add(track, 1, adapter(track, 1), DESCRIPTIONS["billing"])
    table.set_mode("fixed", "billing")  # a bare capability: every agent's track of it
    assert route(table, PROMPTS[0], agent=AGENT).adapter == f"{track}@v1"
    assert route(table, PROMPTS[0]).adapter == f"{track}@v1"  # one agent served: its track
    assert route(table, PROMPTS[0], agent="hotel-agent").adapter is None  # no track of its own: the base model
    with pytest.raises(routing.RoutingError, match="not a live or canary adapter"):
        table.set_mode("fixed", "shipping")


def test_a_held_conversation_holds_the_generalist_and_its_canary_arm(
    table: RoutingTable, load: Callable[..., None], backend: EmbeddedBackend
) -> None:
    to_base = prompt_where(backend, lambda c, p: c.choose(p, BILLING) is None)
    load("billing", 1)
    load(AIRLINE, 1)
    load(AIRLINE, 2, canary=0.5)
    first = {conversation: route(table, to_base, conversation, AGENT) for conversation in ("c-1", "c-2", "c-3", "c-4")}
    assert all(lease.reason == "generalist" and lease.capability == AIRLINE for lease in first.values())
    assert sorted(lease.adapter for lease in first.values()) == [f"{AIRLINE}@v1"] * 2 + [f"{AIRLINE}@v2"] * 2
    for conversation, lease in first.items():
        later = route(table, to_base, conversation, AGENT)
        assert (later.reason, later.adapter, later.arm) == ("held", lease.adapter, lease.arm)


def test_a_targeted_adapters_first_canary_is_compared_with_the_generalist_not_the_bare_base(
    table: RoutingTable, load: Callable[..., None], backend: EmbeddedBackend
) -> None:
    """The control arm of a capability's first canary is what serves the agent without it: its
    generalist, whose weights the canary started from."""
    to_billing = prompt_where(backend, lambda c, p: c.choose(p, BILLING) == "billing")
    load(AIRLINE, 1)
    load("billing", 1, canary=0.5)
    leases = [route(table, to_billing, f"c-{index}", AGENT) for index in range(4)]
    assert all(lease.capability == "billing" for lease in leases)
    arms = sorted((lease.arm, lease.adapter) for lease in leases)
    assert arms == [("canary", "billing@v1")] * 2 + [("control", f"{AIRLINE}@v1")] * 2
    # An agent without a generalist: its control arm is the base model.
    assert {route(table, to_billing, f"h-{index}", "hotel-agent").adapter for index in range(4)} == {"billing@v1", None}


# -- through the HTTP router ----------------------------------------------------------------------


@pytest.fixture
def router(wide_tiny_model: Path, tmp_path: Path) -> Iterator[str]:
    config = tmp_path / "tracefix.toml"
    config.write_text(
        f'[store]\npath = "{tmp_path / "tracefix.duckdb"}"\n[model]\nname = "{wide_tiny_model}"\n'
        f'[router]\ntoken = "{TOKEN}"\nrouting = "classifier"\nmax_context_tokens = 1024\nexport_spans = false\n'
    )
    with serving_router(config) as (url, _, _):
        yield url


def _routed(url: str, reason: str) -> float:
    line = f'tracefix_router_routing_seconds_count{{reason="{reason}"}}'
    text = httpx.get(f"{url}/metrics").text
    return sum(float(row.rsplit(" ", 1)[1]) for row in text.splitlines() if row.startswith(line))


def test_the_http_router_serves_the_named_agents_generalist_and_holds_the_conversation(
    router: str, adapter: Callable[[str, int], Path]
) -> None:
    admin = {"Authorization": f"Bearer {TOKEN}"}
    body = {"capability": AIRLINE, "version": 1, "path": str(adapter(AIRLINE, 1))}
    loaded = httpx.post(f"{router}/admin/adapters", json=body, headers=admin, timeout=30)
    assert loaded.status_code == 200, loaded.text
    refused = httpx.post(f"{router}/admin/adapters", json={**body, "capability": "generalist.x@v1"}, headers=admin)
    assert refused.status_code == 400 and "generalist" in refused.text
    for name in ("generalist", "billing.hotel agent", "Billing.hotel-agent", "billing."):  # no agent, unsafe, no capability
        refused = httpx.post(f"{router}/admin/adapters", json={**body, "capability": name}, headers=admin)
        assert refused.status_code == 400 and "<capability>.<agent>" in refused.text, name
    refused = httpx.post(f"{router}/admin/adapters", json={**body, "version": 2, "instructions": ["You are SkyWays."]}, headers=admin)
    assert refused.status_code == 400 and "not an instructions digest" in refused.text
    before = {reason: _routed(router, reason) for reason in ("generalist", "held")}

    def chat(agent: str) -> httpx.Response:
        request = {"model": "base", "messages": [{"role": "user", "content": "My flight was cancelled."}], "max_tokens": 2,
                   "metadata": {"conversation_id": f"c-{agent}", "agent": agent}}  # fmt: skip
        return httpx.post(f"{router}/v1/chat/completions", json=request, timeout=60)

    first = chat(AGENT)
    assert first.status_code == 200, first.text
    assert first.json()["model"] == f"{AIRLINE}@v1"
    assert chat(AGENT).json()["model"] == f"{AIRLINE}@v1"
    assert chat("hotel-agent").json()["model"] == "base"
    assert _routed(router, "generalist") == before["generalist"] + 1
    assert _routed(router, "held") == before["held"] + 1
    snapshot = httpx.get(f"{router}/admin/routing", headers=admin).json()
    assert snapshot["held_conversations"] == 2
