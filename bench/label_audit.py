"""Label audit on agent runs: how right are the capability labels on traces nobody here wrote?

Imports any `tracefix import` file (τ-bench, τ²-bench, or `messages`: chat transcripts) into a real
daemon with `tracefix import` (the real collector over loopback), waits for labeling, then prints,
per agent (service.name), per capability: needed / LACKING on successful and failed runs, ER+, ER-,
Δ, coverage, whether it would be selected on that agent's runs, and, for τ-bench files, how its
LACKING labels on failed runs line up with the ground-truth causes of failure that τ-bench records
(`info.task.actions`: the writes a correct agent makes; read here only to measure, never by a
labeler):

- missing: an expected write was never made (no call of that tool);
- unexpected: a write the task did not call for;
- arguments: an expected write was made with other arguments;
- output: a fact the task expects the agent to state (`info.task.outputs`) was never said.

When the runs of a `messages` file carry planted defects (`"planted": {"<capability>": "LACKING"}`
on failed runs, `{}` on successful ones: bench/agent_styles.py writes such files), it also prints
per agent and capability the LACKING rate on successful runs that need the capability (the target:
at most 15 % for every labeler with at least 10 such runs) and the recall of the planted defects
(planted LACKING labelled LACKING / planted; the target: at least 90 %).

It then samples, with a fixed seed, up to 20 LACKING and 10 PRESENT labels per capability and
writes each with its reason and the evidence turns quoted to `--sample` (markdown). Verdicts are
kept in a committed file (`--verdicts`, default docs/label-audit.md): rows whose trajectory,
capability, label and reason match a judged row keep its verdict, so the file can be refreshed
after a labeler change and only new labels need judging; each labeler's precision is computed
from it (right / judged LACKING labels).

Usage:
  python bench/label_audit.py RUNS.json --tools TOOLS.json [--format tau-bench]
      [--verdicts docs/label-audit.md] [--sample .tracefix/label-audit-sample.md] [--json]
  python bench/label_audit.py tests/fixtures/agents/helpdesk-confirming.jsonl --format messages
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tracefix.collectors.run_formats import FORMATS  # noqa: E402
from tests.conftest import make_daemon  # noqa: E402

LACKING_SAMPLE, PRESENT_SAMPLE, SEED = 20, 10, 17
# Planted defects: the most LACKING on successful runs, counted from this many runs needing the capability; the least recall.
PRECISION_TARGET, PRECISION_MIN_RUNS, RECALL_TARGET = 0.15, 10, 0.90
CAUSES = ("missing", "unexpected", "arguments", "output")
_VERDICT_ROW = re.compile(r"^\|\s*(?P<trajectory>[^|]+?)\s*\|\s*(?P<capability>[^|]+?)\s*\|\s*(?P<label>LACKING|PRESENT)\s*\|"
                          r"\s*(?P<reason>.*?)\s*\|\s*(?P<verdict>right|wrong|)\s*\|\s*(?P<why>.*?)\s*\|$")  # fmt: skip


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- ground truth -------------------------------------------------------------------------------


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _writes(calls: list[tuple[str, Any]], writes: set[str]) -> list[tuple[str, str]]:
    return [(name, _canonical(arguments)) for name, arguments in calls if name in writes]


def causes(run: dict[str, Any], writes: set[str]) -> set[str]:
    """The ground-truth causes of a failed τ-bench run (see the module docstring)."""
    task = (run.get("info") or {}).get("task") or {}
    expected = _writes([(a["name"], a.get("kwargs", {})) for a in task.get("actions") or []], writes)
    made = []
    for message in run["traj"]:
        for call in message.get("tool_calls") or []:
            function = call.get("function", call)
            arguments = function.get("arguments")
            try:
                arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
            except json.JSONDecodeError:
                pass
            made.append((function.get("name"), arguments))
    actual = _writes(made, writes)
    left_expected, left_actual = list(expected), list(actual)
    for write in expected:  # exact matches first
        if write in left_actual:
            left_actual.remove(write)
            left_expected.remove(write)
    found: set[str] = set()
    for name, _ in left_expected:
        same = next((write for write in left_actual if write[0] == name), None)
        if same is not None:
            left_actual.remove(same)
            found.add("arguments")
        else:
            found.add("missing")
    if left_actual:
        found.add("unexpected")
    said = " ".join(m.get("content") or "" for m in run["traj"] if m.get("role") == "assistant").lower().replace(",", "")
    if any(str(output).lower().replace(",", "") not in said for output in task.get("outputs") or []):
        found.add("output")
    return found


# --- the daemon ---------------------------------------------------------------------------------


def import_runs(daemon: Any, runs_path: Path, tools_path: Path | None, run_format: str) -> dict[str, Any]:
    command = [sys.executable, "-m", "tracefix.daemon.app.cli", "import", str(runs_path), "--format", run_format, "--json",
               "--config", str(daemon.config_path)]  # fmt: skip
    if tools_path is not None:
        command += ["--tools", str(tools_path)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"import failed ({done.returncode}): {done.stderr or done.stdout}")
    return json.loads(done.stdout)


def fetch_all(daemon: Any, service: str) -> list[dict[str, Any]]:
    ids: list[str] = []
    while True:
        page = daemon.get("/api/trajectories", service=service, limit=500, offset=len(ids))
        ids += [item["trajectory_id"] for item in page["items"]]
        if len(ids) >= page["total"] or not page["items"]:
            break
    return [daemon.get(f"/api/trajectories/{quote(trajectory_id, safe='')}") for trajectory_id in ids]


def wait_labeled(daemon: Any, expected: int, capabilities: int, timeout_s: float = 600) -> None:
    """Wait until every capability has labeled `expected` runs and the labels hold still across an
    analysis pass (a pass may label some again: an agent's profile, derived from its runs, changed)."""
    deadline = time.monotonic() + timeout_s
    previous = None
    while time.monotonic() < deadline:
        daemon.wait_analyzed(timeout_s)
        rows = daemon.get("/api/capabilities")["items"]
        counted = [sum(w.get("n_success", 0) + w.get("n_failure", 0) + w.get("n_unknown", 0) for w in [r["windows"].get("all", {})])
                   for r in rows]  # fmt: skip
        snapshot = [(r["name"], *(r["windows"].get("all", {}).get(key) for key in ("needed_success", "needed_failure",
                     "lacking_success", "lacking_failure"))) for r in rows]  # fmt: skip
        if len(rows) >= capabilities and all(count >= expected for count in counted):
            if snapshot == previous:
                return
            previous = snapshot
        else:
            time.sleep(0.5)
    raise TimeoutError("labeling did not finish")


# --- evidence -----------------------------------------------------------------------------------


def _quote(text: str, limit: int = 300) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def evidence(trajectory: dict[str, Any], span_ids: list[str], reason: str) -> list[str]:
    """The turns a label points at, quoted: messages and tool calls recorded by those spans, and the
    message its reason names."""
    named = {int(number) for number in re.findall(r"message (\d+)", reason)}
    quoted = []
    for message in trajectory["messages"]:
        if (message["span_id"] in span_ids or message["position"] in named) and message["role"] != "system":
            calls = json.loads(message["tool_calls"] or "[]")
            text = message["content"] or ", ".join(f"{c['name']}({c['arguments']})" for c in calls)
            quoted.append(f"message {message['position']} ({message['role']}): {_quote(text)}")
    for call in trajectory["tool_calls"]:
        if call["span_id"] in span_ids:
            result = call["error"] or call["result"] or ""
            quoted.append(f"call {call['position']} {call['tool_name']}({_quote(call['arguments'] or '', 160)}) -> {_quote(result, 160)}")
    return quoted[:5]


# --- verdicts -----------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def read_verdicts(path: Path) -> dict[tuple[str, str, str, str], tuple[str, str]]:
    verdicts: dict[tuple[str, str, str, str], tuple[str, str]] = {}
    if not path.exists():
        return verdicts
    for line in path.read_text().splitlines():
        match = _VERDICT_ROW.match(line.strip())
        if match and match["verdict"]:
            key = (match["trajectory"], match["capability"], match["label"], match["reason"])
            verdicts[key] = (match["verdict"], match["why"])
    return verdicts


# --- planted defects ---------------------------------------------------------------------------


def read_planted(path: Path) -> dict[str, dict[str, str]]:
    """The planted defects of each run of a `messages` file (JSON lines or a JSON array) that has them, by run id."""
    text = path.read_text()
    try:
        document = json.loads(text)
        runs = document if isinstance(document, list) else [document]
    except json.JSONDecodeError:
        runs = [json.loads(line) for line in text.splitlines() if line.strip()]
    return {run["run_id"]: run["planted"] for run in runs if isinstance(run, dict) and isinstance(run.get("planted"), dict)}


def run_labels(trajectory: dict[str, Any]) -> dict[str, str]:
    """A trajectory's label per capability (its first labeling run's, where a labeler repeats)."""
    labels: dict[str, str] = {}
    for label in sorted(trajectory["labels"], key=lambda label: label.get("run") or 0):
        labels.setdefault(label["capability"], label["label"])
    return labels


def planted_scores(runs: Iterable[tuple[str | None, dict[str, str], dict[str, str]]]) -> dict[str, dict[str, Any]]:
    """Per capability, over the (outcome, planted, labels) of one agent's runs: of the successful runs
    that need it (labelled LACKING or PRESENT) how many are LACKING, and of the planted LACKING defects
    how many were labelled LACKING, each with whether it meets its target (None: too few runs to say)."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for outcome, planted, labels in runs:
        for capability, label in labels.items():
            if outcome == "success" and label in ("LACKING", "PRESENT"):
                counts[capability]["needed"] += 1
                counts[capability]["lacking"] += label == "LACKING"
        for capability, expected in planted.items():
            if expected == "LACKING":
                counts[capability]["planted"] += 1
                counts[capability]["recalled"] += labels.get(capability) == "LACKING"
    scores = {}
    for capability in sorted(counts):
        count = counts[capability]
        share = count["lacking"] / count["needed"] if count["needed"] else None
        recall = count["recalled"] / count["planted"] if count["planted"] else None
        scores[capability] = {
            "success_needed": count["needed"], "success_lacking": count["lacking"], "success_lacking_share": share,
            "precision_ok": None if count["needed"] < PRECISION_MIN_RUNS else share <= PRECISION_TARGET,
            "planted": count["planted"], "recalled": count["recalled"], "recall": recall,
            "recall_ok": None if recall is None else recall >= RECALL_TARGET,
        }  # fmt: skip
    return scores


# --- main ---------------------------------------------------------------------------------------


def capability_line(
    stats: dict[str, Any], selected: bool, lacking_failed: list[dict[str, Any]], run_causes: dict[str, set[str]]
) -> dict[str, Any]:
    """One capability's row: its statistics, and the ground-truth causes of the failed runs it labelled LACKING."""
    return {
        "capability": stats.get("capability"),
        "needed_success": stats.get("needed_success"), "needed_failure": stats.get("needed_failure"),
        "lacking_success": stats.get("lacking_success"), "lacking_failure": stats.get("lacking_failure"),
        "er_plus": stats.get("er_plus"), "er_minus": stats.get("er_minus"),
        "delta": stats.get("delta"), "coverage": stats.get("coverage"), "selected": selected,
        "causes": {cause: sum(1 for t in lacking_failed if cause in run_causes.get(t["trajectory_id"], ())) for cause in CAUSES},
        "no_known_cause": sum(1 for t in lacking_failed if not run_causes.get(t["trajectory_id"])),
    }  # fmt: skip


def _number(value: Any) -> str:
    return "—" if value is None else f"{value:.2f}"


def _share(part: int, whole: int) -> str:
    return f"{part} ({part / whole:.2f})" if whole else f"{part}"


def print_table(table: list[dict[str, Any]], precision: dict[str, dict[str, int]], with_causes: bool) -> None:
    causes_header = " LACKING failures by cause (missing / unexpected / arguments / output / none) |" if with_causes else ""
    print("| capability | needed S/F | LACKING on successes | LACKING on failures | ER+ | ER− | Δ | coverage | selected "
          f"|{causes_header} audited precision |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|" + ("---|" if with_causes else "") + "---|")
    for line in table:
        audit = precision.get(line["capability"], {"right": 0, "judged": 0, "sampled": 0})
        audited = (f"{audit['right']}/{audit['judged']} = {audit['right'] / audit['judged']:.2f}" if audit["judged"]
                   else "—") + (f" ({audit['sampled'] - audit['judged']} unjudged)" if audit["sampled"] > audit["judged"] else "")  # fmt: skip
        causes_text = " / ".join(str(line["causes"][cause]) for cause in CAUSES) + f" / {line['no_known_cause']} |" if with_causes else ""
        print(
            f"| {line['capability']} | {line['needed_success']}/{line['needed_failure']} "
            f"| {_share(line['lacking_success'] or 0, line['needed_success'] or 0)} "
            f"| {_share(line['lacking_failure'] or 0, line['needed_failure'] or 0)} "
            f"| {_number(line['er_plus'])} | {_number(line['er_minus'])} | {_number(line['delta'])} | {_number(line['coverage'])} "
            f"| {'yes' if line['selected'] else 'no'} |{' ' + causes_text if with_causes else ''} {audited} |"
        )  # fmt: skip


def print_planted(scores: dict[str, dict[str, Any]]) -> None:
    def verdict(ok: bool | None) -> str:
        return "—" if ok is None else ("yes" if ok else "**no**")

    print(f"| capability | successes needing it | LACKING on successes | ≤ {PRECISION_TARGET:.0%} | planted | labelled LACKING "
          f"| recall | ≥ {RECALL_TARGET:.0%} |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for capability, score in scores.items():
        print(
            f"| {capability} | {score['success_needed']} | {_share(score['success_lacking'], score['success_needed'])} "
            f"| {verdict(score['precision_ok'])} | {score['planted']} | {score['recalled']} | {_number(score['recall'])} "
            f"| {verdict(score['recall_ok'])} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, help="a file `tracefix import` reads: τ-bench trajectories, τ²-bench results, messages")
    parser.add_argument("--tools", type=Path, default=None, help="tool definitions, OpenAI function format")
    parser.add_argument("--format", default="tau-bench", choices=list(FORMATS))
    parser.add_argument("--verdicts", type=Path, default=REPO / "docs" / "label-audit.md")
    parser.add_argument("--sample", type=Path, default=REPO / ".tracefix" / "label-audit-sample.md",
                        help="where the sampled labels are written, with any verdicts already given")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the tables as JSON too")
    args = parser.parse_args(argv)

    runs = json.loads(args.runs.read_text()) if args.format == "tau-bench" else []
    by_run = {f"{args.runs.stem}/task-{run.get('task_id')}/trial-{run.get('trial', 0)}": run for run in runs}
    # The writes are the tools the ground truth expects anywhere in the file: independent of the labelers' settings.
    writes = {action["name"] for run in runs for action in ((run.get("info") or {}).get("task") or {}).get("actions") or []}
    planted = read_planted(args.runs) if args.format == "messages" else {}

    with tempfile.TemporaryDirectory(prefix="label-audit-") as directory:
        daemon = make_daemon(Path(directory), analysis={"interval_s": 1.0}, trigger={"hold_passes": 1}).start()
        try:
            started = time.perf_counter()
            report = import_runs(daemon, args.runs, args.tools, args.format)
            log(f"imported {report['requests']} runs, {report['spans']} spans in {time.perf_counter() - started:.1f} s")
            capabilities = daemon.get("/api/capabilities")["items"]
            wait_labeled(daemon, report["requests"], len(capabilities))
            log(f"labeled in {time.perf_counter() - started:.1f} s")
            capabilities = daemon.get("/api/capabilities")["items"]
            services = sorted({item["service_name"] for item in daemon.get("/api/agents")["items"]})
            trajectories = [trajectory for service in services for trajectory in fetch_all(daemon, service)]
            agent_stats = {
                service: daemon.get(f"/api/agents/{quote(service, safe='')}/capabilities")["items"] for service in services
            }
        finally:
            daemon.stop()

    # Per capability: counts, ER+, ER-, Δ, coverage, selection, and causes of the LACKING failures.
    run_causes = {t["trajectory_id"]: causes(by_run[t["conversation_id"]], writes) for t in trajectories
                  if t["outcome"] == "failure" and t.get("conversation_id") in by_run}  # fmt: skip
    failed_causes = Counter(cause for found in run_causes.values() for cause in found)
    labels: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = defaultdict(list)
    for trajectory in trajectories:
        for label in trajectory["labels"]:
            labels[label["capability"]].append((trajectory, label))

    def lacking_failed(name: str, service: str | None = None) -> list[dict[str, Any]]:
        return [t for t, label in labels[name] if label["label"] == "LACKING" and t["outcome"] == "failure"
                and service in (None, t["service_name"])]  # fmt: skip

    table = [
        capability_line({"capability": c["name"], **c["windows"].get("all", {})}, c["selected"], lacking_failed(c["name"]), run_causes)
        for c in capabilities
    ]  # fmt: skip
    agent_tables = {
        service: [capability_line(row, bool(row.get("selected")), lacking_failed(row["capability"], service), run_causes)
                  for row in sorted(rows, key=lambda row: row["capability"])]
        for service, rows in agent_stats.items()
    }  # fmt: skip

    # Sample and carry the verdicts over.
    verdicts = read_verdicts(args.verdicts)
    rng = random.Random(SEED)
    sample_rows: list[tuple[str, str, str, str, str, str, list[str]]] = []
    agent_of: dict[str, str] = {}
    for capability in capabilities:
        name = capability["name"]
        for wanted, size in (("LACKING", LACKING_SAMPLE), ("PRESENT", PRESENT_SAMPLE)):
            pool = sorted((pair for pair in labels[name] if pair[1]["label"] == wanted), key=lambda p: p[0]["conversation_id"] or "")
            for trajectory, label in rng.sample(pool, min(size, len(pool))):
                key = (trajectory["conversation_id"] or trajectory["trajectory_id"], name, wanted, _cell(label["reason"]))
                verdict, why = verdicts.get(key, ("", ""))
                quoted = evidence(trajectory, list(label["span_ids"] or []), label["reason"])
                sample_rows.append((*key, verdict, why, [f"{trajectory['outcome']}", *quoted]))
                agent_of[key[0]] = trajectory["service_name"]

    def audited(service: str | None = None) -> dict[str, dict[str, int]]:
        """Per capability, the sampled labels (of one agent's runs when given) and the verdicts on them."""
        rows = [row for row in sample_rows if service in (None, agent_of.get(row[0]))]
        precision = {}
        for capability in capabilities:
            name = capability["name"]
            judged = [row for row in rows if row[1] == name and row[2] == "LACKING" and row[4]]
            present = [row for row in rows if row[1] == name and row[2] == "PRESENT" and row[4]]
            precision[name] = {
                "sampled": sum(1 for row in rows if row[1] == name and row[2] == "LACKING"),
                "judged": len(judged), "right": sum(1 for row in judged if row[4] == "right"),
                "present_judged": len(present), "present_right": sum(1 for row in present if row[4] == "right"),
            }  # fmt: skip
        return precision

    precision = audited()
    lines = [
        "# Label audit: built-in rule labelers on real runs",
        "",
        f"Labels of `{args.runs.name}` sampled by `bench/label_audit.py` (seed {SEED}: up to {LACKING_SAMPLE} LACKING and "
        f"{PRESENT_SAMPLE} PRESENT per capability), each judged by reading the run: *right* when the run shows what the label "
        "says, *wrong* otherwise. Rerunning the bench with `--sample` and `--verdicts` on this file keeps every verdict whose "
        "trajectory, capability, label and reason are unchanged; new labels arrive unjudged. Evidence (the turns each label "
        "points at) follows the table.",
        "",
        "| capability | LACKING sampled | judged | right | precision | PRESENT judged | right |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, audit in precision.items():
        share = f"{audit['right'] / audit['judged']:.2f}" if audit["judged"] else "—"
        lines.append(
            f"| {name} | {audit['sampled']} | {audit['judged']} | {audit['right']} | {share} "
            f"| {audit['present_judged']} | {audit['present_right']} |"
        )
    lines += ["", "## Verdicts", "", "| trajectory | capability | label | reason | verdict | why |", "|---|---|---|---|---|---|"]
    details = []
    for trajectory, name, label, reason, verdict, why, quoted in sample_rows:
        lines.append(f"| {trajectory} | {name} | {label} | {reason} | {verdict} | {_cell(why)} |")
        details.append(f"- **{trajectory}** {name} {label} ({quoted[0]}): {reason}")
        details.extend(f"  - {_cell(text)}" for text in quoted[1:])
    args.sample.parent.mkdir(parents=True, exist_ok=True)
    args.sample.write_text("\n".join(lines) + "\n\n## Evidence\n\n" + "\n".join(details) + "\n")

    print(f"{len(trajectories)} runs: {sum(t['outcome'] == 'success' for t in trajectories)} succeeded, "
          f"{sum(t['outcome'] == 'failure' for t in trajectories)} failed", end="")  # fmt: skip
    if by_run:
        print("; causes of the failures: " + ", ".join(f"{cause} {failed_causes[cause]}" for cause in CAUSES)
              + f", none of these {sum(1 for found in run_causes.values() if not found)}", end="")  # fmt: skip
    print()
    agents: dict[str, dict[str, Any]] = {}
    for service, agent_table in agent_tables.items():
        own = [t for t in trajectories if t["service_name"] == service]
        agent = {
            "runs": len(own), "succeeded": sum(t["outcome"] == "success" for t in own),
            "failed": sum(t["outcome"] == "failure" for t in own), "table": agent_table, "precision": audited(service),
        }  # fmt: skip
        print(f"\n## {service}: {agent['runs']} runs, {agent['succeeded']} succeeded, {agent['failed']} failed\n")
        print_table(agent_table, agent["precision"], with_causes=bool(by_run))
        known = [t for t in own if t.get("conversation_id") in planted]
        if known:
            agent["planted"] = planted_scores((t["outcome"], planted[t["conversation_id"]], run_labels(t)) for t in known)
            # The runs behind the misses, for whoever fixes a labeler: planted but not LACKING, LACKING on a success.
            agent["missed"] = {capability: [f"{t['conversation_id']} ({run_labels(t).get(capability, 'unlabeled')})" for t in known
                                            if planted[t["conversation_id"]].get(capability) == "LACKING"
                                            and run_labels(t).get(capability) != "LACKING"] for capability in agent["planted"]}  # fmt: skip
            agent["lacking_on_success"] = {capability: [t["conversation_id"] for t in known if t["outcome"] == "success"
                                                        and run_labels(t).get(capability) == "LACKING"] for capability in agent["planted"]}  # fmt: skip
            print(f"\nPlanted defects ({len(known)} runs): LACKING on successful runs that need the capability "
                  f"(target ≤ {PRECISION_TARGET:.0%} with ≥ {PRECISION_MIN_RUNS} runs) and recall of the planted "
                  f"LACKING (target ≥ {RECALL_TARGET:.0%}):\n")  # fmt: skip
            print_planted(agent["planted"])
            for heading, runs_by in (("planted defects missed", agent["missed"]), ("LACKING on successes", agent["lacking_on_success"])):
                for capability, ids in runs_by.items():
                    if ids:
                        more = f" and {len(ids) - 10} more" if len(ids) > 10 else ""
                        print(f"- {heading}, {capability}: {', '.join(ids[:10])}{more}")
        agents[service] = agent
    log(f"sample of {len(sample_rows)} labels written to {args.sample}")
    if args.json:
        print(json.dumps({"table": table, "precision": precision, "causes": dict(failed_causes), "agents": agents}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
