"""The engine's per-request bookkeeping: requests, their sampled sequences, counters."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from typing import Any

import numpy as np

from agentrl_jax.rollout.contract import GenerateResult, SamplingParams

# A sequence's states.
WAITING, PREFILL, FORK_WAIT, DECODE, DONE = "waiting", "prefill", "fork_wait", "decode", "done"


class Request:
    """One ``generate`` call: its prompt, sampling parameters and ``n`` sequences."""

    def __init__(self, rid: str, input_ids: np.ndarray | list[int], sampling: SamplingParams,
                 session_id: str | None, future: concurrent.futures.Future, seed: int):
        self.rid = rid
        self.input_ids = input_ids
        self.sampling = sampling
        self.session_id = session_id
        self.future = future
        self.seed = seed
        self.created = time.perf_counter()
        self.aborted = False
        self.seqs: list[Seq] = []
        self.results: list[GenerateResult | None] = [None] * sampling.n
        self._ids: np.ndarray | None = None

    def ids(self) -> np.ndarray:
        """``input_ids`` as int32 ``[L]`` (prefill rows are slices of it): the array
        ``check_input_ids`` made at submission, or a list converted once."""
        if self._ids is None:
            self._ids = np.asarray(self.input_ids, np.int32)
        return self._ids

    def prompt_key(self) -> bytes:
        """The prompt as a dictionary key (requests with the same prompt share its prefill):
        the int32 ids' bytes, hashed in C."""
        return self.ids().tobytes()


class Seq:
    """One sampled sequence of a request: its slot, prefill cursor and outputs."""

    def __init__(self, req: Request, index: int, stop_ids: list[int]):
        self.req = req
        self.index = index
        self.state = WAITING
        self.slot: int | None = None
        self.prompt_len = len(req.input_ids)
        self.cursor = 0  # next prompt position to prefill
        self.kv_len = 0  # positions 0..kv_len-1 of the slot row hold this sequence's KV
        # (while decoding, the engine's per-slot buffers hold the output; filled on finish)
        self.cached_tokens = 0
        self.out_ids: list[int] = []
        self.logprobs: list[float] = []
        self.logprobs_raw: list[float] = []
        self.stop_ids = stop_ids
        self.stop_set = set(stop_ids)
        self.forks: list[Seq] = []
        self.stop_text: str | None = None  # output text when a stop string matched
        self.prompt_key: bytes | None = None  # set while others may share its prefill


@dataclasses.dataclass
class EngineStats:
    """Cumulative engine counters (``as_dict`` adds per-step means)."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens actually prefilled (incl. the decode-fed last one)
    generated_tokens: int = 0
    prefill_calls: int = 0
    # a call's window, from its dispatch to its results on the host (host work queued inside it
    # included: deliveries, finishing prefills); of it, the dispatch (until the jitted call
    # returned: argument flattening, transfers, launch) and the time blocked on the device
    prefill_time_s: float = 0.0
    prefill_dispatch_time_s: float = 0.0
    prefill_wait_time_s: float = 0.0
    # the engine thread's CPU time from the window's start to the wait (its host work in the
    # window; the rest of that stretch it was runnable but not running: the GIL)
    prefill_host_cpu_time_s: float = 0.0
    # the prefill calls' shapes, where their padding is: positions computed (rows x chunk per
    # call), rows of the call shape, rows that held a sequence, those rows' positions, the
    # prompt tokens placed in them, and the KV positions each call attended over (summed)
    prefill_positions: int = 0
    prefill_rows: int = 0
    prefill_rows_used: int = 0
    prefill_used_positions: int = 0
    prefill_row_tokens: int = 0
    prefill_kv_sum: int = 0
    decode_calls: int = 0
    decode_steps: int = 0
    decode_time_s: float = 0.0  # the calls' windows, as prefill_time_s
    decode_dispatch_time_s: float = 0.0  # of them until the jitted call returned
    decode_wait_time_s: float = 0.0  # of them blocked on the device (``device_get``)
    decode_host_cpu_time_s: float = 0.0  # as prefill_host_cpu_time_s
    decode_slot_steps: int = 0  # sum over steps of active slots
    # the scheduler thread's wall time: in scheduling steps (prefill / decode calls included)
    # and idle, waiting for a request or a command (paused time included)
    step_time_s: float = 0.0
    idle_time_s: float = 0.0
    copy_calls: int = 0
    shared_prompts: int = 0  # requests that copied an equal prompt's prefill (share_prompts)
    aborted: int = 0
    weight_updates: int = 0
    kv_releases: int = 0  # release_kv_cache calls that freed the cache
    kv_allocations: int = 0  # re-allocations of a released cache (by the next request)

    @staticmethod
    def clocks() -> tuple[float, float]:
        """``(time.perf_counter(), time.thread_time())``: where a call's window starts, and
        where its wait for the device starts."""
        return time.perf_counter(), time.thread_time()

    def prefill_window(self, start: tuple[float, float], dispatched: float,
                       wait_start: tuple[float, float]) -> None:
        """A prefill call's results are on the host now: its window began at ``start``
        (:meth:`clocks` before the dispatch), the jitted call returned at ``dispatched``
        (``perf_counter``), the wait for the device began at ``wait_start`` (:meth:`clocks`)."""
        now = time.perf_counter()
        self.prefill_time_s += now - start[0]
        self.prefill_dispatch_time_s += dispatched - start[0]
        self.prefill_wait_time_s += now - wait_start[0]
        self.prefill_host_cpu_time_s += wait_start[1] - start[1]

    def decode_window(self, start: tuple[float, float], dispatched: float,
                      wait_start: tuple[float, float]) -> None:
        """As :meth:`prefill_window`, for a decode call."""
        now = time.perf_counter()
        self.decode_time_s += now - start[0]
        self.decode_dispatch_time_s += dispatched - start[0]
        self.decode_wait_time_s += now - wait_start[0]
        self.decode_host_cpu_time_s += wait_start[1] - start[1]

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["mean_decode_step_ms"] = (1e3 * self.decode_time_s / self.decode_steps
                                    if self.decode_steps else None)
        d["mean_active_slots"] = (self.decode_slot_steps / self.decode_steps
                                  if self.decode_steps else None)
        # real tokens / computed positions = row occupancy x fill of the rows used
        d["prefill_fill"] = (self.prefill_row_tokens / self.prefill_positions
                             if self.prefill_positions else None)
        d["prefill_row_occupancy"] = (self.prefill_rows_used / self.prefill_rows
                                      if self.prefill_rows else None)
        d["prefill_used_row_fill"] = (self.prefill_row_tokens / self.prefill_used_positions
                                      if self.prefill_used_positions else None)
        d["mean_prefill_kv"] = (self.prefill_kv_sum / self.prefill_calls
                                if self.prefill_calls else None)
        return d



def merge_stats(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """The counters of several engines (replicas) summed; means recomputed."""
    total = EngineStats()
    for s in stats:
        for f in dataclasses.fields(EngineStats):
            setattr(total, f.name, getattr(total, f.name) + s.get(f.name, 0))
    return total.as_dict()


__all__ = ["Request", "Seq", "EngineStats", "merge_stats", "WAITING", "PREFILL", "FORK_WAIT",
           "DECODE", "DONE"]
