"""Label audit on real agent runs: how right are the capability labels on traces nobody here wrote?

Imports a τ-bench (or τ²-bench) results file into a real daemon with `tracefix import` (the real
collector over loopback), waits for labeling, then prints per capability: needed / LACKING on
successful and failed runs, ER+, ER-, Δ, coverage, whether it was selected, and how its LACKING
labels on failed runs line up with the ground-truth causes of failure that τ-bench records
(`info.task.actions`: the writes a correct agent makes; read here only to measure, never by a
labeler):

- missing: an expected write was never made (no call of that tool);
- unexpected: a write the task did not call for;
- arguments: an expected write was made with other arguments;
- output: a fact the task expects the agent to state (`info.task.outputs`) was never said.

It then samples, with a fixed seed, up to 20 LACKING and 10 PRESENT labels per capability and
writes each with its reason and the evidence turns quoted to `--sample` (markdown). Verdicts are
kept in a committed file (`--verdicts`, default docs/label-audit.md): rows whose trajectory,
capability, label and reason match a judged row keep its verdict, so the file can be refreshed
after a labeler change and only new labels need judging; each labeler's precision is computed
from it (right / judged LACKING labels).

Usage:
  python bench/label_audit.py RUNS.json --tools TOOLS.json [--format tau-bench]
      [--verdicts docs/label-audit.md] [--sample .tracefix/label-audit-sample.md] [--json]
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
from pathlib import Path
from typing import Any
from urllib.parse import quote

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.conftest import make_daemon  # noqa: E402

LACKING_SAMPLE, PRESENT_SAMPLE, SEED = 20, 10, 17
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
    command = [sys.executable, "-m", "daemon.app.cli", "import", str(runs_path), "--format", run_format, "--json",
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
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        daemon.wait_analyzed(timeout_s)
        rows = daemon.get("/api/capabilities")["items"]
        counted = [sum(w.get("n_success", 0) + w.get("n_failure", 0) + w.get("n_unknown", 0) for w in [r["windows"].get("all", {})])
                   for r in rows]  # fmt: skip
        if len(rows) >= capabilities and all(count >= expected for count in counted):
            return
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


# --- main ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, help="τ-bench historical trajectories (or τ²-bench results) file")
    parser.add_argument("--tools", type=Path, default=None, help="tool definitions, OpenAI function format")
    parser.add_argument("--format", default="tau-bench", choices=["tau-bench", "tau2-bench"])
    parser.add_argument("--verdicts", type=Path, default=REPO / "docs" / "label-audit.md")
    parser.add_argument("--sample", type=Path, default=REPO / ".tracefix" / "label-audit-sample.md",
                        help="where the sampled labels are written, with any verdicts already given")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the table as JSON too")
    args = parser.parse_args(argv)

    runs = json.loads(args.runs.read_text()) if args.format == "tau-bench" else []
    by_run = {f"{args.runs.stem}/task-{run.get('task_id')}/trial-{run.get('trial', 0)}": run for run in runs}
    # The writes are the tools the ground truth expects anywhere in the file: independent of the labelers' settings.
    writes = {action["name"] for run in runs for action in ((run.get("info") or {}).get("task") or {}).get("actions") or []}

    with tempfile.TemporaryDirectory(prefix="label-audit-") as directory:
        daemon = make_daemon(Path(directory), analysis={"interval_s": 1.0}, trigger={"hold_passes": 1}).start()
        try:
            started = time.perf_counter()
            report = import_runs(daemon, args.runs, args.tools, args.format)
            log(f"imported {report['requests']} runs, {report['spans']} spans in {time.perf_counter() - started:.1f} s")
            capabilities = daemon.get("/api/capabilities")["items"]
            wait_labeled(daemon, report["requests"], len(capabilities))
            capabilities = daemon.get("/api/capabilities")["items"]
            trajectories = fetch_all(daemon, args.format)
        finally:
            daemon.stop()

    # Per capability: counts, ER+, ER-, Δ, coverage, selection, and causes of the LACKING failures.
    table = []
    run_causes = {t["trajectory_id"]: causes(by_run[t["conversation_id"]], writes) for t in trajectories
                  if t["outcome"] == "failure" and t.get("conversation_id") in by_run}  # fmt: skip
    failed_causes = Counter(cause for found in run_causes.values() for cause in found)
    labels: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = defaultdict(list)
    for trajectory in trajectories:
        for label in trajectory["labels"]:
            labels[label["capability"]].append((trajectory, label))
    for capability in capabilities:
        name = capability["name"]
        stats = capability["windows"].get("all", {})
        lacking_failed = [t for t, label in labels[name] if label["label"] == "LACKING" and t["outcome"] == "failure"]
        line = {
            "capability": name,
            "needed_success": stats.get("needed_success"), "needed_failure": stats.get("needed_failure"),
            "lacking_success": stats.get("lacking_success"), "lacking_failure": stats.get("lacking_failure"),
            "er_plus": stats.get("er_plus"), "er_minus": stats.get("er_minus"),
            "delta": stats.get("delta"), "coverage": stats.get("coverage"), "selected": capability["selected"],
            "causes": {cause: sum(1 for t in lacking_failed if cause in run_causes.get(t["trajectory_id"], ())) for cause in CAUSES},
            "no_known_cause": sum(1 for t in lacking_failed if not run_causes.get(t["trajectory_id"])),
        }  # fmt: skip
        table.append(line)

    # Sample and carry the verdicts over.
    verdicts = read_verdicts(args.verdicts)
    rng = random.Random(SEED)
    sample_rows: list[tuple[str, str, str, str, str, str, list[str]]] = []
    precision: dict[str, dict[str, int]] = {}
    for capability in capabilities:
        name = capability["name"]
        for wanted, size in (("LACKING", LACKING_SAMPLE), ("PRESENT", PRESENT_SAMPLE)):
            pool = sorted((pair for pair in labels[name] if pair[1]["label"] == wanted), key=lambda p: p[0]["conversation_id"] or "")
            for trajectory, label in rng.sample(pool, min(size, len(pool))):
                key = (trajectory["conversation_id"] or trajectory["trajectory_id"], name, wanted, _cell(label["reason"]))
                verdict, why = verdicts.get(key, ("", ""))
                quoted = evidence(trajectory, list(label["span_ids"] or []), label["reason"])
                sample_rows.append((*key, verdict, why, [f"{trajectory['outcome']}", *quoted]))
        judged = [row for row in sample_rows if row[1] == name and row[2] == "LACKING" and row[4]]
        present = [row for row in sample_rows if row[1] == name and row[2] == "PRESENT" and row[4]]
        precision[name] = {
            "sampled": sum(1 for row in sample_rows if row[1] == name and row[2] == "LACKING"),
            "judged": len(judged), "right": sum(1 for row in judged if row[4] == "right"),
            "present_judged": len(present), "present_right": sum(1 for row in present if row[4] == "right"),
        }  # fmt: skip

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

    def number(value: Any) -> str:
        return "—" if value is None else f"{value:.2f}"

    print(f"{len(trajectories)} runs: {sum(t['outcome'] == 'success' for t in trajectories)} succeeded, "
          f"{sum(t['outcome'] == 'failure' for t in trajectories)} failed; causes of the failures: "
          + ", ".join(f"{cause} {failed_causes[cause]}" for cause in CAUSES)
          + f", none of these {sum(1 for found in run_causes.values() if not found)}")  # fmt: skip
    print()
    print("| capability | needed S/F | LACKING on successes | LACKING on failures | ER+ | ER− | Δ | coverage | selected "
          "| LACKING failures by cause (missing / unexpected / arguments / output / none) | audited precision |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for line in table:
        share = lambda part, whole: f"{part} ({part / whole:.2f})" if whole else f"{part}"  # noqa: E731
        audit = precision[line["capability"]]
        audited = (f"{audit['right']}/{audit['judged']} = {audit['right'] / audit['judged']:.2f}" if audit["judged"]
                   else "—") + (f" ({audit['sampled'] - audit['judged']} unjudged)" if audit["sampled"] > audit["judged"] else "")  # fmt: skip
        causes_text = " / ".join(str(line["causes"][cause]) for cause in CAUSES) + f" / {line['no_known_cause']}"
        print(
            f"| {line['capability']} | {line['needed_success']}/{line['needed_failure']} "
            f"| {share(line['lacking_success'] or 0, line['needed_success'] or 0)} "
            f"| {share(line['lacking_failure'] or 0, line['needed_failure'] or 0)} "
            f"| {number(line['er_plus'])} | {number(line['er_minus'])} | {number(line['delta'])} | {number(line['coverage'])} "
            f"| {'yes' if line['selected'] else 'no'} | {causes_text} | {audited} |"
        )  # fmt: skip
    log(f"sample of {len(sample_rows)} labels written to {args.sample}")
    if args.json:
        print(json.dumps({"table": table, "precision": precision, "causes": dict(failed_causes)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
