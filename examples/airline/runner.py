"""Runs many conversations: seeded tasks, a policy per conversation, a pace, a thread pool, and one
telemetry pipeline for the whole run."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields, replace
from typing import Any

from examples.airline.conversation import Conversation
from examples.airline.database import Database
from examples.airline.instructions import SERVICE_NAME
from examples.airline.outcomes import Outcome
from examples.airline.policies import LLMPolicy, Policy, ScriptedPolicy
from examples.airline.tasks import Task, make_tasks
from examples.airline.telemetry import Telemetry


@dataclass
class RunConfig:
    """Settings of one run of the example agent."""

    conversations: int = 20  # how many conversations to run
    router: str = "http://127.0.0.1:8000/v1"  # OpenAI-compatible base URL the llm policy calls
    collector: str | None = "http://127.0.0.1:4318"  # OTLP/HTTP collector root; None or "" sends nothing
    rate: float = 0.0  # conversations started per second; 0 starts each as soon as a worker is free
    seed: int = 0  # fixes the database, the tasks, the customers' replies and the scripted policy's flaws
    policy: str = "llm"  # "llm" (a model behind the router) or "scripted" (no model)
    skip_confirmation: float = 0.0  # scripted: chance that a conversation makes its change without asking
    skip_read: float = 0.0  # scripted: chance that a cancellation skips reading the reservation first
    model: str = "base"  # model name sent to the router (the base model, or an adapter's name)
    api_key: str = "unused"  # the router does not check it; a hosted endpoint would
    max_tokens: int = 160  # most tokens per model answer
    temperature: float = 0.7  # sampling temperature of the model
    max_turns: int = 10  # most model calls in one conversation
    concurrency: int = 4  # conversations in flight at once
    request_timeout_s: float = 300.0  # one model request's limit (the embedded CPU model is slow)
    users: int = 40  # customers in the seeded database
    service_name: str = SERVICE_NAME  # service.name of the agent's spans
    run_id: str | None = None  # part of every conversation id; random by default, so reruns never merge


class RouterUnavailable(RuntimeError):
    """The llm policy's endpoint cannot be reached or does not serve the model."""


class RunOutcomes(list[Outcome]):
    """The outcomes of a run, in task order, with what the run cost."""

    seconds: float = 0.0
    exported_spans: int = 0
    failed_spans: int = 0
    config: RunConfig | None = None

    @property
    def successes(self) -> int:
        return sum(1 for outcome in self if outcome.success)

    @property
    def success_rate(self) -> float:
        return self.successes / len(self) if self else 0.0

    def summary(self) -> str:
        """One line: how many conversations succeeded, and what the run sent."""
        config = self.config or RunConfig()
        policy = config.policy
        if config.policy == "scripted":
            policy += f" (skip confirmation {config.skip_confirmation:g}, skip read {config.skip_read:g})"
        else:
            policy += f" ({config.model} at {config.router})"
        exported = f"{self.exported_spans} spans exported" + (f", {self.failed_spans} not delivered" if self.failed_spans else "")
        return (
            f"airline agent: {self.successes}/{len(self)} conversations succeeded ({100 * self.success_rate:.1f}%), "
            f"policy {policy}, {exported}, {self.seconds:.1f} s"
        )


def _client(config: RunConfig) -> Any:
    """An OpenAI client for the router, checked to serve the configured model."""
    import openai

    client = openai.OpenAI(base_url=config.router, api_key=config.api_key, max_retries=0, timeout=config.request_timeout_s)
    try:
        served = {model.id for model in client.models.list()}
    except openai.APIError as error:
        raise RouterUnavailable(
            f"cannot reach the model endpoint at {config.router} ({error}); start it with `tracefix router` "
            "or pass --router, or use --policy scripted"
        ) from None
    if served and config.model not in served:
        raise RouterUnavailable(f"{config.router} does not serve {config.model!r}; it serves {', '.join(sorted(served))}")
    return client


def _request_attributes(config: RunConfig) -> dict[str, Any]:
    if config.policy != "llm":
        return {}
    from urllib.parse import urlparse

    url = urlparse(config.router)
    return {
        "gen_ai.request.max_tokens": config.max_tokens,
        "gen_ai.request.temperature": config.temperature,
        "server.address": url.hostname or "",
        "server.port": url.port or (443 if url.scheme == "https" else 80),
    }


@dataclass(frozen=True, slots=True)
class Batch:
    """One seed's goals: a freshly generated database and its tasks. The batch's conversations share
    the database and change it, so a batch run again is generated again."""

    seed: int
    database: Database
    tasks: list[Task]


class Session:
    """What the conversations of a run share: the model client (checked once), one telemetry
    pipeline and the run id. `run_conversations` is one session over one batch; a caller that
    schedules conversations itself (the demo keeps a stream of them going over a panel of seeded
    batches) takes the pieces.

    Raises RouterUnavailable when the llm policy's endpoint does not answer."""

    def __init__(self, config: RunConfig) -> None:
        if config.policy not in ("llm", "scripted"):
            raise ValueError(f"policy must be 'llm' or 'scripted', not {config.policy!r}")
        self.config = config
        self.client = _client(config) if config.policy == "llm" else None
        self.run_id = config.run_id or uuid.uuid4().hex[:8]
        self.telemetry = Telemetry(config.collector or None, config.service_name)
        self._attributes = _request_attributes(config)

    def batch(self, seed: int) -> Batch:
        """`config.conversations` seeded tasks over a fresh database."""
        database = Database.generate(seed, users=self.config.users)
        return Batch(seed, database, make_tasks(database, self.config.conversations, seed))

    def run(self, batch: Batch, index: int, number: int | None = None) -> Outcome:
        """Run the batch's `index`-th task; `number` (default `index`) names the conversation within
        the run, so a run over several batches keeps its conversation ids apart."""
        config = self.config
        if self.client is not None:
            policy: Policy = LLMPolicy(self.client, config.model, config.max_tokens, config.temperature, config.service_name)
        else:
            flaws = random.Random(f"flaws-{batch.seed}-{index}")
            skip_confirmation = flaws.random() < config.skip_confirmation
            skip_read = flaws.random() < config.skip_read
            policy = ScriptedPolicy(random.Random(f"calls-{batch.seed}-{index}"), skip_confirmation, skip_read)
        conversation = Conversation(
            batch.tasks[index], batch.database, policy, self.telemetry, f"airline-{self.run_id}-{index if number is None else number:04d}",
            random.Random(f"conversation-{batch.seed}-{index}"), self._attributes,
        )  # fmt: skip
        return conversation.run(config.max_turns)

    def close(self) -> None:
        """Send what the telemetry pipeline still holds."""
        self.telemetry.shutdown()


def configure(config: RunConfig | None = None, **settings: Any) -> RunConfig:
    """`config` (default RunConfig()) with keyword settings overriding its fields."""
    unknown = set(settings) - {field.name for field in fields(RunConfig)}
    if unknown:
        raise TypeError(f"unknown settings: {', '.join(sorted(unknown))}")
    return replace(config or RunConfig(), **settings)


def run_conversations(
    config: RunConfig | None = None, *, on_outcome: Callable[[Outcome], None] | None = None, **settings: Any
) -> RunOutcomes:
    """Run `config.conversations` conversations and return their outcomes (keyword settings override
    `config`'s fields). `on_outcome` is called from a worker thread as each conversation ends.

    Raises RouterUnavailable when the llm policy's endpoint does not answer."""
    config = configure(config, **settings)
    started = time.monotonic()
    session = Session(config)
    batch = session.batch(config.seed)

    def one(index: int) -> Outcome:
        outcome = session.run(batch, index)
        if on_outcome is not None:
            on_outcome(outcome)
        return outcome

    outcomes = RunOutcomes()
    try:
        with ThreadPoolExecutor(max(1, config.concurrency), thread_name_prefix="airline") as pool:
            futures = []
            for index in range(len(batch.tasks)):
                if config.rate > 0:
                    time.sleep(max(0.0, started + index / config.rate - time.monotonic()))
                futures.append(pool.submit(one, index))
            outcomes.extend(future.result() for future in futures)
    finally:
        session.close()
    outcomes.seconds = time.monotonic() - started
    outcomes.exported_spans = session.telemetry.exported_spans
    outcomes.failed_spans = session.telemetry.failed_spans
    outcomes.config = config
    return outcomes
