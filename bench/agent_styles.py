"""Two agents of styles the τ-bench airline runs do not show, as seeded generators of `messages`-format
runs (`tracefix import --format messages`) with planted defects of known answer.

- ``todo-instructed``: a todo-ledger agent told to perform every operation the user lists, without
  asking back. The user's first message lists 2–5 operations on tasks by id; the agent writes
  (sometimes reading a task or the list first, often not) and ends with a short summary.
- ``helpdesk-confirming``: an IT-helpdesk agent whose policy requires looking the account up and the
  user's explicit "yes" before any change (reset_password, unlock_account, change_plan,
  cancel_subscription): read → summarise → ask → yes → write → answer.

Each agent's file holds 60 successful and 40 failed runs. Every failed run carries ONE planted
defect of a known capability, recorded as ``"planted": {"<capability>": "LACKING"}`` with a
``"defect"`` note for people (successful runs: ``"planted": {}``); `tracefix import` ignores both:

- tool_call_precision: a tool that does not exist, or arguments its schema refuses;
- argument_grounding: an id that appears nowhere before the call (a transposed or neighbouring id);
- precondition_verification (helpdesk only): a change without the read, or without the user's yes;
- error_recovery: a failing call repeated unchanged, or the run ending on the error;
- multi_step_completion: the run stops after a tool result, or skips the remaining operations;
- structured_data_reasoning: a number stated that no record supports.

The backends behave like real ones: lenient stores keep what a bad call sent, an unknown tool gets
the framework's error, a wrong id changes someone else's record. The successful runs vary on
purpose (reads or not, parallel calls, errors the agent fixes, answers with numbers), so that the
labelers' precision is measured on more than one way of doing it right.

Only `random.Random` draws anything, so a seed writes the same bytes on every machine.

    python bench/agent_styles.py                      # writes the four files of tests/fixtures/agents
    python bench/agent_styles.py --out DIR --runs 100
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "agents"

# (agent, file name, seed): a development file and a kept-back file per agent.
FILES = (
    ("todo-instructed", "todo-instructed.jsonl", 2601),
    ("todo-instructed", "todo-instructed-kept-back.jsonl", 8802),
    ("helpdesk-confirming", "helpdesk-confirming.jsonl", 4103),
    ("helpdesk-confirming", "helpdesk-confirming-kept-back.jsonl", 9904),
)
SUCCESS_SHARE = 0.6

TOOL_CALL_PRECISION = "tool_call_precision"
ARGUMENT_GROUNDING = "argument_grounding"
PRECONDITION_VERIFICATION = "precondition_verification"
ERROR_RECOVERY = "error_recovery"
MULTI_STEP_COMPLETION = "multi_step_completion"
STRUCTURED_DATA_REASONING = "structured_data_reasoning"


def _function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


# --- transcripts ---------------------------------------------------------------------------------


class Backend:
    """What the agent's tools reach: `execute` answers one call with a JSON record or an error."""

    def execute(self, name: str, arguments: dict[str, Any]) -> tuple[Any, str | None]:
        handler = getattr(self, f"tool_{name}", None)
        if handler is None:  # what the agent framework answers for a tool it does not have
            return None, f"unknown tool '{name}'"
        return handler(**arguments)


@dataclass
class Transcript:
    """One run's OpenAI chat messages, built turn by turn against a backend."""

    rng: random.Random
    backend: Backend
    messages: list[dict[str, Any]] = field(default_factory=list)

    def system(self, text: str) -> None:
        self.messages.append({"role": "system", "content": text})

    def user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    def say(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})

    def call(self, *calls: tuple[str, dict[str, Any]], note: str | None = None) -> list[tuple[Any, str | None]]:
        """One assistant turn making `calls` (in parallel when several), then each tool's answer."""
        ids = ["call_" + "".join(self.rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
                                 for _ in range(24)) for _ in calls]  # fmt: skip
        self.messages.append({
            "role": "assistant", "content": note,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
                for call_id, (name, arguments) in zip(ids, calls)
            ],
        })  # fmt: skip
        answers = []
        for call_id, (name, arguments) in zip(ids, calls):
            record, error = self.backend.execute(name, arguments)
            message: dict[str, Any] = {"role": "tool", "tool_call_id": call_id}
            if error is not None:
                message["content"] = f"Error: {error}"
                message["error"] = error
            else:
                message["content"] = json.dumps(record)
            self.messages.append(message)
            answers.append((record, error))
        return answers


def _mentioned(messages: list[dict[str, Any]], value: str) -> bool:
    """Whether `value` appears as a token anywhere in the transcript so far (calls included)."""
    pattern = re.compile(rf"(?<![\w-]){re.escape(value)}(?![\w-])")
    for message in messages:
        texts = [message.get("content") or ""]
        texts += [call["function"]["arguments"] for call in message.get("tool_calls") or []]
        if any(pattern.search(text) for text in texts):
            return True
    return False


def _money(value: float) -> str:
    return f"${value:,.2f}"


# --- todo-instructed ---------------------------------------------------------------------------

TODO_AGENT = "todo-instructed"
TODO_SYSTEM = """You are Ledger, the todo assistant of a small product team. The team's tasks live in a ledger that you \
reach only through your tools. Each task has an id (t1, t2, ...), a title, a status (open or done), an optional due date \
(YYYY-MM-DD), tags and story points.

Rules:
- Perform every operation the user asks for, in the order given. The user has already decided: do not ask for \
confirmation and do not ask follow-up questions.
- Use the task ids exactly as the user gives them.
- If a tool returns an error, read it and fix the call; if an operation truly cannot be done, say which one and why.
- When you are done, reply with a short summary of what you changed and answer anything the user asked."""

TODO_TOOLS = [
    _function("list_tasks", "List the tasks in the ledger, optionally only those with one status. Returns the tasks and "
              "their count.", {"status": {"type": "string", "enum": ["open", "done"]}}, []),
    _function("get_task", "Read one task by id.", {"task_id": {"type": "string", "pattern": "^t[0-9]+$"}}, ["task_id"]),
    _function(
        "update_task", "Change a task's status, title or due date; fields left out stay as they are. Returns the task.",
        {
            "task_id": {"type": "string", "pattern": "^t[0-9]+$"},
            "status": {"type": "string", "enum": ["open", "done"]},
            "title": {"type": "string", "minLength": 1, "maxLength": 80},
            "due": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$", "description": "YYYY-MM-DD"},
        },
        ["task_id"],
    ),
    _function(
        "add_tag", "Add a tag (lowercase letters, digits and dashes) to a task. Returns the task.",
        {"task_id": {"type": "string", "pattern": "^t[0-9]+$"}, "tag": {"type": "string", "pattern": "^[a-z0-9-]+$"}},
        ["task_id", "tag"],
    ),
    _function(
        "delete_task", "Delete a task. A task that blocks others is deleted only with force=true.",
        {"task_id": {"type": "string", "pattern": "^t[0-9]+$"}, "force": {"type": "boolean"}},
        ["task_id"],
    ),
]  # fmt: skip

_VERBS = ["Draft", "Review", "Update", "Migrate", "Fix", "Plan", "Prepare", "Clean up", "Write", "Test", "Ship", "Audit"]
_OBJECTS = [
    "onboarding guide", "Q1 budget", "CI pipeline", "release notes", "vendor contract", "team offsite", "staging database",
    "on-call rota", "API docs", "invoice backlog", "customer survey", "security review", "design system", "hiring plan",
    "sprint retro notes", "billing webhooks", "search ranking", "mobile login flow", "data retention policy", "status page",
]  # fmt: skip
_NEW_TITLES = [
    "Quarterly report", "Launch checklist", "Pricing page copy", "Support macros", "Partner onboarding", "Roadmap review",
    "Backup restore drill", "Accessibility fixes", "Load test plan", "Year-end close",
]  # fmt: skip
_TAGS = ["infra", "urgent", "backend", "frontend", "finance", "hiring", "docs", "q3-planning", "customer", "ops", "legal", "security"]
_POINTS = [1, 2, 3, 5, 8, 13]


class TodoLedger(Backend):
    """The ledger: lenient about what it stores (a bad status or date is kept as sent), strict about ids."""

    def __init__(self, rng: random.Random) -> None:
        count = rng.randint(12, 30)
        numbers = sorted(rng.sample(range(1, 61), count))
        self.tasks: dict[str, dict[str, Any]] = {}
        for number in numbers:
            task_id = f"t{number}"
            due = f"2026-{rng.randint(1, 4):02d}-{rng.randint(1, 28):02d}" if rng.random() < 0.7 else None
            self.tasks[task_id] = {
                "id": task_id, "title": f"{rng.choice(_VERBS)} {rng.choice(_OBJECTS)}",
                "status": "open" if rng.random() < 0.7 else "done", "due": due,
                "tags": sorted(rng.sample(_TAGS, rng.randint(0, 2))), "points": rng.choice(_POINTS),
            }  # fmt: skip
        self.blocking: set[str] = set()  # tasks others depend on: deleted only with force
        self.conflicted: set[str] = set()  # tasks another session changed: writes refused until read again

    def _task(self, task_id: str) -> dict[str, Any] | None:
        return self.tasks.get(task_id)

    def tool_list_tasks(self, status: str | None = None) -> tuple[Any, str | None]:
        tasks = [dict(task) for task in self.tasks.values() if status is None or task["status"] == status]
        return {"tasks": tasks, "count": len(tasks)}, None

    def tool_get_task(self, task_id: str) -> tuple[Any, str | None]:
        task = self._task(task_id)
        if task is None:
            return None, f"no task {task_id}"
        self.conflicted.discard(task_id)  # read again: the next write carries the new version
        return dict(task), None

    def tool_update_task(self, task_id: str, **changes: Any) -> tuple[Any, str | None]:
        task = self._task(task_id)
        if task is None:
            return None, f"no task {task_id}"
        if task_id in self.conflicted:
            return None, f"conflict: {task_id} was changed by another session since you last saw it; read it again and retry"
        task.update(changes)
        return dict(task), None

    def tool_add_tag(self, task_id: str, tag: str) -> tuple[Any, str | None]:
        task = self._task(task_id)
        if task is None:
            return None, f"no task {task_id}"
        if task_id in self.conflicted:
            return None, f"conflict: {task_id} was changed by another session since you last saw it; read it again and retry"
        if tag not in task["tags"]:
            task["tags"] = sorted([*task["tags"], tag])
        return dict(task), None

    def tool_delete_task(self, task_id: str, force: bool = False) -> tuple[Any, str | None]:
        if self._task(task_id) is None:
            return None, f"no task {task_id}"
        if task_id in self.blocking and not force:
            return None, f"{task_id} blocks other tasks; call delete_task with force=true to delete it anyway"
        del self.tasks[task_id]
        return {"deleted": task_id}, None


@dataclass
class Operation:
    kind: str  # done, reopen, tag, rename, delete, due
    task_id: str
    value: str | None = None  # the tag, the new title or the due date

    def request(self, rng: random.Random) -> str:
        """How a user writes it in the list."""
        phrases = {
            "done": ["mark {id} as done", "close {id}", "mark {id} done"],
            "reopen": ["reopen {id}", "set {id} back to open"],
            "tag": ["add the tag {value} to {id}", "tag {id} with {value}"],
            "rename": ["rename {id} to '{value}'", "change the title of {id} to '{value}'"],
            "delete": ["delete {id}", "remove {id} from the ledger"],
            "due": ["set the due date of {id} to {value}", "move the due date of {id} to {value}"],
        }
        return rng.choice(phrases[self.kind]).format(id=self.task_id, value=self.value)

    def call(self) -> tuple[str, dict[str, Any]]:
        """The correct tool call."""
        task_id = self.task_id
        if self.kind in ("done", "reopen"):
            return "update_task", {"task_id": task_id, "status": "done" if self.kind == "done" else "open"}
        if self.kind == "tag":
            return "add_tag", {"task_id": task_id, "tag": self.value}
        if self.kind == "rename":
            return "update_task", {"task_id": task_id, "title": self.value}
        if self.kind == "delete":
            return "delete_task", {"task_id": task_id}
        return "update_task", {"task_id": task_id, "due": self.value}

    def done_line(self) -> str:
        """The summary's line for it."""
        return {
            "done": "{id} marked as done", "reopen": "{id} reopened", "tag": "tag {value} added to {id}",
            "rename": "{id} renamed to '{value}'", "delete": "{id} deleted", "due": "due date of {id} set to {value}",
        }[self.kind].format(id=self.task_id, value=self.value)  # fmt: skip


def _todo_operations(rng: random.Random, ledger: TodoLedger, count: int, needs: str | None) -> list[Operation]:
    """`count` operations on distinct tasks, one of kind `needs` when given."""
    kinds = [rng.choice(["done", "done", "tag", "tag", "rename", "delete", "due", "due", "reopen"]) for _ in range(count)]
    if needs and needs not in kinds:
        kinds[rng.randrange(count)] = needs
    taken: set[str] = set()
    operations = []
    for kind in kinds:
        wanted = "done" if kind == "reopen" else "open"
        pool = [i for i, task in ledger.tasks.items() if i not in taken and (task["status"] == wanted or kind not in ("done", "reopen"))]
        task_id = rng.choice(pool or [i for i in ledger.tasks if i not in taken])
        taken.add(task_id)
        task = ledger.tasks[task_id]
        value = None
        if kind == "tag":
            value = rng.choice([tag for tag in _TAGS if tag not in task["tags"]])
        elif kind == "rename":
            value = rng.choice(_NEW_TITLES)
        elif kind == "due":
            value = f"2026-{rng.randint(2, 6):02d}-{rng.randint(1, 28):02d}"
        operations.append(Operation(kind, task_id, value))
    return operations


_DATE_WORDS = ["January", "February", "March", "April", "May", "June"]
# The operation a defect needs in the list: the call it spoils is of that kind.
_TODO_NEEDS = {
    (TOOL_CALL_PRECISION, "enum"): "done", (TOOL_CALL_PRECISION, "unknown_tool"): "done",
    (TOOL_CALL_PRECISION, "date_format"): "due", (ERROR_RECOVERY, "repeat"): "tag", (ERROR_RECOVERY, "ends_on_error"): "delete",
}  # fmt: skip


def _spelled_date(date: str) -> str:
    year, month, day = date.split("-")
    return f"{_DATE_WORDS[int(month) - 1]} {int(day)}, {year}"


def _todo_request(rng: random.Random, operations: list[Operation], report: str | None) -> str:
    opening = rng.choice([
        "Please perform ALL of the following operations:", "Do all of these in the ledger, please:",
        "I need the following changes made:", "Please perform ALL of the following operations in order:",
    ])  # fmt: skip
    lines = [opening, *(f"{number}. {op.request(rng)}" for number, op in enumerate(operations, start=1))]
    if report == "count":
        lines.append(rng.choice(["Afterwards, tell me how many tasks are still open.", "Then tell me how many open tasks are left."]))
    elif report == "points":
        lines.append(rng.choice(["Then tell me how many story points are still open.", "Afterwards, how many open story points remain?"]))
    return "\n".join(lines)


def _trouble(ledger: TodoLedger, op: Operation) -> None:
    """Make `op` meet an error a careful agent can fix: a task that blocks others (delete it with
    force), a task another session just changed (read it again, then retry)."""
    if op.kind == "delete":
        ledger.blocking.add(op.task_id)
    else:
        ledger.conflicted.add(op.task_id)


@dataclass
class TodoAgent:
    """The todo-instructed agent working through the user's list, with at most one planted lapse."""

    rng: random.Random
    ledger: TodoLedger
    transcript: Transcript
    capability: str | None
    variant: str | None
    done: list[str] = field(default_factory=list)  # the summary's lines
    refused: list[str] = field(default_factory=list)  # what it says it could not do

    def perform(self, op: Operation, spoiled: bool) -> None:
        """One operation: its call (the defect's call when `spoiled`), and after an error the fix a
        careful agent makes, or the planted lapse."""
        rng, transcript = self.rng, self.transcript
        name, arguments = op.call()
        if spoiled and self.capability == TOOL_CALL_PRECISION:
            name, arguments = {
                "enum": ("update_task", {"task_id": op.task_id, "status": "completed"}),
                "unknown_tool": ("complete_task", {"task_id": op.task_id}),
                "date_format": ("update_task", {"task_id": op.task_id, "due": _spelled_date(op.value or "2026-03-01")}),
            }[self.variant or "enum"]
        elif spoiled and self.capability == ARGUMENT_GROUNDING:
            arguments["task_id"] = self._unmentioned_task(op.task_id)
        [(_, error)] = transcript.call((name, arguments))
        if error is None or (spoiled and self.capability == TOOL_CALL_PRECISION):
            self.done.append(op.done_line())  # a spoiled call is reported as done all the same
            return
        if self.capability == ERROR_RECOVERY:
            if self.variant == "repeat":
                for _ in range(rng.choice([1, 1, 2])):
                    transcript.call((name, arguments), note=rng.choice([None, "Trying that again."]))
            if self.variant == "ends_on_error" and rng.random() < 0.5:
                self.done.append(op.done_line())  # glosses over the error
            else:
                self.refused.append(f"I couldn't {op.request(rng)}: the ledger refused it ({error}).")
            return
        if op.kind == "delete":
            transcript.call((name, {**arguments, "force": True}), note=f"You asked to delete {op.task_id}, so I'm forcing it.")
        else:
            transcript.call(("get_task", {"task_id": op.task_id}), note=f"{op.task_id} changed meanwhile; reading it again.")
            transcript.call((name, arguments))
        self.done.append(op.done_line())

    def _unmentioned_task(self, task_id: str) -> str:
        """An existing task the agent was never shown: the user's id with its digits swapped or one off."""
        number = int(task_id[1:])
        nearest = [f"t{str(number)[::-1]}", f"t{number + 1}", f"t{number - 1}", f"t{number + 10}", f"t{number - 10}"]
        for candidate in [*nearest, *self.ledger.tasks]:
            if candidate != task_id and candidate in self.ledger.tasks and not _mentioned(self.transcript.messages, candidate):
                return candidate
        raise RuntimeError("no unmentioned task id")  # 12+ tasks, at most 5 mentioned: never


def todo_run(rng: random.Random, defect: tuple[str, str] | None) -> list[dict[str, Any]]:
    """One todo-instructed run's messages: correct, or with the one planted `defect` (capability, variant)."""
    capability, variant = defect or (None, None)
    ledger = TodoLedger(rng)
    needs = _TODO_NEEDS.get((capability or "", variant or ""))
    count = rng.randint(3, 5) if capability == MULTI_STEP_COMPLETION else rng.randint(2, 5)
    operations = _todo_operations(rng, ledger, count, needs)
    report = variant if capability == STRUCTURED_DATA_REASONING else rng.choice([None, None, None, "count", "points"])

    spoiled = rng.randrange(count)  # the operation the defect spoils
    if needs is not None:
        spoiled = next(index for index, op in enumerate(operations) if op.kind == needs)
    troubled = capability == ERROR_RECOVERY or (capability is None and rng.random() < 0.25)
    if troubled:  # an error meets the agent: the planted lapse, or one a successful run fixes
        _trouble(ledger, operations[spoiled])
    if capability == ERROR_RECOVERY and variant == "ends_on_error":  # the failing operation is the last one asked for
        operations.append(operations.pop(spoiled))
        spoiled = count - 1

    transcript = Transcript(rng, ledger)
    transcript.system(TODO_SYSTEM)
    transcript.user(_todo_request(rng, operations, report))
    agent = TodoAgent(rng, ledger, transcript, capability, variant)

    reading = rng.choice(["none", "none", "some", "list"])
    if capability == ARGUMENT_GROUNDING and reading == "list":
        reading = "some"  # a listing would put the wrong id in front of the agent
    if reading == "list":
        transcript.call(("list_tasks", {}), note=rng.choice([None, "Let me look at the ledger first."]))
    stop = rng.randrange(1, count) if capability == MULTI_STEP_COMPLETION else count
    if capability is None and reading != "some" and not troubled and rng.random() < 0.4:
        transcript.call(*(op.call() for op in operations), note=rng.choice([None, "Making all the changes now."]))
        agent.done = [op.done_line() for op in operations]
    else:
        for index, op in enumerate(operations[:stop]):
            if reading == "some" and op.kind in ("rename", "delete", "due") and rng.random() < 0.7:
                if not (capability == ARGUMENT_GROUNDING and index == spoiled):
                    transcript.call(("get_task", {"task_id": op.task_id}))
            agent.perform(op, spoiled=capability is not None and index == spoiled)
    if capability == MULTI_STEP_COMPLETION and variant == "cut":
        return transcript.messages  # the run stops on the last tool result: no answer

    summary = [rng.choice(["Done. Here is what I changed:", "All set:", "Finished. Summary:", "Done:"])]
    if capability == MULTI_STEP_COMPLETION and rng.random() < 0.5:
        summary = [f"Done, all {count} operations are complete:"]  # claims the ones it skipped too
    summary += [f"- {line}" for line in agent.done] + agent.refused
    if report is not None:
        [(listing, _)] = transcript.call(("list_tasks", {"status": "open"}), note=rng.choice([None, "Now checking what is still open."]))
        open_count, points = listing["count"], sum(task["points"] for task in listing["tasks"])
        if capability == STRUCTURED_DATA_REASONING:
            open_count, points = _miscounted(rng, open_count, points, [task["points"] for task in listing["tasks"]])
        if report == "count":
            summary.append(rng.choice([f"You have {open_count} open tasks left.", f"{open_count} tasks are still open."]))
        else:
            summary.append(rng.choice([f"The open tasks add up to {points} story points.", f"{points} story points are still open."]))
    transcript.say("\n".join(summary))
    return transcript.messages


def _miscounted(rng: random.Random, count: int, points: int, values: list[int]) -> tuple[int, int]:
    """The count and the points total as a careless agent states them: a miscount, digits swapped,
    or a sum that counted a task twice."""
    wrong_count = count + (rng.choice([-3, -2, 2, 3, 4]) if count > 4 else rng.choice([2, 3, 5]))
    how = rng.choice(["off", "swapped", "doubled"])
    reversed_points = int(str(points)[::-1])
    if how == "swapped" and points >= 10 and reversed_points != points and str(points)[-1] != "0":
        wrong_points = reversed_points
    elif how == "doubled" and values:
        wrong_points = points + max(values)
    else:
        wrong_points = points + rng.choice([-7, -6, 6, 7, 9, 11])
    return wrong_count, max(wrong_points, 1)


# --- helpdesk-confirming -----------------------------------------------------------------------

HELPDESK_AGENT = "helpdesk-confirming"
HELPDESK_SYSTEM = """You are the IT helpdesk assistant of Northwind. You help employees with their accounts.

Policy:
- Before any change to an account (reset_password, unlock_account, change_plan, cancel_subscription), look the account up \
with get_account, tell the user what you found and exactly what you are about to change, and wait for their explicit \
confirmation ("yes"). Do not change anything without it.
- Password reset links go only to the email address on file.
- Plans: basic, standard and premium; list_plans gives their prices. Quote prices from the records only.
- If a tool fails, explain what happened and fix it if you can.
- Be brief."""

_ACCOUNT_ID = {"type": "string", "pattern": "^ACC-[0-9]{5}$"}
HELPDESK_TOOLS = [
    _function("get_account", "Look up an employee account by account id or email. Returns the account with its plan, "
              "monthly price and add-on subscriptions.", {"account_id": _ACCOUNT_ID, "email": {"type": "string"}}, []),
    _function("list_plans", "The plans and their monthly prices.", {}, []),
    _function("reset_password", "Send a password reset link to the email on file.", {"account_id": _ACCOUNT_ID}, ["account_id"]),
    _function("unlock_account", "Unlock an account locked after failed sign-ins.", {"account_id": _ACCOUNT_ID}, ["account_id"]),
    _function(
        "change_plan", "Move an account to another plan from the next billing period.",
        {"account_id": _ACCOUNT_ID, "plan": {"type": "string", "enum": ["basic", "standard", "premium"]}},
        ["account_id", "plan"],
    ),
    _function(
        "cancel_subscription", "Cancel an add-on subscription; the unused part of the month is refunded.",
        {"account_id": _ACCOUNT_ID, "subscription_id": {"type": "string", "pattern": "^SUB-[0-9]{4}$"}},
        ["account_id", "subscription_id"],
    ),
]  # fmt: skip

PLANS = {"basic": (8.0, 50), "standard": (12.0, 200), "premium": (24.0, 1000)}  # monthly price, storage in GB
_ADD_ONS = {"Cloud Backup": 4.99, "Extra Storage 1TB": 9.99, "Priority Support": 15.0, "Design Suite": 19.5}
_FIRST = ["Ana", "Ben", "Chloe", "Dev", "Elif", "Femi", "Grace", "Hiro", "Ines", "Jonas", "Kara", "Luca", "Maya", "Nils",
          "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tara", "Uma", "Victor", "Wen", "Yara", "Zoe"]  # fmt: skip
_LAST = ["Ruiz", "Okafor", "Lindqvist", "Patel", "Kaya", "Adeyemi", "Chen", "Tanaka", "Moreau", "Weber", "Novak", "Rossi",
         "Haddad", "Jensen", "Silva", "Kowalski", "Murphy", "Nguyen", "Schmidt", "Dubois"]  # fmt: skip


class Accounts(Backend):
    """The account system: a change on an id that exists goes through, whoever's account it is."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.accounts: dict[str, dict[str, Any]] = {}
        self.subscriptions: dict[str, dict[str, Any]] = {}
        for _ in range(40):
            self._new_account()

    def _new_account(self, account_id: str | None = None) -> dict[str, Any]:
        rng = self.rng
        while account_id is None or account_id in self.accounts:
            account_id = f"ACC-{rng.randint(10000, 99999)}"
        first, last = rng.choice(_FIRST), rng.choice(_LAST)
        plan = rng.choice(list(PLANS))
        account = {
            "account_id": account_id, "name": f"{first} {last}", "email": f"{first.lower()}.{last.lower()}@northwind.example",
            "status": "active", "failed_logins": 0, "plan": plan, "monthly_price": PLANS[plan][0],
            "subscriptions": [], "last_login": f"2026-01-{rng.randint(2, 28):02d}",
        }  # fmt: skip
        for product in rng.sample(list(_ADD_ONS), rng.randint(0, 2)):
            self._subscribe(account, product)
        self.accounts[account_id] = account
        return account

    def _subscribe(self, account: dict[str, Any], product: str, subscription_id: str | None = None) -> None:
        while subscription_id is None or subscription_id in self.subscriptions:
            subscription_id = f"SUB-{self.rng.randint(1000, 9999)}"
        subscription = {"subscription_id": subscription_id, "product": product, "monthly_price": _ADD_ONS[product], "status": "active"}
        self.subscriptions[subscription_id] = subscription
        account["subscriptions"].append(subscription)

    def customer(self, locked: bool, with_add_on: bool, plan: str | None = None) -> dict[str, Any]:
        """The account of this run's user, made to fit the request."""
        account = next(iter(self.accounts.values()))
        if locked:
            account["status"], account["failed_logins"] = "locked", self.rng.randint(5, 12)
        if with_add_on and not account["subscriptions"]:
            self._subscribe(account, self.rng.choice(list(_ADD_ONS)))
        if plan is not None:
            account["plan"], account["monthly_price"] = plan, PLANS[plan][0]
        return account

    def someone_elses(self, value: str, transcript: Transcript) -> str:
        """An id next to `value` (last two digits swapped, or one up) that the agent was never shown,
        made to exist as another employee's account or subscription: a mistyped id hits someone else."""
        prefix, digits = value.split("-")
        number = int(digits[:-2] + digits[-1] + digits[-2]) if digits[-1] != digits[-2] else int(digits) + 1
        candidate = f"{prefix}-{number:0{len(digits)}d}"
        while candidate == value or _mentioned(transcript.messages, candidate):
            number += 1
            candidate = f"{prefix}-{number:0{len(digits)}d}"
        if prefix == "ACC" and candidate not in self.accounts:
            self._new_account(candidate)
        if prefix == "SUB" and candidate not in self.subscriptions:
            self._subscribe(list(self.accounts.values())[1], self.rng.choice(list(_ADD_ONS)), candidate)
        return candidate

    def _account(self, account_id: str | None) -> tuple[dict[str, Any] | None, str | None]:
        account = self.accounts.get(account_id or "")
        return (account, None) if account else (None, f"no account {account_id}")

    def tool_get_account(self, account_id: str | None = None, email: str | None = None) -> tuple[Any, str | None]:
        if email is not None:
            account = next((a for a in self.accounts.values() if a["email"] == email), None)
            return (json.loads(json.dumps(account)), None) if account else (None, f"no account with email {email}")
        account, error = self._account(account_id)
        return (json.loads(json.dumps(account)), None) if account else (None, error)

    def tool_list_plans(self) -> tuple[Any, str | None]:
        return {"plans": [{"plan": plan, "monthly_price": price, "storage_gb": storage} for plan, (price, storage) in PLANS.items()]}, None

    def tool_reset_password(self, account_id: str, send_to: str | None = None) -> tuple[Any, str | None]:
        account, error = self._account(account_id)
        if account is None:
            return None, error
        if account["status"] == "locked":
            return None, f"account {account_id} is locked; unlock it before resetting the password"
        return {"account_id": account_id, "reset_link_sent_to": send_to or account["email"], "link_expires_in_hours": 24}, None

    def tool_unlock_account(self, account_id: str) -> tuple[Any, str | None]:
        account, error = self._account(account_id)
        if account is None:
            return None, error
        account["status"], account["failed_logins"] = "active", 0
        return {"account_id": account_id, "status": "active", "failed_logins": 0}, None

    def tool_change_plan(self, account_id: str, plan: str, **ignored: Any) -> tuple[Any, str | None]:
        account, error = self._account(account_id)
        if account is None:
            return None, error
        if plan not in PLANS:
            return None, f"unknown plan '{plan}'"
        previous = account["plan"]
        account["plan"], account["monthly_price"] = plan, PLANS[plan][0]
        return {"account_id": account_id, "previous_plan": previous, "plan": plan, "monthly_price": PLANS[plan][0],
                "effective": "2026-02-01"}, None  # fmt: skip

    def tool_cancel_subscription(self, account_id: str, subscription_id: str) -> tuple[Any, str | None]:
        subscription = self.subscriptions.get(subscription_id)
        if subscription is None:
            return None, f"no subscription {subscription_id}"
        subscription["status"] = "cancelled"
        refund = round(subscription["monthly_price"] * 17 / 31, 2)  # 17 of January's 31 days unused
        return {"subscription_id": subscription_id, "status": "cancelled", "prorated_refund": refund}, None


_YES = ["Yes, please.", "Yes, go ahead.", "Yes.", "yes please do", "Yep, do it.", "Sure, go ahead.", "Please do.",
        "Yes, that's right.", "Absolutely, thanks.", "yes"]  # fmt: skip
_ASK = ["Shall I go ahead?", "Do you want me to proceed?", "Can you confirm (yes/no)?", "Should I do that?"]
_NOT_YES = ["Hmm, what would that cost me per month?", "Wait, I need to check with my manager first.",
            "I'm not sure yet, let me think about it.", "Hold on, is there a cheaper option?"]  # fmt: skip
_PLAN_NAMES = {"basic": "Basic", "standard": "Standard", "premium": "Premium"}
_INTENTS = {  # what users ask for, with how often: successful runs
    "unlock": 12, "reset": 8, "reset-personal": 2, "plan": 11, "cancel": 8, "unlock+reset": 6, "plan+cancel": 4,
    "lookup": 5, "declined": 4, "reset-locked": 3,
}  # fmt: skip
_WRITES = ["unlock", "reset", "plan", "cancel", "unlock+reset", "plan+cancel"]  # what a failed run asks for, unless the defect needs more
_DEFECT_INTENTS = {
    (TOOL_CALL_PRECISION, "unknown_tool"): ["unlock"], (TOOL_CALL_PRECISION, "extra_argument"): ["reset-personal"],
    (TOOL_CALL_PRECISION, "invented_argument"): ["plan-annual"], (ARGUMENT_GROUNDING, "subscription"): ["cancel"],
    (ARGUMENT_GROUNDING, "account"): ["unlock", "reset", "plan", "unlock+reset"],
    (PRECONDITION_VERIFICATION, "no_read"): ["unlock", "reset", "unlock+reset"],
    (ERROR_RECOVERY, "repeat"): ["reset-locked"], (ERROR_RECOVERY, "ends_on_error"): ["reset-locked"],
    (MULTI_STEP_COMPLETION, "skip"): ["unlock+reset", "plan+cancel"], (STRUCTURED_DATA_REASONING, "difference"): ["plan"],
    (STRUCTURED_DATA_REASONING, "refund"): ["cancel"], (STRUCTURED_DATA_REASONING, "price"): ["lookup"],
}  # fmt: skip


@dataclass
class Change:
    """One change the user asked for: the write call and the agent's words before and after it."""

    tool: str
    arguments: dict[str, Any]
    proposal: str  # "unlock it"
    done: str  # "your account is unlocked"


def _opening(rng: random.Random, intent: str, plan: str | None, add_on: str, personal: str) -> str:
    plan_name = _PLAN_NAMES.get(plan or "", "")
    return rng.choice({
        "unlock": ["I can't log in, it says my account is locked.", "I'm locked out of my account after too many attempts."],
        "reset": ["I forgot my password, can you reset it?", "I need a password reset please."],
        "reset-locked": ["I forgot my password, can you reset it?", "Please reset my password, I can't remember it."],
        "reset-personal": [f"I forgot my password and can't get into my work mail. Please send the reset link to {personal}."],
        "plan": [f"I'd like to switch to the {plan} plan.", f"Can you move me to {plan_name}?"],
        "plan-annual": [f"Please move me to the {plan} plan, billed annually."],
        "cancel": [f"Please cancel my {add_on} add-on.", f"I don't need {add_on} anymore, cancel it please."],
        "unlock+reset": ["I'm locked out and I also forgot my password. Can you unlock the account and reset the password?"],
        "plan+cancel": [f"Two things: switch me to {plan} and cancel {add_on}."],
        "lookup": ["What plan am I on and what do I pay per month, add-ons included?"],
        "declined": [f"How much would the {plan} plan cost me? Maybe I'll switch."],
    }[intent])  # fmt: skip


def _changes(intent: str, account: dict[str, Any], plan: str | None) -> list[Change]:
    account_id, changes = account["account_id"], []
    if intent in ("unlock", "unlock+reset"):
        changes.append(Change("unlock_account", {"account_id": account_id}, "unlock it", "your account is unlocked"))
    if intent.startswith("reset") or intent == "unlock+reset":
        proposal = f"send a password reset link to {account['email']}"
        if intent == "reset-personal":
            proposal += " (for security, reset links only go to the address on file)"
        done = f"a reset link is on its way to {account['email']}; it expires in 24 hours"
        changes.append(Change("reset_password", {"account_id": account_id}, proposal, done))
    if plan is not None:
        changes.append(Change("change_plan", {"account_id": account_id, "plan": plan},
                              f"move you to {_PLAN_NAMES[plan]} from 2026-02-01",
                              f"you move to {_PLAN_NAMES[plan]} on 2026-02-01 at {_money(PLANS[plan][0])} a month"))  # fmt: skip
    if "cancel" in intent:
        add_on = account["subscriptions"][0]
        changes.append(Change("cancel_subscription", {"account_id": account_id, "subscription_id": add_on["subscription_id"]},
                              f"cancel {add_on['product']}", f"{add_on['product']} is cancelled"))  # fmt: skip
    return changes


def _findings(account: dict[str, Any], intent: str, plan: str | None, difference: float | None) -> str:
    """What the agent tells the user it found, before asking; `difference` as it states it (None:
    it did not list the plans, so it quotes no other plan's price)."""
    findings = f"I found the account of {account['name']} ({account['account_id']})"
    if account["status"] == "locked":
        findings += f"; it is locked after {account['failed_logins']} failed sign-in attempts"
    if plan is not None:
        price, new_price = account["monthly_price"], PLANS[plan][0]
        findings += f"; you are on {_PLAN_NAMES[account['plan']]} at {_money(price)} a month"
        if difference is not None:  # the plans were listed
            findings += f", and {_PLAN_NAMES[plan]} costs {_money(new_price)} ({_money(difference)} {'more' if new_price > price else 'less'})"
    if "cancel" in intent:
        add_on = account["subscriptions"][0]
        findings += f"; you have {add_on['product']} ({add_on['subscription_id']}) at {_money(add_on['monthly_price'])} a month"
    return findings


def helpdesk_run(rng: random.Random, defect: tuple[str, str] | None) -> list[dict[str, Any]]:
    """One helpdesk-confirming run's messages: correct, or with the one planted `defect` (capability, variant)."""
    capability, variant = defect or (None, None)
    accounts = Accounts(rng)
    if capability is None:
        intent = rng.choices(list(_INTENTS), list(_INTENTS.values()))[0]
    else:
        intent = rng.choice(_DEFECT_INTENTS.get((capability, variant or ""), _WRITES))
    plan = None
    current = None
    if intent.startswith("plan") or intent == "declined":
        current = rng.choice(["basic", "standard"])
        plan = rng.choice([name for name in PLANS if name != current])
    account = accounts.customer(
        locked=intent in ("unlock", "unlock+reset", "reset-locked"),
        with_add_on="cancel" in intent or intent == "lookup",
        plan=current,
    )
    account_id, price = account["account_id"], account["monthly_price"]
    add_on = account["subscriptions"][0]["product"] if account["subscriptions"] else ""
    personal = f"{account['name'].split()[0].lower()}{rng.randint(10, 99)}@gmail.com"
    no_read = (capability, variant) == (PRECONDITION_VERIFICATION, "no_read")
    by_id = no_read or rng.random() < 0.3
    # Now and then a successful run's user mistypes the address: the lookup fails and they correct it.
    typo = account["email"].replace("@", "s@", 1) if capability is None and not by_id and rng.random() < 0.2 else None
    who = f"My account id is {account_id}." if by_id else rng.choice(
        [f"My email is {typo or account['email']}.", f"I'm {account['name']}, {typo or account['email']}."]
    )  # fmt: skip

    transcript = Transcript(rng, accounts)
    transcript.system(HELPDESK_SYSTEM)
    transcript.user(f"{rng.choice(['Hi. ', 'Hello! ', ''])}{_opening(rng, intent, plan, add_on, personal)} {who}")
    if typo is not None:
        transcript.call(("get_account", {"email": typo}), note=rng.choice([None, "Let me look up your account."]))
        transcript.say(f"I couldn't find an account for {typo}. Could you check the address?")
        transcript.user(f"Sorry, typo: it's {account['email']}.")
    if not no_read:
        lookup = {"account_id": account_id} if by_id else {"email": account["email"]}
        transcript.call(("get_account", lookup), note=None if typo else rng.choice([None, "Let me look up your account."]))
    # Prices of other plans come from list_plans: an agent that did not list them quotes none.
    listed = plan is not None and not no_read and (
        rng.random() < 0.6 or intent == "declined" or (capability, variant) == (STRUCTURED_DATA_REASONING, "difference")
    )
    if listed:
        transcript.call(("list_plans", {}))

    if intent == "lookup":
        total = price + sum(s["monthly_price"] for s in account["subscriptions"])
        if capability == STRUCTURED_DATA_REASONING:
            total = _misquoted(rng, total)
        add_ons = ", ".join(f"{s['product']} at {_money(s['monthly_price'])}" for s in account["subscriptions"])
        transcript.say(f"You are on {_PLAN_NAMES[account['plan']]} at {_money(price)} a month, with {add_ons}: "
                       f"{_money(total)} a month in total.")  # fmt: skip
        return transcript.messages

    changes = _changes(intent, account, plan)
    if (capability, variant) == (TOOL_CALL_PRECISION, "extra_argument"):  # does what the user asked, not the policy
        changes[0].proposal = f"send a password reset link to {personal}"
        changes[0].done = f"a reset link is on its way to {personal}; it expires in 24 hours"
    if (capability, variant) == (TOOL_CALL_PRECISION, "invented_argument"):
        changes[0].proposal = changes[0].proposal.replace(" from", ", billed annually, from")
        changes[0].done += ", billed annually"
    difference = abs(PLANS[plan][0] - price) if plan is not None and listed else None
    if (capability, variant) == (STRUCTURED_DATA_REASONING, "difference") and difference is not None:
        difference = _misquoted(rng, difference)
    findings = _findings(account, intent, plan, difference)
    proposal = " and ".join(change.proposal for change in changes)

    # Ask, and hear the answer, unless the defect goes straight to the change.
    note = rng.choice([None, "Doing that now."])
    if (capability, variant) == (PRECONDITION_VERIFICATION, "no_confirmation"):
        note = f"{findings}. I'll {proposal} now."
    else:
        asked = f"I can {proposal} for {account_id}." if no_read else f"{findings}. I can {proposal}."
        transcript.say(f"{asked} {rng.choice(_ASK)}")
        if intent == "declined":
            transcript.user(rng.choice(["No, let's leave it as it is for now.", "No thanks, I'll stay where I am."]))
            transcript.say("Understood, I haven't changed anything. Anything else?")
            return transcript.messages
        not_confirmed = (capability, variant) == (PRECONDITION_VERIFICATION, "not_confirmed")
        transcript.user(rng.choice(_NOT_YES if not_confirmed else _YES))

    # The changes.
    if (capability, variant) == (MULTI_STEP_COMPLETION, "skip"):
        changes = changes[:1]
    cut = rng.randrange(len(changes)) if (capability, variant) == (MULTI_STEP_COMPLETION, "cut") else None
    done: list[str] = []
    refund = None
    for number, change in enumerate(changes):
        name, arguments = change.tool, dict(change.arguments)
        if capability == TOOL_CALL_PRECISION and number == 0:
            if variant == "unknown_tool":
                name = "unlock_user"
            elif variant == "extra_argument":
                arguments["send_to"] = personal
            else:
                arguments["billing_cycle"] = "annual"
        if capability == ARGUMENT_GROUNDING and number == len(changes) - 1:
            key = "subscription_id" if variant == "subscription" else "account_id"
            arguments[key] = accounts.someone_elses(arguments[key], transcript)
        [(record, error)] = transcript.call((name, arguments), note=note if number == 0 else None)
        if error is None or capability == TOOL_CALL_PRECISION:
            done.append(change.done)  # a spoiled call is reported as done all the same
            refund = record.get("prorated_refund", refund) if isinstance(record, dict) else refund
        elif capability == ERROR_RECOVERY:  # the reset of a locked account
            if variant == "repeat":
                for _ in range(rng.choice([1, 2])):
                    transcript.call((name, arguments), note="Let me try that again.")
            if variant == "ends_on_error" and rng.random() < 0.5:
                done.append(change.done)  # reports the failed reset as done
            else:
                done.append(f"I couldn't send the reset link: {error}")
        else:  # a successful run: explain, ask to unlock first, then reset
            transcript.say(f"The reset failed because {account_id} is locked ({account['failed_logins']} failed sign-ins). "
                           f"I can unlock it first and then send the reset link. {rng.choice(_ASK)}")  # fmt: skip
            transcript.user(rng.choice(_YES))
            transcript.call(("unlock_account", {"account_id": account_id}))
            transcript.call((name, arguments))
            done += ["your account is unlocked", change.done]
        if number == cut:
            return transcript.messages  # the run stops on this tool result: no answer

    if refund is not None and ((capability, variant) == (STRUCTURED_DATA_REASONING, "refund") or rng.random() < 0.6):
        stated = _misquoted(rng, refund) if capability == STRUCTURED_DATA_REASONING else refund
        done.append(f"a prorated refund of {_money(stated)} goes back to your card")
    closing = rng.choice(["Anything else?", "Have a good day!", ""])
    opening = "Sorry —" if any(line.startswith("I couldn't") for line in done) else rng.choice(["Done:", "All set:", "Finished:"])
    transcript.say(f"{opening} {'; '.join(done)}. {closing}".strip())
    return transcript.messages


def _misquoted(rng: random.Random, value: float) -> float:
    """A money amount as an agent misstates it: two digits swapped, or a slip of a few dollars."""
    value = round(value, 2)
    if rng.random() < 0.35:
        cents = f"{value:.2f}"
        swapped = float(cents[:-2] + cents[-1] + cents[-2])
        if swapped != value:
            return swapped
    return round(value + rng.choice([-3.0, -2.0, 2.0, 3.0, 5.0]) if value > 3.0 else value + 4.0, 2)


# --- files ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Style:
    agent: str
    tools: list[dict[str, Any]]
    run: Callable[[random.Random, tuple[str, str] | None], list[dict[str, Any]]]
    defects: dict[str, list[str]]  # capability -> the variants of its defect, cycled over its share of the failures

    def planted(self, failures: int) -> list[tuple[str, str]]:
        """The defects of `failures` failed runs: the capabilities in equal shares (the first ones
        one more when it does not divide), each share cycling through its variants."""
        capabilities = list(self.defects)
        share, extra = divmod(failures, len(capabilities))
        return [
            (capability, self.defects[capability][number % len(self.defects[capability])])
            for index, capability in enumerate(capabilities)
            for number in range(share + (index < extra))
        ]


STYLES = {
    TODO_AGENT: Style(TODO_AGENT, TODO_TOOLS, todo_run, {
        TOOL_CALL_PRECISION: ["enum", "date_format", "unknown_tool"], ARGUMENT_GROUNDING: ["neighbour"],
        ERROR_RECOVERY: ["repeat", "ends_on_error"], MULTI_STEP_COMPLETION: ["cut", "skip"],
        STRUCTURED_DATA_REASONING: ["count", "points"],
    }),
    HELPDESK_AGENT: Style(HELPDESK_AGENT, HELPDESK_TOOLS, helpdesk_run, {
        TOOL_CALL_PRECISION: ["unknown_tool", "extra_argument", "invented_argument"],
        ARGUMENT_GROUNDING: ["account", "subscription"],
        PRECONDITION_VERIFICATION: ["no_confirmation", "no_read", "not_confirmed"],
        ERROR_RECOVERY: ["repeat", "ends_on_error"], MULTI_STEP_COMPLETION: ["cut", "skip"],
        STRUCTURED_DATA_REASONING: ["difference", "refund", "price"],
    }),
}  # fmt: skip

_DEFECT_NOTES = {
    (TOOL_CALL_PRECISION, "enum"): "update_task with status 'completed', which its schema does not allow (open/done)",
    (TOOL_CALL_PRECISION, "date_format"): "update_task with a spelled-out due date where the schema wants YYYY-MM-DD",
    (TOOL_CALL_PRECISION, "unknown_tool"): "calls a tool that does not exist",
    (TOOL_CALL_PRECISION, "extra_argument"): "reset_password with a send_to argument its schema does not have",
    (TOOL_CALL_PRECISION, "invented_argument"): "change_plan with a billing_cycle argument its schema does not have",
    (ARGUMENT_GROUNDING, "neighbour"): "writes to a task id the user never gave (digits swapped, one off, or another task)",
    (ARGUMENT_GROUNDING, "account"): "writes to an account id never seen (digits swapped)",
    (ARGUMENT_GROUNDING, "subscription"): "cancels a subscription id never seen",
    (PRECONDITION_VERIFICATION, "no_confirmation"): "changes the account without asking for a yes",
    (PRECONDITION_VERIFICATION, "no_read"): "changes the account without looking it up",
    (PRECONDITION_VERIFICATION, "not_confirmed"): "changes the account although the user did not say yes",
    (ERROR_RECOVERY, "repeat"): "repeats the failing call unchanged, then gives up",
    (ERROR_RECOVERY, "ends_on_error"): "ends the run on a tool error it could have fixed",
    (MULTI_STEP_COMPLETION, "cut"): "stops after a tool result without an answer",
    (MULTI_STEP_COMPLETION, "skip"): "skips the remaining operations and answers",
    (STRUCTURED_DATA_REASONING, "count"): "states a count or total no record supports",
    (STRUCTURED_DATA_REASONING, "points"): "states a count or total no record supports",
    (STRUCTURED_DATA_REASONING, "difference"): "states a price difference no record supports",
    (STRUCTURED_DATA_REASONING, "refund"): "states a refund no record supports",
    (STRUCTURED_DATA_REASONING, "price"): "states a monthly total no record supports",
}


def runs(agent: str, seed: int, count: int = 100, split: str = "dev") -> list[dict[str, Any]]:
    """`count` runs of `agent` (60 % successful), each failure with one planted defect, in shuffled order."""
    style = STYLES[agent]
    rng = random.Random(seed)
    failures = count - round(count * SUCCESS_SHARE)
    plan: list[tuple[str, str] | None] = [None] * (count - failures) + list(style.planted(failures))
    rng.shuffle(plan)
    written = []
    for number, defect in enumerate(plan, start=1):
        record: dict[str, Any] = {
            "run_id": f"{agent}-{split}-{number:03d}", "agent": agent, "outcome": "failure" if defect else "success",
            "messages": style.run(rng, defect), "tools": style.tools, "metadata": {"generator": "bench/agent_styles.py", "seed": str(seed)},
            "planted": {defect[0]: "LACKING"} if defect else {},
        }  # fmt: skip
        if defect:
            record["defect"] = _DEFECT_NOTES[defect]
        written.append(record)
    return written


def render(records: list[dict[str, Any]]) -> bytes:
    """JSON lines, one run per line."""
    return "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records).encode()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=FIXTURES, help="directory of the files (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=100, help="runs per file")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for agent, name, seed in FILES:
        split = "kept-back" if "kept-back" in name else "dev"
        records = runs(agent, seed, args.runs, split)
        (args.out / name).write_bytes(render(records))
        failed = sum(record["outcome"] == "failure" for record in records)
        print(f"{args.out / name}: {len(records)} runs, {len(records) - failed} successful, {failed} with a planted defect")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
