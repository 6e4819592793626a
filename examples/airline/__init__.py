"""An example customer-service agent for a small airline, instrumented like a user's own agent.

Seven tools with JSON schemas over a Faker-seeded database, a policy in the system prompt (read the
reservation and get the customer's explicit yes before any change), scripted simulated customers,
and a τ-bench style outcome checker whose verdict goes out as a ``gen_ai.evaluation.result`` event.
The agent's turns come from a model behind the tracefix router (``policy="llm"``, through the
official ``openai`` client) or from a scripted policy with planted flaws (``policy="scripted"``).
Everything is traced with the OpenTelemetry SDK in the GenAI semantic conventions and exported
over OTLP/HTTP.

    from examples.airline import run_conversations

    outcomes = run_conversations(conversations=40, policy="scripted", skip_confirmation=0.5,
                                 collector="http://127.0.0.1:4318", seed=7)
    print(outcomes.summary())
"""

from examples.airline.database import Database
from examples.airline.outcomes import Outcome, Verdict, check
from examples.airline.runner import RouterUnavailable, RunConfig, RunOutcomes, run_conversations
from examples.airline.tasks import GOALS, Task, make_tasks
from examples.airline.tools import STATE_CHANGING, TOOLS, ToolError, execute, openai_tools

__all__ = [
    "GOALS",
    "STATE_CHANGING",
    "TOOLS",
    "Database",
    "Outcome",
    "RouterUnavailable",
    "RunConfig",
    "RunOutcomes",
    "Task",
    "ToolError",
    "Verdict",
    "check",
    "execute",
    "make_tasks",
    "openai_tools",
    "run_conversations",
]
