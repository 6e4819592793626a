"""`tracefix envs` and `tracefix train`: training environments, and one adapter trained in the foreground."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
import orjson

from tracefix.daemon.app.cli_common import client_call, config_option, json_option, print_json, settings_from
from tracefix.daemon.core.progress import checkpoints_text, grpo_added_text, progress_text
from tracefix.daemon.core.settings import RECIPES


@click.group()
def envs() -> None:
    """Training environments: list families, sample an instance, check a family on a tool set, validate it
    against the base model."""


def _tools(config_path: Path | None, tools_file: Path | None, service: str | None) -> list:
    from tracefix.daemon.pipeline.synthesis import stored_definitions, with_state_changing
    from tracefix.trainer.environment import load_tools

    settings = settings_from(config_path).capabilities
    if tools_file is not None:
        try:
            document = orjson.loads(tools_file.read_bytes())
        except orjson.JSONDecodeError as error:
            raise click.ClickException(f"{tools_file}: not JSON ({error})") from None
        definitions = document.get("tools", document) if isinstance(document, dict) else document
        if not isinstance(definitions, list):
            raise click.ClickException(f"{tools_file}: expected a list of tool definitions or {{\"tools\": [...]}}")
        definitions = [with_state_changing(definition, settings) for definition in definitions]
    else:
        data = client_call(config_path, "GET", "/api/tools", service=service)
        definitions = stored_definitions(data["items"], settings)
        if not definitions:
            raise click.ClickException("the daemon has seen no tool definitions yet; pass --tools FILE")
    try:
        return load_tools(definitions)
    except ValueError as error:
        raise click.ClickException(str(error)) from None


def _environment(capability: str, tools: list, difficulty: int):  # type: ignore[no-untyped-def]
    from tracefix.trainer.environment import Environment
    from tracefix.trainer.families import find_family, load_families

    try:
        family = find_family(load_families(), capability)
        if difficulty not in family.levels:
            raise click.ClickException(f"{family.name} has difficulty levels {list(family.levels)}")
        return Environment(family, tools, difficulty)
    except ValueError as error:
        raise click.ClickException(str(error)) from None


tools_option = click.option(
    "--tools", "tools_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
    help="Tool definitions (JSON list, OpenAI or flat shape); default: those the daemon has seen.",
)  # fmt: skip
service_option = click.option("--service", default=None, help="With the daemon's tools: this agent (service.name).")
difficulty_option = click.option("--difficulty", default=1, show_default=True, type=int)


@envs.command(name="list")
@config_option
@json_option
def envs_list(config_path: Path | None, as_json: bool) -> None:
    """The registered environment families (plugins: the configuration cannot change them, but a
    broken --config is still an error, as for every command)."""
    settings_from(config_path)
    from tracefix.trainer.families import load_families

    families = [
        {
            "name": family.name,
            "capability": family.capability,
            "version": family.version,
            "levels": list(family.levels),
            "rewards": family.rewards,
            "description": family.description,
        }
        for family in load_families().values()
    ]
    if as_json:
        print_json(families)
        return
    for family in families:
        rewards = ", ".join(f"{name} {value:g}" for name, value in family["rewards"].items())
        click.echo(f"{family['capability']} (v{family['version']}, levels {family['levels']}): {rewards}")


@envs.command(name="sample")
@click.argument("capability")
@click.option("--seed", default=0, show_default=True, type=int)
@tools_option
@service_option
@difficulty_option
@config_option
@json_option
def envs_sample(
    capability: str, seed: int, tools_file: Path | None, service: str | None, difficulty: int,
    config_path: Path | None, as_json: bool,
) -> None:  # fmt: skip
    """Print one instance: its opening messages and a replay of its ground-truth solution."""
    from tracefix.trainer.environment import rollout, solution_policy

    environment = _environment(capability, _tools(config_path, tools_file, service), difficulty)
    instance = environment.instance(seed)
    replay = rollout(instance, solution_policy(instance))
    data = {
        "spec": environment.spec(),
        "seed": seed,
        "hint": environment.instance(seed).hint(),
        "messages": replay.messages,
        "reward": replay.reward,
    }
    if as_json:
        print_json(data)
        return
    click.echo(f"{capability} seed {seed} (difficulty {difficulty}), solution reward {replay.reward:g}")
    for message, own in zip(replay.messages, replay.from_policy):
        who = "policy" if own else "env"
        content = message.get("content") or ""
        if message["role"] == "system":
            content = content[:300] + (" …" if len(content) > 300 else "")
        click.echo(f"[{who}] {message['role']}: {content}")


@envs.command(name="check")
@click.argument("capability")
@click.option("--seeds", default=100, show_default=True, type=click.IntRange(1, 100_000))
@tools_option
@service_option
@difficulty_option
@config_option
@json_option
def envs_check(
    capability: str, seeds: int, tools_file: Path | None, service: str | None, difficulty: int,
    config_path: Path | None, as_json: bool,
) -> None:  # fmt: skip
    """The solution must score 1.0 on every seed; no-op and random policies must score low."""
    from tracefix.trainer.checks import check

    report = check(_environment(capability, _tools(config_path, tools_file, service), difficulty), seeds)
    if as_json:
        print_json(report.to_dict())
    else:
        verdict = "PASS" if report.passed else "FAIL"
        click.echo(
            f"{verdict} {capability} on {seeds} seeds: solution min {report.solution_min:g} mean "
            f"{report.solution_mean:g}; no-op mean {report.noop_mean:g}; random mean {report.random_mean:g} "
            f"(must stay under {0.3:g})"
        )
        for error in report.errors[:5]:
            click.echo(f"  {error}", err=True)
    if not report.passed:
        sys.exit(1)


@envs.command(name="validate")
@click.argument("capability")
@click.option("--seeds", default=None, type=click.IntRange(1, 100_000), help="Groups (default: [validation] seeds).")
@click.option(
    "--group-size", default=None, type=click.IntRange(2, 1000), help="Rollouts per group (default: [validation] group_size)."
)
@click.option("--model", "model_name", default=None, help="Base model (default: [model] name).")
@tools_option
@service_option
@difficulty_option
@config_option
@json_option
def envs_validate(
    capability: str, seeds: int | None, group_size: int | None, model_name: str | None, tools_file: Path | None,
    service: str | None, difficulty: int, config_path: Path | None, as_json: bool,
) -> None:  # fmt: skip
    """The validation gate, in the foreground: can the base model's rewards on this environment teach?"""
    from tracefix.trainer.model import ModelUnavailable
    from tracefix.trainer.precision import UnsupportedDtype
    from tracefix.trainer.validate_job import run_gate

    settings = settings_from(config_path)
    environment = _environment(capability, _tools(config_path, tools_file, service), difficulty)
    model = settings.model.model_dump()
    model["name"] = model_name or model["name"]
    model["cache_dir"] = settings.model_cache_dir
    gate = settings.validation.model_dump()
    gate["seeds"] = seeds or gate["seeds"]
    gate["group_size"] = group_size or gate["group_size"]
    try:
        report = run_gate(environment.family, environment.tools, model, gate, environment.difficulty)
    except (ModelUnavailable, UnsupportedDtype) as error:
        raise click.ClickException(str(error)) from None
    if as_json:
        print_json(report)
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"{capability}: {report['model']}, {gate['seeds']} groups of {gate['group_size']}")
        for column in ("difficulty", "hints", "mean", "std", "groups with variance", "verdict"):
            table.add_column(column)
        for attempt in report["attempts"]:
            table.add_row(
                str(attempt["difficulty"]), f"{attempt['hint_share']:.0%}", f"{attempt['mean']:.3f}",
                f"{attempt['std']:.3f}", f"{attempt['variance_groups']:.0%}", attempt["verdict"],
            )  # fmt: skip
        console = Console()
        console.print(table)
        if report["passed"]:
            console.print(f"PASS at difficulty {report['difficulty']} ({report['remedy'] or 'no remedy needed'})")
        else:
            console.print(f"REJECTED: the base model's rewards cannot teach on any remedy tried "
                          f"({report['rollouts']} rollouts, {report['seconds']:g} s)")  # fmt: skip
    if not report["passed"]:
        sys.exit(1)


@click.command()
@click.argument("capability")
@click.option("--recipe", default=None, type=click.Choice(["auto", *RECIPES]), help="Training recipe (default: [training] recipe).")
@click.option("--steps", default=None, type=click.IntRange(0, 100_000), help="GRPO steps (default: [training] steps; 0 = warm start only).")
@click.option("--warm-start", "warm_start", default=None, type=click.IntRange(0, 100_000), help="Demonstrations for the warm start (default: [training]).")
@click.option("--eval-seeds", default=None, type=click.IntRange(1, 100_000), help="Held-out seeds (default: [training] eval_seeds).")
@click.option("--model", "model_name", default=None, help="Base model (default: [model] name).")
@click.option("--output", type=click.Path(file_okay=False, path_type=Path), default=None, help="Run directory (default: <store dir>/runs/cli-CAPABILITY).")
@tools_option
@service_option
@difficulty_option
@config_option
@json_option
def train(
    capability: str, recipe: str | None, steps: int | None, warm_start: int | None, eval_seeds: int | None, model_name: str | None,
    output: Path | None, tools_file: Path | None, service: str | None, difficulty: int, config_path: Path | None,
    as_json: bool,
) -> None:  # fmt: skip
    """Train, evaluate and save one adapter in the foreground (the daemon does the same on its own for
    every gap it detects). Re-running with the same --output resumes from its checkpoints."""
    from tracefix.daemon.pipeline import replay_judge
    from tracefix.daemon.pipeline.training_runner import job_settings, train_config
    from tracefix.trainer.model import ModelUnavailable
    from tracefix.trainer.train_job import run_training

    settings = settings_from(config_path)
    environment = _environment(capability, _tools(config_path, tools_file, service), difficulty)
    request = {
        "run_id": None, "capability": capability, "version": 1, "family": environment.family.name,
        "difficulty": environment.difficulty, "tools": [tool.to_openai() for tool in environment.tools],
        "training": train_config(settings), **job_settings(settings),
    }  # fmt: skip
    if recipe is not None:
        request["training"]["recipe"] = recipe
    if steps is not None:
        request["training"]["steps"] = steps
    if warm_start is not None:
        request["training"]["warm_start_examples"] = warm_start
    if eval_seeds is not None:
        request["evaluation"]["seeds"] = eval_seeds
    if model_name:
        request["model"]["name"] = model_name
    run_dir = output or settings.data_dir / "runs" / f"cli-{capability}"
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} steps"),
                  TimeElapsedColumn(), TextColumn("{task.fields[status]}"), disable=as_json) as bar:  # fmt: skip
        task = bar.add_task(f"training {capability}", total=max(request["training"]["steps"], 1), status="warm start / loading")

        def progress(record: dict[str, Any]) -> None:
            phase = record.get("phase", "grpo")
            if phase == "warm_start":
                bar.update(task, description=f"warm start {capability}", total=record["max_steps"], completed=record["step"],
                           status=f"loss {record['loss']:.4f}")  # fmt: skip
            elif phase == "evaluation":
                bar.update(task, description=f"evaluating {capability}", status=record["part"])
            elif phase == "recipe":
                bar.update(task, description=f"recipe {record['recipe']}", status=progress_text(record))
            elif phase == "checkpoint":
                bar.update(task, status=progress_text(record))
            else:
                status = (f"reward {record['mean_reward']:.2f}  success {record['success_rate']:.0%}  "
                          f"zero-variance groups {record['zero_variance_groups']}/{record['groups']}  loss {record['loss']:.4f}")  # fmt: skip
                bar.update(task, description=f"training {capability}", total=max(request["training"]["steps"], 1),
                           completed=record["step"], status=status)  # fmt: skip

        try:
            result = run_training(request, run_dir, progress)
        except (ModelUnavailable, ValueError, FileExistsError) as error:
            raise click.ClickException(str(error)) from None
    result["evaluation"] = replay_judge.judged(result["evaluation"], capability, environment.tools, settings.capabilities)
    if as_json:
        print_json(result)
        return
    target = result["evaluation"]["target"]
    click.echo(
        f"{result['verdict']}: success {target['adapter']['success_rate']:.2f} {target['adapter']['success_interval']} "
        f"vs base {target['base']['success_rate']:.2f} {target['base']['success_interval']} on "
        f"{target['base']['seeds']} held-out seeds"
    )
    for reason in result["evaluation"]["reasons"]:
        click.echo(f"  {reason}")
    click.echo(f"recipe: {result['training']['recipe']} (trained on {result['device']})")
    for trial in result["training"]["tried"]:
        if "validation" in trial:
            click.echo(f"  {trial['recipe']}: validation success {trial['validation']['success_rate']:.2f}")
        if chosen := checkpoints_text(trial):
            click.echo(f"  {chosen}")
    if added := grpo_added_text(result["evaluation"].get("grpo_added")):
        click.echo(added)
    click.echo(f"adapter: {result['adapter']}" if result["adapter"] else "no adapter saved")
