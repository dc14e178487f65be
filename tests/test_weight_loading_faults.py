"""Weight loading cannot hurt the inference server (issue 52, item 2).

A real rollout server process on loopback serves the tiny random model, with a ``--weights-dir``;
each hostile checkpoint below is sent to ``/update_weights_from_disk``, and each must get a 4xx
with a clear message while ``/health`` keeps answering: a FIFO named ``model.safetensors``
(before: the whole server froze), a config.json with ``num_hidden_layers: 10**9`` (before: a
loader thread spun forever), a sparse file whose header claims a 4 TiB tensor (before: a Rust
panic and an empty reply), one claiming 2 GiB (before: read in full, then refused) and a
``model.safetensors`` symlink out of the checkpoint (before: loaded). In-process tests check
that the 2 GiB one is refused from its header alone and that a load stops when its client goes
away or the server shuts down.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading

import aiohttp
import pytest

from agentrl_common.processes import ServerProcess, free_port
from agentrl_jax.models.safetensors_io import load_safetensors_model, save_hf_directory
from agentrl_jax.models.weights import CheckpointError, LoadCancelled, expected_hf_shapes
from rollout_helpers import TINY, byte_tokenizer, make_engine, start_server, tiny_model

TIB, GIB = 1024**4, 1024**3
#: a hung server is a failed test, not a hung suite (the reply itself is what is checked)
REPLY_TIMEOUT = aiohttp.ClientTimeout(total=120)


def forged_safetensors(path, shapes: dict[str, tuple[int, ...]]) -> None:
    """A float32 safetensors file with these tensors, all zeros and sparse (only the header is
    written; the data region is a hole of the declared size)."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 4
        for d in shape:
            size *= d
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset,
                                                                                 offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)


def tiny_checkpoint(directory, model=None) -> str:
    """A loadable checkpoint of the tiny model at ``directory``."""
    save_hf_directory(model if model is not None else tiny_model(seed=1), str(directory))
    return str(directory)


def tiny_config(directory) -> None:
    """The tiny model's config.json in ``directory`` (created)."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(TINY.to_hf_dict(), f)


def claiming(directory, embed_rows: int) -> str:
    """A checkpoint of the tiny config whose embedding claims ``embed_rows`` rows (sparse)."""
    tiny_config(directory)
    shapes = expected_hf_shapes(TINY)
    shapes["model.embed_tokens.weight"] = (embed_rows, TINY.hidden_size)
    forged_safetensors(os.path.join(directory, "model.safetensors"), shapes)
    return str(directory)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The rollout server process (tiny random model, CPU) -> (url, weights root, process)."""
    root = tmp_path_factory.mktemp("weight_loading")
    model_dir = root / "model"
    save_hf_directory(tiny_model(seed=0), str(model_dir), tokenizer=byte_tokenizer(TINY.vocab_size))
    weights = root / "weights"
    weights.mkdir()
    port = free_port()
    log_file = tempfile.NamedTemporaryFile("w+b", prefix="rollout-server-", suffix=".log",
                                           delete=False)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    process = subprocess.Popen(
        [sys.executable, "-m", "agentrl_jax.rollout.servers.server", "--model", str(model_dir),
         "--weights-dir", str(weights), "--port", str(port), "--max-batch", "2",
         "--max-length", "128", "--prefill-chunks", "16,64", "--prefill-tokens", "64",
         "--decode-steps", "4", "--dtype", "float32"],
        stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    proc = ServerProcess("rollout", "127.0.0.1", port, process, log_file)
    try:
        proc.wait_healthy(600)
        yield proc.url, weights, proc
    finally:
        if proc.alive():  # SIGTERM is honoured (no loader thread holds the exit)
            proc._signal_group(signal.SIGTERM)
            try:
                code = process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                code = None
            proc.stop()
            assert code is not None, "the server ignored SIGTERM:\n" + proc.log_tail()
        proc.stop()


async def _load(url: str, path: str) -> tuple[int, dict, int]:
    """POST /update_weights_from_disk for ``path`` while polling /health -> (status, body,
    health answers 200 seen while the load was pending or right after)."""
    async with aiohttp.ClientSession(timeout=REPLY_TIMEOUT) as http:
        async def update():
            async with http.post(url + "/update_weights_from_disk",
                                 json={"model_path": path}) as r:
                return r.status, await r.json(content_type=None)

        task = asyncio.create_task(update())
        healthy = 0
        async with http.get(url + "/health") as r:  # the loop answers while the load runs
            healthy += r.status == 200
        status, body = await task
        async with http.get(url + "/health") as r:
            healthy += r.status == 200
        return status, body, healthy


def _assert_refused(status, body, healthy, *fragments):
    assert status == 400 and body["success"] is False, body
    for fragment in fragments:
        assert fragment in body["message"], body["message"]
    assert healthy == 2


async def test_a_fifo_is_refused_without_freezing_the_server(server):
    url, weights, proc = server
    ckpt = weights / "fifo"
    tiny_config(ckpt)
    fifo = ckpt / "model.safetensors"
    os.mkfifo(fifo)
    try:
        status, body, healthy = await _load(url, str(ckpt))
    finally:  # a reader blocked on the FIFO (the old server) is released by a writer's open
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
    _assert_refused(status, body, healthy, "a FIFO, not a regular file")


async def test_a_config_with_a_billion_layers_is_refused_before_anything_is_built(server):
    url, weights, _ = server
    ckpt = tiny_checkpoint(weights / "layers")
    config = json.loads(open(os.path.join(ckpt, "config.json")).read())
    config["num_hidden_layers"] = 10**9
    with open(os.path.join(ckpt, "config.json"), "w") as f:
        json.dump(config, f)
    status, body, healthy = await _load(url, ckpt)
    _assert_refused(status, body, healthy, "num_layers must be an integer from 1 to 512",
                    "1000000000")


@pytest.mark.parametrize("rows,size", [(4 * TIB // (4 * TINY.hidden_size), "4 TiB"),
                                       (2 * GIB // (4 * TINY.hidden_size), "2 GiB")])
async def test_a_forged_header_is_refused_from_the_header(server, rows, size):
    """A sparse file whose embedding claims ``size``: refused by its header's shape (the data
    region, a hole, is never read; before: 4 TiB panicked in Rust, 2 GiB was read in full)."""
    url, weights, _ = server
    ckpt = claiming(weights / f"forged_{rows}", rows)
    assert os.path.getsize(os.path.join(ckpt, "model.safetensors")) > rows * TINY.hidden_size * 4
    status, body, healthy = await _load(url, ckpt)
    _assert_refused(status, body, healthy, "model.embed_tokens.weight",
                    f"shape ({rows}, {TINY.hidden_size}) in the header, expected (512, 64)")


async def test_a_symlink_out_of_the_checkpoint_is_refused_like_an_index_shard(server, tmp_path):
    url, weights, _ = server
    outside = tiny_checkpoint(tmp_path / "outside")  # a valid file outside --weights-dir
    ckpt = weights / "link"
    ckpt.mkdir()
    shutil.copy(os.path.join(outside, "config.json"), ckpt)
    (ckpt / "model.safetensors").symlink_to(os.path.join(outside, "model.safetensors"))
    status, body, healthy = await _load(url, str(ckpt))
    _assert_refused(status, body, healthy, "'model.safetensors' resolves outside the "
                                           "checkpoint directory")
    os.remove(ckpt / "model.safetensors")  # the same file copied in loads
    shutil.copy(os.path.join(outside, "model.safetensors"), ckpt)
    status, body, healthy = await _load(url, str(ckpt))
    assert status == 200 and body["success"] and healthy == 2, body


# ----------------------------------------------------------------------------- in process
def test_the_refusal_reads_no_tensor_data(tmp_path, monkeypatch):
    """The 2 GiB claim is refused before any tensor is read (``read_tensor`` is never called),
    and so is a config whose parameters cannot fit in the files' bytes (before its model is
    even sized)."""
    import agentrl_jax.models.safetensors_io as io

    def never(*args, **kwargs):
        raise AssertionError("tensor data was read")

    monkeypatch.setattr(io, "read_tensor", never)
    ckpt = claiming(tmp_path / "two_gib", 2 * GIB // (4 * TINY.hidden_size))
    with pytest.raises(CheckpointError, match="in the header, expected"):
        load_safetensors_model(ckpt)
    big = json.loads(open(os.path.join(ckpt, "config.json")).read())
    big.update(num_hidden_layers=512, hidden_size=8192, intermediate_size=32768,
               num_attention_heads=64, num_key_value_heads=8, head_dim=128)
    small = tiny_checkpoint(tmp_path / "small")
    with open(os.path.join(small, "config.json"), "w") as f:
        json.dump(big, f)
    monkeypatch.setattr(io, "expected_hf_shapes", never)
    with pytest.raises(CheckpointError, match="describes .* parameters .* but the safetensors "
                                              "files hold"):
        load_safetensors_model(small)


def _blocking_reader(monkeypatch):
    """Make every tensor read wait until its load is cancelled; returns the list of cancel
    flags the reads saw."""
    import agentrl_jax.models.safetensors_io as io

    seen: list[threading.Event] = []
    original = io.read_tensor

    def read_tensor(fd, entry, cancel=None):
        seen.append(cancel)
        cancel.wait(120)
        return original(fd, entry, cancel)

    monkeypatch.setattr(io, "read_tensor", read_tensor)
    return seen


async def test_a_load_stops_when_its_client_goes_away(tmp_path, monkeypatch):
    seen = _blocking_reader(monkeypatch)
    engine = make_engine(tiny_model(seed=0), warmup=False)
    thread = start_server(engine, weights_dirs=[str(tmp_path)])
    try:
        ckpt = tiny_checkpoint(tmp_path / "slow")
        async with aiohttp.ClientSession() as http:
            post = asyncio.create_task(http.post(thread.url + "/update_weights_from_disk",
                                                 json={"model_path": ckpt}))
            while not seen:  # the load is in progress...
                await asyncio.sleep(0.05)
            async with http.get(thread.url + "/health") as r:  # ...and the loop answers
                assert r.status == 200
            post.cancel()  # the client goes away
            with pytest.raises(asyncio.CancelledError):
                await post
        for _ in range(600):
            if seen[0].is_set() and not thread.server.weight_loads:
                break
            await asyncio.sleep(0.05)
        assert len(seen) == 1 and seen[0].is_set()  # one tensor was started, no more
        assert engine.stats.weight_updates == 0
    finally:
        thread.stop()
        engine.close()


async def test_a_load_in_progress_is_cancelled_when_the_server_stops(tmp_path, monkeypatch):
    seen = _blocking_reader(monkeypatch)
    engine = make_engine(tiny_model(seed=0), warmup=False)
    thread = start_server(engine, weights_dirs=[str(tmp_path)])
    try:
        ckpt = tiny_checkpoint(tmp_path / "slow")
        async with aiohttp.ClientSession(timeout=REPLY_TIMEOUT) as http:
            post = asyncio.create_task(http.post(thread.url + "/update_weights_from_disk",
                                                 json={"model_path": ckpt}))
            while not seen:
                await asyncio.sleep(0.05)
            await asyncio.to_thread(thread.stop)  # runs the app's shutdown
            assert not thread._thread.is_alive()
            assert seen[0].is_set() and len(seen) == 1
            assert engine.stats.weight_updates == 0
            try:
                response = await post
            except aiohttp.ClientError:  # the connection closed with the server
                pass
            else:  # answered before the connection closed
                assert response.status == 503, await response.text()
    finally:
        thread.stop()
        engine.close()


def test_cancel_flag_is_checked_between_tensors(tmp_path, monkeypatch):
    import agentrl_jax.models.safetensors_io as io

    ckpt = tiny_checkpoint(tmp_path / "ckpt")
    cancel = threading.Event()
    reads = []
    original = io.read_tensor

    def read_tensor(fd, entry, flag=None):
        reads.append(entry.name)
        cancel.set()  # cancelled while the first tensor is read
        return original(fd, entry, flag)

    monkeypatch.setattr(io, "read_tensor", read_tensor)
    with pytest.raises(LoadCancelled):
        load_safetensors_model(ckpt, cancel=cancel)
    assert len(reads) == 1
