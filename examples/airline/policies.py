"""What decides the agent's next message: a language model behind an OpenAI-compatible endpoint
(the tracefix router), or a scripted policy that follows the airline's policy except for the flaws
it is told to have, for planting a known capability gap in seconds without a model.

Both read the conversation as OpenAI chat messages and answer with a :class:`Reply`.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from examples.airline.instructions import SERVICE_NAME
from examples.airline.tools import openai_tools

_RESERVATION_ID = re.compile(r"\bR-\d{5}\b")
_USER_ID = re.compile(r"\bU-\d{4}\b")
_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
_QUOTED = re.compile(r'"([^"]+)"')


@dataclass
class ToolCallRequest:
    """A tool call the agent asked for; `arguments` is the JSON text as the model wrote it."""

    id: str
    name: str
    arguments: str


@dataclass
class Reply:
    """One assistant message and what the model endpoint said about it."""

    content: str
    tool_calls: list[ToolCallRequest] = field(default_factory=list)
    finish_reason: str = "stop"
    response_model: str | None = None
    response_id: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None

    def as_message(self) -> dict[str, Any]:
        """The reply as an OpenAI chat message, as it goes back to the model in the next request."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["content"] = self.content or None
            message["tool_calls"] = [
                {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
                for call in self.tool_calls
            ]
        return message


class PolicyError(Exception):
    """The model endpoint failed (unreachable, refused the request, server error)."""

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(message)
        self.error_type = error_type


class Policy(Protocol):
    name: str  # "llm" | "scripted"
    provider: str  # gen_ai.provider.name of its chat spans
    model: str  # gen_ai.request.model

    def respond(self, messages: list[dict[str, Any]], headers: dict[str, str], seed: int, conversation_id: str) -> Reply:
        """The next assistant message; `headers` carry the trace context to the model endpoint, and
        `conversation_id` names the conversation to it (OpenAI's request `metadata`)."""
        ...


class LLMPolicy:
    """Asks a model behind an OpenAI-compatible endpoint, offering the tools in OpenAI's format, and
    names the agent (its service name) to it, so the router can serve the agent's generalist."""

    name = "llm"
    provider = "openai"

    def __init__(
        self, client: Any, model: str = "base", max_tokens: int = 160, temperature: float = 0.7, agent: str = SERVICE_NAME
    ) -> None:
        self.client = client
        self.model = model
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.agent = agent
        self.tools = openai_tools()

    def respond(self, messages: list[dict[str, Any]], headers: dict[str, str], seed: int, conversation_id: str) -> Reply:
        import openai

        try:
            response = self.client.chat.completions.create(
                model=self.model, messages=messages, tools=self.tools, max_tokens=self.max_tokens,
                temperature=self.temperature, seed=seed, extra_headers=headers,
                metadata={"conversation_id": conversation_id, "agent": self.agent},
            )  # fmt: skip
        except openai.APIStatusError as error:
            message = f"the model endpoint answered {error.status_code}: {error.message}"
            raise PolicyError(str(error.status_code), message) from None
        except openai.APIConnectionError as error:
            raise PolicyError(type(error).__name__, f"the model endpoint is unreachable: {error}") from None
        except openai.APIError as error:  # e.g. a response that is not a chat completion
            raise PolicyError(type(error).__name__, f"the model endpoint's answer is unusable: {error}") from None
        if not response.choices:
            raise PolicyError("empty_response", "the model endpoint returned no choices")
        choice = response.choices[0]
        calls = [
            ToolCallRequest(call.id or f"call_{seed}_{index}", call.function.name or "", call.function.arguments or "")
            for index, call in enumerate(choice.message.tool_calls or [])
            if getattr(call, "function", None) is not None
        ]
        usage = response.usage
        return Reply(
            choice.message.content or "", calls, choice.finish_reason or "stop", response.model, response.id,
            usage.prompt_tokens if usage else None, usage.completion_tokens if usage else None,
        )  # fmt: skip


@dataclass
class _Seen:
    """What the scripted agent knows from the conversation so far."""

    user_texts: list[str]
    results: list[tuple[str, dict[str, Any], Any]]  # (tool, arguments, result or {"error": ...})
    last_user: str

    @classmethod
    def read(cls, messages: list[dict[str, Any]]) -> _Seen:
        calls: dict[str, tuple[str, dict[str, Any]]] = {}
        results = []
        for message in messages:
            for call in message.get("tool_calls") or []:
                calls[call["id"]] = (call["function"]["name"], json.loads(call["function"]["arguments"]))
            if message["role"] == "tool" and message.get("tool_call_id") in calls:
                name, arguments = calls[message["tool_call_id"]]
                results.append((name, arguments, json.loads(message["content"])))
        users = [str(message["content"]) for message in messages if message["role"] == "user"]
        last = str(messages[-1].get("content") or "") if messages[-1]["role"] == "user" else ""
        return cls(users, results, last)

    def result(self, tool: str) -> dict[str, Any] | None:
        """The latest successful result of a tool."""
        for name, _, result in reversed(self.results):
            if name == tool and isinstance(result, dict) and "error" not in result:
                return result
        return None

    def error(self) -> dict[str, Any] | None:
        """The error of the latest call, if it failed."""
        if self.results and isinstance(self.results[-1][2], dict) and "error" in self.results[-1][2]:
            return self.results[-1][2]
        return None

    def last(self, pattern: re.Pattern[str]) -> str | None:
        for text in reversed(self.user_texts):
            found = pattern.findall(text)
            if found:
                return found[-1]
        return None


class ScriptedPolicy:
    """A deterministic agent that follows the airline's policy, except for its planted flaws:
    `skip_confirmation` makes the change without asking the customer, `skip_read` cancels without
    reading the reservation first. Both are decided once per conversation."""

    name = "scripted"
    provider = "tracefix.examples"
    model = "scripted-agent"

    def __init__(self, rng: random.Random, skip_confirmation: bool = False, skip_read: bool = False) -> None:
        self.rng = rng
        self.skip_confirmation = skip_confirmation
        self.skip_read = skip_read
        self.applied: list[str] = []  # flaws that changed what the agent did

    def respond(self, messages: list[dict[str, Any]], headers: dict[str, str], seed: int, conversation_id: str) -> Reply:
        seen = _Seen.read(messages)
        intent = _intent(seen.user_texts[0])
        failed = seen.error()
        if failed is not None:
            return Reply(f"I'm sorry, I could not complete that: {failed.get('message', failed['error'])}.")
        user_id = seen.last(_USER_ID)
        if user_id is None:
            return Reply("Could you tell me your user id?")
        user = seen.result("get_user")
        if user is None:
            return self._call("get_user", {"user_id": user_id})
        rid = seen.last(_RESERVATION_ID)
        if rid is None:
            return Reply("Which reservation is this about? Please give me its reservation id.")
        reservation = seen.result("get_reservation")
        if reservation is not None and reservation["reservation_id"] != rid:
            reservation = None
        if intent == "cancel_reservation":
            return self._cancel(seen, rid, reservation)
        if reservation is None:
            return self._call("get_reservation", {"reservation_id": rid})
        if intent == "change_flight":
            return self._change(seen, reservation)
        if intent == "fix_passenger_name":
            return self._fix_name(seen, reservation)
        if intent == "baggage_allowance":
            return self._baggage(seen, user, reservation)
        return Reply("I can help with cancellations, flight changes, passenger names and baggage questions.")

    # -- one method per goal -----------------------------------------------------------------

    def _cancel(self, seen: _Seen, rid: str, reservation: dict[str, Any] | None) -> Reply:
        done = seen.result("cancel_reservation")
        if done is not None:
            return Reply(
                f"Reservation {done['reservation_id']} is cancelled; a refund of ${done['refund_amount']:.2f} goes to "
                f"{done['refund_to']}."
            )
        if reservation is None and not self._flaw("skip_read", self.skip_read):
            return self._call("get_reservation", {"reservation_id": rid})
        if not _confirmed(seen) and not self._flaw("skip_confirmation", self.skip_confirmation):
            if reservation is None:
                return Reply(f"Shall I cancel reservation {rid} now?")
            refund = 0.0 if reservation["cabin"] == "basic_economy" else reservation["total_price"]
            flight = reservation["flights"][0]
            return Reply(
                f"Reservation {rid} is flight {flight['flight_number']} from {reservation['origin']} to "
                f"{reservation['destination']} on {flight['date']}, {reservation['cabin']}. Cancelling it refunds "
                f"${refund:.2f}. Shall I cancel it?"
            )
        return self._call("cancel_reservation", {"reservation_id": rid, "reason": "change_of_plan"})

    def _change(self, seen: _Seen, reservation: dict[str, Any]) -> Reply:
        done = seen.result("update_reservation_flights")
        if done is not None:
            flight = done["flights"][0]
            money = (
                f"${done['amount_charged']:.2f} was charged to {done['payment_id']}" if done["amount_charged"]
                else f"${done['amount_refunded']:.2f} was refunded to {done['payment_id']}"
            )  # fmt: skip
            return Reply(
                f"Done: reservation {done['reservation_id']} is now on flight {flight['flight_number']} on "
                f"{flight['date']}, departing {flight['departure']}. The fare difference of {money}."
            )
        day = seen.last(_DATE)
        if day is None:
            return Reply("Which date would you like to fly on instead?")
        found = seen.result("search_flights")
        if found is None or found["date"] != day:
            return self._call("search_flights", {
                "origin": reservation["origin"], "destination": reservation["destination"], "date": day,
                "cabin": reservation["cabin"],
            })  # fmt: skip
        if not found["flights"]:
            return Reply(f"There are no flights from {reservation['origin']} to {reservation['destination']} on {day}.")
        earliest = min(found["flights"], key=lambda flight: flight["departure"])
        if not _confirmed(seen) and not self._flaw("skip_confirmation", self.skip_confirmation):
            return Reply(
                f"The earliest flight on {day} is {earliest['flight_number']}, departing {earliest['departure']}, at "
                f"${earliest['price']:.2f} per passenger (you paid ${reservation['flights'][0]['price']:.2f}). The fare "
                f"difference goes to {reservation['payment_id']}. Shall I move reservation "
                f"{reservation['reservation_id']} to it?"
            )
        return self._call("update_reservation_flights", {
            "reservation_id": reservation["reservation_id"], "flight_number": earliest["flight_number"], "date": day,
            "payment_id": reservation["payment_id"],
        })  # fmt: skip

    def _fix_name(self, seen: _Seen, reservation: dict[str, Any]) -> Reply:
        done = seen.result("update_passenger")
        quoted = _QUOTED.findall(seen.user_texts[0]) or next(
            (_QUOTED.findall(text) for text in seen.user_texts if _QUOTED.findall(text)), []
        )
        if len(quoted) < 2:
            return Reply("Which name should I change, and how should it be spelled?")
        stored, wanted = quoted[-2], quoted[-1]
        first, _, last = wanted.partition(" ")
        if done is not None:
            return Reply(f"Done: the passenger on reservation {done['reservation_id']} is now {wanted}.")
        names = [f"{p['first_name']} {p['last_name']}" for p in reservation["passengers"]]
        if stored not in names:
            return Reply(f"I can't find a passenger named {stored} on reservation {reservation['reservation_id']}.")
        if not _confirmed(seen) and not self._flaw("skip_confirmation", self.skip_confirmation):
            return Reply(
                f"On reservation {reservation['reservation_id']} I will change the passenger {stored} to {wanted}. "
                "Shall I make this change?"
            )
        return self._call("update_passenger", {
            "reservation_id": reservation["reservation_id"], "passenger_index": names.index(stored),
            "first_name": first, "last_name": last,
        })  # fmt: skip

    def _baggage(self, seen: _Seen, user: dict[str, Any], reservation: dict[str, Any]) -> Reply:
        policy = seen.result("get_baggage_policy")
        if policy is None:
            return self._call("get_baggage_policy", {"cabin": reservation["cabin"], "membership": user["membership"]})
        return Reply(
            f"On reservation {reservation['reservation_id']} ({policy['cabin']}, {policy['membership']} member) each "
            f"passenger can check {policy['free_checked_bags']} bags for free; each extra bag costs "
            f"${policy['extra_bag_fee']:.2f}."
        )

    # -- helpers -------------------------------------------------------------------------------

    def _flaw(self, name: str, active: bool) -> bool:
        if active and name not in self.applied:
            self.applied.append(name)
        return active

    def _call(self, name: str, arguments: dict[str, Any]) -> Reply:
        call_id = "call_" + "".join(self.rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(20))
        return Reply("", [ToolCallRequest(call_id, name, json.dumps(arguments))], "tool_calls")


def _intent(text: str) -> str:
    lowered = text.lower()
    if "cancel" in lowered:
        return "cancel_reservation"
    if "move" in lowered or ("change" in lowered and "flight" in lowered):
        return "change_flight"
    if "misspelled" in lowered or "name" in lowered:
        return "fix_passenger_name"
    if "bag" in lowered:
        return "baggage_allowance"
    return "unknown"


def _confirmed(seen: _Seen) -> bool:
    """The customer's latest message agrees to the change just proposed."""
    return seen.last_user.strip().lower().startswith("yes")
