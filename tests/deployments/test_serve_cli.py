"""`dspark serve`: starts its own local Ray, prints the base URL when ready, answers OpenAI requests through the HTTP
front asked for (HAProxy or Serve's Python proxy), and on SIGTERM shuts Serve and Ray down leaving no process
behind. (The drafter runs in-process here: the actor mode is covered by test_serve.py and test_placement.py.)"""
from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from deployments.launch import free_port
from tests.helpers import make_tiny_model
from tests.helpers import make_tiny_drafter

httpx = pytest.importorskip("httpx")
pytestmark = pytest.mark.slow
DSPARK = Path(sys.executable).parent / "dspark"


def ray_processes(tmpdir: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(tmpdir in part for part in p.info["cmdline"] or []):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


def wait_idle(base: str, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        stats = httpx.get(f"{base}/stats", timeout=10).json()
        if (stats["num_running"], stats["num_waiting"], stats["in_flight"]) == (0, 0, 0):
            return stats
        assert time.monotonic() < deadline, stats
        time.sleep(0.1)


def haproxy_pids() -> set[int]:
    return {p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == "haproxy"}


@pytest.mark.parametrize("http_proxy", ["haproxy", "ray"])
def test_dspark_serve_starts_answers_and_stops_cleanly(tmp_path, default_tokenizer, http_proxy):
    before = haproxy_pids()
    target = make_tiny_model("llama", tmp_path / "target", default_tokenizer)
    drafter = make_tiny_drafter(tmp_path / "drafter", len(default_tokenizer))
    port = free_port()
    ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths must stay < 108 bytes
    env = {**os.environ, "RAY_TMPDIR": ray_tmp, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(
        [str(DSPARK), "serve", "--model", str(target), "--drafter", str(drafter), "--dtype", "float32",
         "--speculation", "fixed:2", "--drafter-mode", "in_process", "--port", str(port), "--served-model-name",
         "tiny", "--num-cpus", "4", "--max-num-seqs", "4", "--http-proxy", http_proxy],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        line, deadline = "", time.monotonic() + 240
        while "http://" not in line:
            assert proc.poll() is None, f"dspark serve exited with {proc.returncode}"
            assert time.monotonic() < deadline, "dspark serve did not become ready"
            if select.select([proc.stdout], [], [], 1.0)[0]:
                line = proc.stdout.readline()
        assert f"http://127.0.0.1:{port}/v1" in line
        assert ray_processes(ray_tmp), "Ray should run under our RAY_TMPDIR"
        # HAProxy fronts the port, or Serve's Python proxy alone
        assert bool(haproxy_pids() - before) == (http_proxy == "haproxy")

        openai = pytest.importorskip("openai")
        oc = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60)
        out = oc.completions.create(model="tiny", prompt="Hello", max_tokens=6, temperature=0,
                                    extra_body={"ignore_eos": True})
        assert out.usage.completion_tokens == 6
        assert out.model_extra["metrics"]["speculative_decoding"]["num_spec_steps"] > 0
        # A non-streaming client that leaves: Serve's Python proxy cancels its request at once. HAProxy may not
        # tell the replica before it writes the answer (it reads a client whose request is complete only now and
        # then), so there the request may run to its end; either way it ends and frees everything
        # (operations.md, "The HTTP front"; a stream's disconnect is seen at its next chunk: test_serve.py).
        base = f"http://127.0.0.1:{port}"
        tokens_before = wait_idle(base)["generation_tokens"]
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{base}/v1/completions", timeout=0.3,
                       json={"prompt": "never read", "max_tokens": 600, "ignore_eos": True, "temperature": 0})
        stats = wait_idle(base)
        assert stats["kv_blocks_used"] == 0
        if http_proxy == "ray":
            assert stats["generation_tokens"] - tokens_before < 600

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 20
    while (left := ray_processes(ray_tmp)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, [p.info["cmdline"][:3] for p in left]
    while (stray := haproxy_pids() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not stray, "HAProxy outlived dspark serve"
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
    shutil.rmtree(ray_tmp, ignore_errors=True)


def test_dspark_serve_refuses_a_missing_model(tmp_path):
    out = subprocess.run([str(DSPARK), "serve", "--model", str(tmp_path / "nope")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and "not found" in out.stderr
