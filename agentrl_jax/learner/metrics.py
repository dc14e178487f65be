"""Training metrics: a synchronous TensorBoard / JSON-lines writer, FLOP counting and MFU.

MFU (model FLOPs utilisation) counts the FLOPs the model *needs*, not what remat recomputes:

    flops_per_token = 6 * N_matmul + 6 * L * H * Dh * T_ctx       (forward + backward)

* ``N_matmul``: parameters that take part in a matmul per token: every layer weight plus the
  LM head (``V * D``; for tied embeddings the embedding matrix is the head), but not the input
  embedding lookup (a gather). 2 FLOPs per multiply-add x (1 forward + 2 backward).
* attention: ``QK^T`` and ``PV`` are ``2 * 2 * T * H * Dh`` FLOPs per token and layer for full
  attention; a causal mask halves the useful work, so ``T_ctx = T / 2`` on average and the
  forward is ``2 * T * H * Dh``; x3 for forward + backward gives ``6 * T * H * Dh``. (PaLM's
  appendix uses the non-causal ``12 * L * H * Dh * T``; ``causal=False`` gives that.)

Peak dense bf16 FLOP/s per device come from the vendors' data sheets (no sparsity).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Mapping

import numpy as np

from agentrl_jax.models.config import ModelConfig

#: (substring of ``jax.Device.device_kind`` lower-cased, peak dense bf16 FLOP/s). First match wins.
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("h200", 989e12),
    ("gh200", 989e12),
    ("h100 pcie", 756e12),
    ("h100", 989e12),  # SXM / HBM3
    ("h800", 989e12),
    ("a100", 312e12),
    ("l40s", 362e12),
    ("b200", 2250e12),
    ("tpu v6", 918e12),  # v6e / Trillium ("TPU v6 lite")
    ("tpu v5p", 459e12),
    ("tpu v5 lite", 197e12),  # v5e
    ("tpu v5e", 197e12),
    ("tpu v5", 459e12),
    ("tpu v4", 275e12),
)


def peak_flops_per_device(device_kind: str | None = None) -> float | None:
    """Peak dense bf16 FLOP/s of one device, or ``None`` when unknown (CPU, unlisted chips)."""
    if device_kind is None:
        import jax
        device_kind = jax.devices()[0].device_kind
    kind = device_kind.lower()
    for key, peak in PEAK_BF16_FLOPS:
        if key in kind:
            return peak
    return None


def matmul_params(cfg: ModelConfig) -> int:
    """Parameters used in a matmul per token (all but the input-embedding gather; + LM head)."""
    # num_parameters = layers + embedding + final norm (+ untied head). The embedding gather is
    # not a matmul but the head is: for tied weights the embedding *is* the head (count once);
    # untied, drop one of the two equal-sized V x D matrices.
    embed = cfg.vocab_size * cfg.hidden_size
    return cfg.num_parameters - (0 if cfg.tie_word_embeddings else embed)


def train_flops_per_token(cfg: ModelConfig, seq_len: int, causal: bool = True) -> float:
    """FLOPs of one forward + backward per trained token at sequence length ``seq_len``."""
    attn = 6 * cfg.num_layers * cfg.num_heads * cfg.head_dim * seq_len
    if not causal:
        attn *= 2
    return 6.0 * matmul_params(cfg) + attn


def forward_flops_per_token(cfg: ModelConfig, seq_len: int, causal: bool = True) -> float:
    return train_flops_per_token(cfg, seq_len, causal) / 3.0


def mfu(flops: float, seconds: float, num_devices: int,
        peak_per_device: float | None) -> float | None:
    """``flops / (seconds * num_devices * peak)``; ``None`` when the peak is unknown."""
    if not peak_per_device or seconds <= 0:
        return None
    return flops / (seconds * num_devices * peak_per_device)


class Throughput:
    """tokens/s and MFU of timed steps; ``tokens`` counts every position of the padded batch
    (the compute actually done), ``real_tokens`` only attention-mask positions."""

    def __init__(self, cfg: ModelConfig, num_devices: int, peak_per_device: float | None = None,
                 device_kind: str | None = None):
        self.cfg = cfg
        self.num_devices = num_devices
        self.peak = peak_per_device if peak_per_device is not None else peak_flops_per_device(
            device_kind)

    def __call__(self, *, tokens: int, seq_len: int, seconds: float,
                 passes: float = 1.0, real_tokens: int | None = None) -> dict[str, float]:
        """``passes``: forward+backward equivalents per token (e.g. epochs)."""
        flops = train_flops_per_token(self.cfg, seq_len) * tokens * passes
        out = {"perf/tokens_per_s": tokens * passes / max(seconds, 1e-12),
               "perf/step_time_s": seconds,
               "perf/tflops_per_s_per_device": flops / max(seconds, 1e-12) / self.num_devices / 1e12}
        if real_tokens is not None:
            out["perf/real_tokens_per_s"] = real_tokens * passes / max(seconds, 1e-12)
        u = mfu(flops, seconds, self.num_devices, self.peak)
        if u is not None:
            out["perf/mfu"] = u
        return out


class EventFileWriter:
    """A TensorBoard event file written synchronously, in the caller's thread.

    tensorboardX's ``SummaryWriter`` hands every event to a writer thread through a bounded
    queue; when a write fails (a full disk) that thread dies and the next ``put`` on the full
    queue blocks its caller forever. Here each :meth:`write` appends one ``Event`` (all the
    step's scalars in one ``Summary``, built with tensorboardX's ``scalar``) to an unbuffered
    file, so a refused write raises ``OSError`` (naming the file) where it happened and
    nothing is left in a buffer to fail again at close. Records use the TFRecord framing that
    TensorBoard reads: ``len (u64) | masked crc32c(len) (u32) | event | masked crc32c(event)``
    (tensorboardX's ``masked_crc32c``); the file is ``events.out.tfevents.<time>.<host>``.
    ``purge_step``: the ``SessionLog.START`` event at that step that makes TensorBoard hide the
    events this logdir holds at steps >= it (as ``SummaryWriter(purge_step=...)``).
    """

    def __init__(self, logdir: str, purge_step: int | None = None):
        import socket

        from tensorboardX.proto.event_pb2 import Event, SessionLog

        os.makedirs(logdir, exist_ok=True)
        self.path = os.path.join(logdir, f"events.out.tfevents.{int(time.time())}."
                                         f"{socket.gethostname()}")
        self._file = self._guard(lambda: open(self.path, "ab", buffering=0))
        self._append(Event(wall_time=time.time(), file_version="brain.Event:2"))
        if purge_step is not None:
            self._append(Event(step=purge_step, file_version="brain.Event:2"))
            self._append(Event(step=purge_step, session_log=SessionLog(status=SessionLog.START)))

    def _guard(self, write):
        try:
            return write()
        except OSError as error:  # a failed write of an open file names no file
            if error.filename:
                raise
            raise type(error)(error.errno, error.strerror or str(error), self.path) from error

    def _append(self, event: Any) -> None:
        import struct

        from tensorboardX.record_writer import masked_crc32c

        data = event.SerializeToString()
        header = struct.pack("Q", len(data))
        record = memoryview(header + struct.pack("I", masked_crc32c(header)) + data
                            + struct.pack("I", masked_crc32c(data)))

        def write() -> None:
            done = 0
            while done < len(record):  # a raw file may take part of it
                done += self._file.write(record[done:])

        self._guard(write)

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        """One event at ``step`` holding ``scalars`` (tag -> value)."""
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.proto.summary_pb2 import Summary
        from tensorboardX.summary import scalar

        # tensorboardX's scalar summaries (its tag clean-up: "eval/avg@4" -> "eval/avg_4")
        summary = Summary(value=[scalar(k, v).value[0] for k, v in scalars.items()])
        self._append(Event(wall_time=time.time(), step=int(step), summary=summary))

    def close(self) -> None:
        self._file.close()


class MetricsWriter:
    """TensorBoard events (:class:`EventFileWriter`) + an optional JSON-lines file; both
    optional.

    ``write(step, metrics)`` logs every finite scalar; non-scalars are skipped. Both files are
    written and flushed in the caller's thread: a failed write (a full disk) raises ``OSError``
    naming the file instead of hanging. ``purge_step`` (a resumed run): TensorBoard discards
    the events this logdir already holds at steps >= it (they are logged again).
    ``flush_secs`` is accepted for compatibility (every write is flushed).
    """

    def __init__(self, logdir: str | None = None, jsonl_path: str | None = None,
                 flush_secs: int = 30, purge_step: int | None = None):
        del flush_secs
        self._writer: EventFileWriter | None = None
        self._jsonl = None
        self._jsonl_path = jsonl_path
        if logdir:
            self._writer = EventFileWriter(logdir, purge_step=purge_step)
        if jsonl_path:
            os.makedirs(os.path.dirname(os.path.abspath(jsonl_path)), exist_ok=True)
            self._jsonl = open(jsonl_path, "a")

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        scalars = {}
        for k, v in metrics.items():
            try:
                f = float(np.asarray(v))
            except (TypeError, ValueError):
                continue
            if np.isfinite(f):
                scalars[k] = f
        if self._writer is not None:
            self._writer.write(step, scalars)
        if self._jsonl is not None:
            try:
                self._jsonl.write(json.dumps({"step": int(step), "time": time.time(), **scalars})
                                  + "\n")
                self._jsonl.flush()
            except OSError as error:
                if error.filename:
                    raise
                raise type(error)(error.errno, error.strerror or str(error),
                                  self._jsonl_path) from error

    def flush(self) -> None:
        """Nothing to do: every write is flushed."""

    def close(self) -> None:
        """Close both files. Never raises for a full disk: every row was flushed by its write
        (a refused one raised there), so nothing is lost here."""
        writer, jsonl = self._writer, self._jsonl
        self._writer = self._jsonl = None
        if writer is not None:
            writer.close()
        if jsonl is not None:
            try:
                jsonl.close()
            except OSError:  # a row refused by its write is still in the buffer: drop it
                pass

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def batch_stats(prefix: str, x: np.ndarray, mask: np.ndarray | None = None) -> dict[str, float]:
    """mean / std / min / max of ``x`` over ``mask`` (host-side NumPy)."""
    x = np.asarray(x, np.float64)
    if mask is not None:
        x = x[np.asarray(mask) != 0]
    if x.size == 0:
        return {}
    return {f"{prefix}/mean": float(x.mean()), f"{prefix}/std": float(x.std()),
            f"{prefix}/min": float(x.min()), f"{prefix}/max": float(x.max())}


__all__ = ["PEAK_BF16_FLOPS", "peak_flops_per_device", "matmul_params", "train_flops_per_token",
           "forward_flops_per_token", "mfu", "Throughput", "EventFileWriter", "MetricsWriter",
           "batch_stats", "reduce_step_metrics", "behaviour_consistency"]


def reduce_step_metrics(step_metrics: list[Mapping[str, Any]]) -> dict[str, float]:
    """One value per metric over the optimiser steps of an update: the max of ``*_max``, the
    min of ``*_min`` and the mean of everything else."""
    out: dict[str, float] = {}
    for name in step_metrics[0]:
        vals = np.array([s[name] for s in step_metrics], np.float64)
        if name.endswith("_max"):
            out[name] = float(vals.max())
        elif name.endswith("_min"):
            out[name] = float(vals.min())
        else:
            out[name] = float(vals.mean())
    return out


def behaviour_consistency(rollout_lp: np.ndarray, learner_lp: np.ndarray,
                          mask: np.ndarray) -> dict[str, float]:
    """How far the sampler's log-probs are from the learner's at the same parameters.

    ``ratio = exp(learner - rollout)`` is the PPO ratio that the first optimiser step would
    compute if the rollout log-probs were used as the old log-probs; it should be 1."""
    sel = np.asarray(mask) != 0
    diff = (np.asarray(learner_lp, np.float64) - np.asarray(rollout_lp, np.float64))[sel]
    if not diff.size:
        return {}
    ratio = np.exp(diff)
    return {"rollout/logprob_abs_diff_mean": float(np.abs(diff).mean()),
            "rollout/logprob_abs_diff_max": float(np.abs(diff).max()),
            "rollout/behaviour_ratio_min": float(ratio.min()),
            "rollout/behaviour_ratio_max": float(ratio.max()),
            "rollout/behaviour_ratio_outside_10pct": float(np.mean(np.abs(ratio - 1.0) > 0.1))}
