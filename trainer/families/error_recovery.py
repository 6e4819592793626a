"""error_recovery: the first call returns an error the agent must act on.

The task needs one call of one of the target's tools; the user gives every value. The backend's
answer to the first (otherwise correct) call is an error in the target's error shape
(``{"error": ..., "code": ...}``) that says how to fix it. The kind is picked per seed among those
the tool's schema fits:

- ``not_found``: the user's id (or email) has a typo (two adjacent characters swapped); the error
  says ``order_number O-12354 not found; did you mean O-12345?``. Fix: use the suggested value.
- ``date_format``: the user says the date in words (``March 5, 2026``); the error says
  ``date must be YYYY-MM-DD``. Fix: the ISO date.
- ``enum_value``: the user says an enumerated value in words (``change of plans``, ``Economy``);
  the error lists the allowed values. Fix: the matching enum value.
- ``transient``: ``rate limited, retry the same request``. Fix: send the same call again.

For the first three kinds the error answers any call that breaks the rule; an agent that already
sends the right value avoids it. Difficulty 2 chains two errors: a non-transient kind (where the
tools have one) and then a rate limit on the first call that gets past it, so the fixed call has to
be retried as well (two rate limits in a row where only the transient kind fits).

The first call the backend executes (it passes the rule, the schema, the id lookup and any rate
limit) is the scored one. Any plain text before it ends the episode (the agent gave up); the first
plain text after it is the final answer.
"""

from __future__ import annotations

import datetime as _dt
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from tracefix.trainer.environment import (
    DialogueInstance,
    Family,
    Message,
    StepResult,
    Tool,
    ToolCall,
    assistant_call,
    assistant_text,
    tool_message,
)
from tracefix.trainer.families._shared import PAST, shown
from tracefix.trainer.schema_values import Values, entity_of, id_parameters, is_write, properties, required
from tracefix.trainer.simulation import SETTLED_STATUSES, derive_seed, error_result, same_as_backend, schema_error, unknown_id

# -- local helpers (wording) -------------------------------------------------------------------------

MONTHS = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)  # fmt: skip
KINDS = ("not_found", "date_format", "enum_value", "transient")
_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _canonical(name: str, arguments: Any) -> bytes:
    return orjson.dumps({"name": name, "arguments": arguments}, option=orjson.OPT_SORT_KEYS)


# -- error kinds -----------------------------------------------------------------------------------


def _is_email(name: str, schema: dict[str, Any]) -> bool:
    return schema.get("format") == "email" or "email" in name.lower()


def _is_date(name: str, schema: dict[str, Any]) -> bool:
    lowered = name.lower()
    return (schema.get("format") == "date" or lowered.endswith("date") or lowered == "day") and not schema.get("pattern")


def _enum_phrase(value: str) -> str:
    """How a person says an enumerated value: ``change_of_plans`` → ``change of plans``, ``economy`` → ``Economy``."""
    if re.search(r"[_\-]", value):
        return re.sub(r"[_\-]+", " ", value).strip()
    if value != value.capitalize():
        return value.capitalize()
    return value.lower() if value != value.lower() else value.upper()


def _enum_fits(schema: dict[str, Any]) -> bool:
    values = schema.get("enum")
    if not isinstance(values, list) or len(values) < 2 or not all(isinstance(v, str) and v for v in values):
        return False
    phrases = [_enum_phrase(v) for v in values]
    return all(p not in values for p in phrases) and len({p.casefold() for p in phrases}) == len(values)


def _kinds_of(tool: Tool) -> list[tuple[str, str | None]]:
    """(kind, parameter) pairs this tool's schema fits, in a fixed order."""
    fits: list[tuple[str, str | None]] = []
    for name, schema in properties(tool).items():
        if not isinstance(schema, dict):
            continue
        if schema.get("type", "string") == "string" and not schema.get("enum"):
            if name in id_parameters(tool) or _is_email(name, schema):
                fits.append(("not_found", name))
            elif _is_date(name, schema):
                fits.append(("date_format", name))
        if _enum_fits(schema):
            fits.append(("enum_value", name))
    fits.append(("transient", None))
    return fits


def _typo(value: str, rng: random.Random, pattern: str | None) -> str | None:
    """The value with two adjacent, different alphanumeric characters swapped (before any ``@``)."""
    limit = value.index("@") if "@" in value else len(value)
    spots = [
        index for index in range(limit - 1)
        if value[index].isalnum() and value[index + 1].isalnum() and value[index].casefold() != value[index + 1].casefold()
    ]  # fmt: skip
    rng.shuffle(spots)
    for index in spots:
        typo = value[:index] + value[index + 1] + value[index] + value[index + 2 :]
        if not pattern or re.fullmatch(pattern, typo):
            return typo
    return None


def _date_words(iso: str) -> str:
    day = _dt.date.fromisoformat(iso)
    return f"{MONTHS[day.month - 1]} {day.day}, {day.year}"


def _iso_date_ok(value: Any) -> bool:
    if not isinstance(value, str) or not _ISO_DATE.fullmatch(value):
        return False
    try:
        _dt.date.fromisoformat(value)
    except ValueError:
        return False
    return True


def _listing(values: Values, noun: str, arguments: dict[str, Any], least: int) -> list[dict[str, Any]]:
    """What a search answers: a few matching items that echo the query."""
    results = []
    for _ in range(values.random.randint(least, 3)):
        item: dict[str, Any] = {f"{noun}_id": values.identifier(f"{noun}_id")}
        item.update({key: value for key, value in arguments.items() if not isinstance(value, (dict, list))})
        item["status"] = values.random.choice(["available", "limited"])
        item["price"] = round(values.random.uniform(20, 900), 2)
        results.append(item)
    return results


def _request_words(tool: Tool) -> str:
    """How the user names the task: ``cancel my reservation``, ``issue a refund``, ``search flights``."""
    verb, *rest = tool.name.split("_")
    thing = " ".join(rest)
    entities = [entity_of(param).replace("_", " ") for param in id_parameters(tool)]
    if not thing:
        return verb
    if thing in entities:
        return f"{verb} my {thing}"
    if entities and not thing.endswith("s"):
        return f"{verb} {'an' if thing[:1] in 'aeiou' else 'a'} {thing}"
    return f"{verb} the {thing}" if entities else f"{verb} {thing}"


_REPORTS = re.compile(
    r"error|not found|fail|unable|could ?n[o']t|can ?n[o']t|can't|invalid|rate.?limit|must be|problem|issue|"
    r"unfortunately|did you mean|try again|retry|does ?n[o']t exist|not exist|not accepted|rejected",
    re.IGNORECASE,
)

INSTRUCTIONS = (
    "You are a customer support agent. Carry out the user's request with the tools below. The user has "
    "already confirmed the request, so do not ask them again. When you are done, tell the user the outcome "
    "in plain text."
)


@dataclass(frozen=True, slots=True)
class _Plan:
    tool: Tool
    kind: str
    param: str | None
    expected: dict[str, Any]
    naive: dict[str, Any]  # the arguments as the user said them (the call that draws the error)
    transients: int  # rate limits before the backend executes a call that passes the rule


class ErrorRecoveryInstance(DialogueInstance):
    instructions = INSTRUCTIONS

    max_turns = 8

    def __init__(self, tools: Sequence[Tool], seed: int, difficulty: int, plan: _Plan) -> None:
        super().__init__(tools, seed, difficulty)
        self.by_name = {tool.name: tool for tool in self.tools}
        self.plan = plan
        self.tool = plan.tool
        rng = self.random
        self.known_ids = {param: value for param, value in plan.expected.items() if param in id_parameters(plan.tool)}
        details = "; ".join(f"{key}: {shown(value)}" for key, value in plan.naive.items())
        words = _request_words(self.tool)
        opener = rng.choice([
            "Hi, I need you to {words} for me.", "Hello! Please {words} for me.", "Could you please {words} for me?",
        ])  # fmt: skip
        self.request = opener.format(words=words) + (f" Details — {details}." if details else "")

        # the record the executed call returns
        values = Values(derive_seed("error_recovery", "result", seed, difficulty))
        verb = self.tool.name.split("_")[0]
        ids = [param for param in id_parameters(self.tool) if param in plan.expected]
        props = properties(self.tool)
        if is_write(self.tool):
            result: dict[str, Any] = {"status": PAST.get(verb, "done"), **plan.expected}
            result["confirmation_code"] = f"CF{values.random.randint(0, 999_999):06d}"
            subject = f"{entity_of(ids[0]).replace('_', ' ')} {plan.expected[ids[0]]}" if ids else "request"
            self.closing = f"All done: {self.tool.name} went through for your {subject} (status: {result['status']})."
        elif ids:  # the closing tells what the result shows (a made-up field the agent's records lack is not shown)
            key = ids[0]
            result = self.entities.record(
                entity_of(key), plan.expected[key], extra=4, key=key, statuses=SETTLED_STATUSES, facts=plan.expected
            )
            presented = self.present(self.tool, plan.expected, result)
            details = [
                f"{name} {value:.2f}" if isinstance(value, float) else f"{name} {value}"
                for name in ("status", "amount")
                if (value := presented.get(name)) is not None
            ]
            self.closing = f"Here is what I found for {plan.expected[ids[0]]}{': ' if details else ''}{', '.join(details)}."
        elif any(_is_email(key, props.get(key, {})) for key in plan.expected):  # a profile found by email
            noun = self.tool.name.split("_", 1)[-1].rstrip("s") or "item"
            result = self.entities.record(noun, values.identifier(f"{noun}_id"), extra=4, statuses=SETTLED_STATUSES, facts=plan.expected)
            presented = self.present(self.tool, plan.expected, result)
            holder = f" ({presented['customer_name']})" if "customer_name" in presented else ""
            self.closing = f"I found the {noun.replace('_', ' ')} {result[f'{noun}_id']}{holder}."
        else:
            noun = self.tool.name.split("_", 1)[-1].rstrip("s") or "item"
            results = _listing(values, noun, plan.expected, 2)
            result = {"results": results}
            self.closing = f"I found {len(results)} results for you; the first is {results[0][f'{noun}_id']}."
        self.result = result
        self._start()

    # -- episode state -----------------------------------------------------------------------------

    def _start(self) -> None:
        self.events = []
        self.transients_left = self.plan.transients
        self.failing: list[bytes] = []  # canonical forms of calls that failed for good (not rate limits)
        self.repeated = False
        self.designed_error_seen = False
        self.executed: bool | None = None  # None: not yet; then whether the executed call was the right one
        self.final_text: str | None = None
        self.gave_up_text: str | None = None
        self.finished = False

    def _on_text(self, text: str) -> StepResult:
        if self.executed is not None:
            self.final_text = text
        else:
            self.gave_up_text = text
        self.finished = True
        return StepResult([], True)

    # -- the simulated backend ---------------------------------------------------------------------

    def _fail(self, call: ToolCall, result: dict[str, Any], event: str | None = None) -> Message:
        self.failing.append(_canonical(call.name, call.arguments))
        if event:
            self.events.append(event)
        return tool_message(call, result)

    def _answer(self, call: ToolCall) -> Message:
        key = _canonical(call.name, call.arguments)
        if key in self.failing:
            self.repeated = True
            self.events.append(f"repeated the identical failing call {call.name}")
        tool = self.by_name.get(call.name)
        if tool is None:
            return self._fail(call, error_result(f"unknown tool {call.name!r}", "unknown_tool"), f"unknown tool {call.name!r}")
        if not isinstance(call.arguments, dict):
            return self._fail(call, error_result("arguments must be a JSON object", "invalid_arguments"), f"arguments of {call.name} are not a JSON object")
        arguments = call.arguments
        if tool.name == self.tool.name:
            return self._answer_task(call, arguments)
        problem = schema_error(tool, arguments)
        if problem is not None:
            return self._fail(call, error_result(f"invalid arguments for {call.name}: {problem}", "invalid_arguments"), f"schema violation in {call.name}")
        unknown = unknown_id(tool, arguments, self.known_ids)
        if unknown is not None:
            return self._fail(call, error_result(f"{unknown[0]} {shown(unknown[1])} not found", "not_found"))
        return tool_message(call, self._other_result(tool, arguments))

    def _answer_task(self, call: ToolCall, arguments: dict[str, Any]) -> Message:
        plan = self.plan
        if self.executed is not None:  # already done: a read answers again, a write is not repeated
            if is_write(self.tool):
                return tool_message(call, error_result(f"{self.tool.name} was already carried out", "conflict"))
            return tool_message(call, self.result)
        rule = self._rule_error(arguments)
        if rule is not None:
            self.designed_error_seen = True
            return self._fail(call, rule, f"{plan.kind} error on {call.name}")
        problem = schema_error(self.tool, arguments)
        if problem is not None:
            return self._fail(call, error_result(f"invalid arguments for {call.name}: {problem}", "invalid_arguments"), f"schema violation in {call.name}")
        unknown = unknown_id(self.tool, arguments, self.known_ids)
        if unknown is not None:
            return self._fail(call, error_result(f"{unknown[0]} {shown(unknown[1])} not found", "not_found"))
        if self.transients_left > 0:
            self.transients_left -= 1
            self.designed_error_seen = True
            self.events.append(f"rate limit on {call.name}")
            return tool_message(call, error_result("rate limited, retry the same request", "rate_limited", retry_after_s=1))
        self.executed = all(key in arguments and same_as_backend(arguments[key], value) for key, value in plan.expected.items())
        if not self.executed:
            self.events.append(f"executed {call.name} with wrong arguments")
            return tool_message(call, {**self.result, **arguments} if "results" not in self.result else self.result)
        return tool_message(call, self.result)

    def _rule_error(self, arguments: dict[str, Any]) -> dict[str, Any] | None:
        plan, param = self.plan, self.plan.param
        if param is None or param not in arguments:
            return None
        value = arguments[param]
        if plan.kind == "not_found":
            if same_as_backend(value, plan.expected[param]):
                return None
            if isinstance(value, str) and same_as_backend(value, plan.naive[param]):
                return error_result(f"{param} {value} not found; did you mean {plan.expected[param]}?", "not_found")
            return error_result(f"{param} {shown(value)} not found", "not_found")
        if plan.kind == "date_format" and not _iso_date_ok(value):
            return error_result(f"{param} must be YYYY-MM-DD; got '{shown(value)}'", "invalid_argument", field=param)
        if plan.kind == "enum_value":
            allowed = properties(self.tool)[param]["enum"]
            if value not in allowed:
                return error_result(f"{param} must be one of {', '.join(allowed)}; got '{shown(value)}'", "invalid_argument", field=param)
        return None

    def _other_result(self, tool: Tool, arguments: dict[str, Any]) -> dict[str, Any]:
        """A plausible answer of a tool the task does not need (nothing in it is scored)."""
        values = Values(derive_seed(self.seed, tool.name, _canonical(tool.name, arguments)))
        ids = [param for param in id_parameters(tool) if param in arguments]
        if is_write(tool):
            return {"status": PAST.get(tool.name.split("_")[0], "done"), **arguments}
        if ids:
            key = ids[0]
            return self.entities.record(entity_of(key), arguments[key], extra=4, key=key, statuses=SETTLED_STATUSES, facts=arguments)
        noun = tool.name.split("_", 1)[-1].rstrip("s") or "item"
        return {"results": _listing(values, noun, arguments, 1)}

    # -- scoring -----------------------------------------------------------------------------------

    def reward(self) -> float:
        rewards = ErrorRecoveryFamily.rewards
        if self.repeated:
            return rewards["repeated_failing_call"]
        if self.executed is not None:
            if not self.executed:
                return rewards["wrong_call_executed"]
            return rewards["fixed_and_answered"] if self.final_text else rewards["fixed_no_final_answer"]
        if self.gave_up_text and self.designed_error_seen and _REPORTS.search(self.gave_up_text):
            return rewards["gave_up_reporting_error"]
        return rewards["no_fix"]

    def solution(self) -> list[Message]:
        plan = self.plan
        calls = [plan.naive]
        if plan.kind != "transient":
            calls.append(plan.expected)
        calls.extend([plan.expected] * plan.transients)
        return [assistant_call(self.tool.name, dict(arguments)) for arguments in calls] + [assistant_text(self.closing)]

    def hint(self) -> str:
        return (
            f"Call {self.tool.name}; if it returns an error, change the call exactly as the error says "
            "(or send the same call again when it is rate limited), never repeat a failed call unchanged, "
            "then tell the user the outcome."
        )


class ErrorRecoveryFamily(Family):
    """The first call returns an error the agent must act on.

    Reward levels (``rewards`` holds the same numbers; the first call the backend executes is scored):

    - 1.0 ``fixed_and_answered``: the task's call succeeds with the right arguments (fixed as the
      error said, or retried after a rate limit) and a plain-text answer follows.
    - 0.6 ``fixed_no_final_answer``: the right call succeeds but no final answer (yet).
    - 0.2 ``gave_up_reporting_error``: no successful call; the agent stops with a text that
      reports the error to the user (only after it got the designed error).
    - 0.0 ``repeated_failing_call``: the identical call was sent again after it failed for good
      (a rate-limited call may be repeated), whatever happened after.
    - 0.0 ``wrong_call_executed``: the backend executed the task's tool with wrong values.
    - 0.0 ``no_fix``: no valid call, or a text that neither fixes nor reports anything.
    """

    name = "error_recovery"
    capability = "error_recovery"
    version = "1"
    description = "The first call fails with an actionable error; fix (or retry) the call, then answer."
    rewards = {
        "fixed_and_answered": 1.0,
        "fixed_no_final_answer": 0.6,
        "gave_up_reporting_error": 0.2,
        "repeated_failing_call": 0.0,
        "wrong_call_executed": 0.0,
        "no_fix": 0.0,
    }
    levels = (1, 2)

    def unusable(self, tools: Sequence[Tool]) -> str | None:
        if not tools:
            return "there are no tools"
        if not any(self._plan(tools, tool, kind, param, random.Random(0), 1) for tool, kind, param in self._options(tools)):
            return "no schema-valid arguments can be generated for any tool"
        return None

    @staticmethod
    def _options(tools: Sequence[Tool]) -> list[tuple[Tool, str, str | None]]:
        return [(tool, kind, param) for tool in tools for kind, param in _kinds_of(tool)]

    @staticmethod
    def _plan(tools: Sequence[Tool], tool: Tool, kind: str, param: str | None, rng: random.Random, transients: int) -> _Plan | None:
        """Schema-valid arguments for ``tool`` and the user's way of saying them, or None."""
        values = Values(rng.getrandbits(48))
        props = properties(tool)
        for _ in range(6):
            names = required(tool) + ([param] if param and param not in required(tool) else [])
            expected = {name: values.value(name, props[name]) for name in names}
            if schema_error(tool, expected) is not None:
                continue
            naive = dict(expected)
            if kind == "not_found":
                value = expected[param]
                typo = _typo(value, rng, props[param].get("pattern")) if isinstance(value, str) else None
                if typo is None:
                    return None
                naive[param] = typo
            elif kind == "date_format":
                naive[param] = _date_words(expected[param])
            elif kind == "enum_value":
                naive[param] = _enum_phrase(expected[param])
            return _Plan(tool, kind, param, expected, naive, transients)
        return None

    def build(self, tools: Sequence[Tool], seed: int, difficulty: int = 1) -> ErrorRecoveryInstance:
        if difficulty not in self.levels:
            raise ValueError(f"{self.name} has difficulty levels {self.levels}, not {difficulty}")
        rng = random.Random(derive_seed(self.name, "plan", seed, difficulty))
        options = self._options(tools)
        kinds = [kind for kind in KINDS if any(option[1] == kind for option in options)]
        if difficulty >= 2 and len(kinds) > 1:
            kinds.remove("transient")
        while kinds:
            kind = rng.choice(kinds)
            fitting = [option for option in options if option[1] == kind]
            rng.shuffle(fitting)
            for tool, _, param in fitting:
                transients = (1 if kind == "transient" else 0) if difficulty < 2 else (2 if kind == "transient" else 1)
                plan = self._plan(tools, tool, kind, param, rng, transients)
                if plan is not None:
                    return ErrorRecoveryInstance(tools, seed, difficulty, plan)
            kinds.remove(kind)
        raise ValueError(f"{self.name} cannot build an instance on these tools")
