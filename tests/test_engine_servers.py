"""One rollout-server process per device group (rollout/backends/engine_servers.py), on CPU.

Two real server processes serve a tiny random model (one on a single device, one
tensor-parallel over two): their greedy outputs must equal a plain argmax loop over the same
weights, a session must stay on its server (and reuse its KV prefix
there), sessions must spread over both servers, a weight update must reach both, and closing
must stop the processes and remove the weight exports.
"""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

from agentrl_jax.rollout.contract import SamplingParams
from agentrl_jax.rollout.engine.engine_config import EngineConfig
from agentrl_jax.rollout.backends.engine_servers import (EngineServers, device_environment,
                                                server_flags)
from agentrl_jax.rollout.servers.server import parse_args
from rollout_helpers import TINY, byte_tokenizer, random_prompt, reference_greedy, tiny_model

GREEDY = dict(temperature=0.0, ignore_eos=True)
CONFIG = EngineConfig(max_batch=4, max_length=128, prefill_chunks=(16, 64), prefill_tokens=64,
                      decode_steps=4, dtype="float32")


def test_server_flags_rebuild_the_engine_config():
    config = EngineConfig(max_batch=5, max_length=96, dtype="bfloat16", weights_dtype="bfloat16",
                          prefill_chunks=(32, 64), prefill_tokens=256, decode_steps=3, seed=7,
                          max_queue=11, decode_attention="dense", prefill_kv_buckets=(48,),
                          decode_gemm="merged", prefill_attention="dense")
    args = parse_args(server_flags(config))
    assert (args.max_batch, args.max_length, args.dtype, args.weights_dtype) == (
        5, 96, "bfloat16", "bfloat16")
    assert (args.prefill_chunks, args.prefill_tokens, args.decode_steps, args.seed) == (
        "32,64", 256, 3, 7)
    assert (args.max_queue, args.decode_attention, args.prefill_kv_buckets) == (11, "dense", "48")
    assert (args.decode_gemm, args.prefill_attention) == ("merged", "dense")
    auto = parse_args(server_flags(EngineConfig(prefill_kv_buckets=None)))
    assert auto.prefill_kv_buckets == "auto" and auto.dtype is None


def test_device_environment_maps_through_the_visible_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    env = device_environment([1], "gpu")
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert device_environment([0, 1], "gpu", 0.4)["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.4"
    with pytest.raises(ValueError, match="not among CUDA_VISIBLE_DEVICES"):
        device_environment([2], "gpu")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert device_environment([1], "gpu")["CUDA_VISIBLE_DEVICES"] == "1"
    with pytest.raises(ValueError, match="not 'tpu'"):
        device_environment([0], "tpu")
    with pytest.raises(ValueError, match="mem_fraction"):
        device_environment([0], "gpu", 1.5)


def test_server_refuses_more_tensor_parallel_devices_than_it_has():
    import subprocess
    import sys

    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=2")
    proc = subprocess.run([sys.executable, "-m", "agentrl_jax.rollout.servers.server", "--model",
                           "/nonexistent", "--tensor-parallel", "3"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "--tensor-parallel 3: this process has 2 local device(s)" in proc.stderr


@pytest.fixture(scope="module")
def servers():
    # the second server shards its engine over 2 devices (tensor parallel)
    backend = EngineServers(tiny_model(seed=0), CONFIG, [[0], [1, 2]], "cpu",
                            tokenizer=byte_tokenizer(TINY.vocab_size), startup_timeout=300)
    yield backend
    backend.close()


def test_two_server_processes_generate_what_the_weights_say(servers):
    model = tiny_model(seed=0)
    rng = np.random.default_rng(0)
    prompts = [random_prompt(rng, n) for n in (5, 9, 17, 30)]

    async def run():
        return await asyncio.gather(*[
            servers.generate(p, SamplingParams(max_new_tokens=8, **GREEDY),
                             session_id=f"s{i}") for i, p in enumerate(prompts)])

    results = asyncio.run(run())
    for prompt, result in zip(prompts, results):
        assert result.output_ids == reference_greedy(model, prompt, 8)
    assert servers.num_replicas == 2 and servers.total_slots == 8
    devices = [info["devices"] for info in asyncio.run(servers.server_info())]
    assert [len(d) for d in devices] == [1, 2]  # the second server is tensor parallel
    assert all(s.served > 0 for s in servers.servers)  # 4 sessions spread over both


def test_a_session_returns_to_its_server_and_reuses_its_prefix(servers):
    model = tiny_model(seed=0)
    prompt = random_prompt(np.random.default_rng(1), 12)
    sampling = SamplingParams(max_new_tokens=6, **GREEDY)

    async def two_turns():
        first = await servers.generate(prompt, sampling, session_id="episode-7")
        served = [s.served for s in servers.servers]
        follow = prompt + first.output_ids + random_prompt(np.random.default_rng(2), 5)
        second = await servers.generate(follow, sampling, session_id="episode-7")
        moved = [s.served - before for s, before in zip(servers.servers, served)]
        return first, follow, second, moved

    first, follow, second, moved = asyncio.run(two_turns())
    assert sorted(moved) == [0, 1]  # the second turn went to exactly one server: the first's
    assert second.cached_tokens >= len(prompt)  # its KV prefix was still there
    assert second.output_ids == reference_greedy(model, follow, 6)

    async def end_it():
        def cached(infos):
            return sum(info["load"]["cached_slots"] for info in infos)

        before = cached(await servers.server_info())
        pins = sum(servers.pinned_sessions())
        servers.end_session("episode-7")  # posts /close_session in the background
        assert sum(servers.pinned_sessions()) == pins - 1
        for _ in range(100):
            after = cached(await servers.server_info())
            if after < before:
                break
            await asyncio.sleep(0.05)
        return before, after

    before, after = asyncio.run(end_it())
    assert after == before - 1  # the episode's cached row is free on its server


def test_weight_update_reaches_every_server_then_close_stops_them(servers):
    """(Last in this file: it closes the module's servers.)"""
    other = tiny_model(seed=1)
    rng = np.random.default_rng(3)
    prompts = [random_prompt(rng, 7 + i) for i in range(4)]
    served = [s.served for s in servers.servers]

    async def update_and_generate():
        await servers.update_weights(other, version="step-1")
        return await asyncio.gather(*[
            servers.generate(p, SamplingParams(max_new_tokens=6, **GREEDY), session_id=f"u{i}")
            for i, p in enumerate(prompts)])

    results = asyncio.run(update_and_generate())
    for prompt, result in zip(prompts, results):
        assert result.output_ids == reference_greedy(other, prompt, 6)
        assert result.weight_version == "step-1"
    assert all(s.served > before for s, before in zip(servers.servers, served))  # both answered

    export_dir = servers.export_dir
    processes = [p.process for p in servers.processes]
    assert os.path.isdir(export_dir) and all(p.poll() is None for p in processes)
    servers.close()
    assert all(p.poll() is not None for p in processes)
    assert not os.path.exists(export_dir)


def _gone(pid: int) -> bool:
    """The process has exited (a zombie waiting for a reaper counts as exited)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except FileNotFoundError:
        return True


def test_a_launched_server_exits_when_its_launcher_dies():
    """start_env_server passes --parent-pid (engine servers get the same flag): a launcher that
    dies without stopping its server must not leave the server running."""
    import subprocess
    import sys
    import time

    code = ("import os\nfrom agentrl_common.processes import start_env_server\n"
            "server = start_env_server('babyai')\nprint(server.pid, flush=True)\nos._exit(0)\n")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=repo, timeout=120, check=True)
    pid = int(out.stdout.split()[-1])
    deadline = time.monotonic() + 20
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _gone(pid), f"server {pid} still running after its launcher exited"
