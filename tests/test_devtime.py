"""The profiler-trace parser behind the GPU device-time numbers (hand-built traces)."""

from benchmarks.speed.devtime import kernel_category, kernel_events, summarize


def _trace(kernels, host=()):
    """Chrome-trace events: a GPU process with one stream + an 'XLA Ops' summary line and a
    host process."""
    ev = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "pid": 1, "tid": 7, "name": "thread_name", "args": {"name": "Stream #7(Compute)"}},
        {"ph": "M", "pid": 1, "tid": 9, "name": "thread_name", "args": {"name": "XLA Ops"}},
        {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "M", "pid": 2, "tid": 1, "name": "thread_name", "args": {"name": "python3"}},
    ]
    for name, ts, dur in kernels:
        ev.append({"ph": "X", "pid": 1, "tid": 7, "name": name, "ts": ts, "dur": dur})
        ev.append({"ph": "X", "pid": 1, "tid": 9, "name": name, "ts": ts, "dur": dur})  # summary copy
    for name, ts, dur in host:
        ev.append({"ph": "X", "pid": 2, "tid": 1, "name": name, "ts": ts, "dur": dur})
    return ev


def test_union_busy_time_spans_and_top_kernels():
    # two calls, 1000 us apart; in call 1 two kernels overlap by 5 us
    kernels = [("gemm_a", 0.0, 10.0), ("fusion_b", 5.0, 10.0), ("fusion_b", 20.0, 4.0),
               ("gemm_a", 1000.0, 10.0), ("fusion_b", 1012.0, 4.0)]
    stats = summarize(_trace(kernels, host=[("PjitFunction", 0.0, 5000.0)]), calls=2)
    # call 1: union [0, 15] + [20, 24] = 19 us; call 2: 10 + 4 = 14 us -> 16.5 us per call
    assert abs(stats["busy_ms"] - 16.5e-3) < 1e-12
    # spans: call 1 0..24 us, call 2 1000..1016 us -> median 20 us
    assert abs(stats["span_ms"] - 20e-3) < 1e-12
    assert stats["kernels_per_call"] == 2.5  # the 'XLA Ops' copies and host events not counted
    top = {k["name"]: (k["ms"], k["launches"]) for k in stats["kernels"]}
    assert top["gemm_a"] == (10e-3, 1.0) and abs(top["fusion_b"][0] - 9e-3) < 1e-12
    assert abs(stats["categories_ms"]["matmul"] - 10e-3) < 1e-12


def test_no_device_events_gives_none():
    assert summarize(_trace([], host=[("x", 0.0, 1.0)]), calls=1) is None
    assert kernel_events(_trace([], host=[("x", 0.0, 1.0)])) == []


def test_kernel_categories():
    assert kernel_category("ncclDevKernel_AllGather_RING_LL") == "collective"
    assert kernel_category("cudnn_generated_fort_native_sdpa_sm90_flash_fprop") == "attention"
    assert kernel_category("nvjet_sm90_tst_192x192_64x3_1x2_h_bz_coopB_NTN") == "matmul"  # cuBLAS
    assert kernel_category("sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n") == "matmul"
    assert kernel_category("loop_add_fusion_61") == "other"


def test_program_times_split_kernels_by_the_program_they_ran_in():
    from benchmarks.speed.devtime import program_times
    kernels = [("gemm", 0.0, 10.0), ("attn", 5.0, 10.0), ("fusion", 30.0, 5.0),  # prefill 1
               ("gemm", 100.0, 4.0), ("fusion", 110.0, 2.0),                        # decode
               ("gemm", 200.0, 6.0)]                                                 # prefill 2
    ev = _trace(kernels)
    ev.append({"ph": "M", "pid": 1, "tid": 11, "name": "thread_name",
               "args": {"name": "XLA Modules"}})
    for name, ts, dur in (("jit_prefill(3)", 0.0, 35.0), ("jit_decode(4)", 100.0, 12.0),
                          ("jit_prefill(3)", 200.0, 6.0)):
        ev.append({"ph": "X", "pid": 1, "tid": 11, "name": name, "ts": ts, "dur": dur})
    out = program_times(ev)
    assert set(out) == {"jit_prefill", "jit_decode"}
    assert out["jit_prefill"]["calls"] == 2 and out["jit_decode"]["calls"] == 1
    assert (out["jit_prefill"]["kernels"], out["jit_decode"]["kernels"]) == (4, 2)
    # spans 35 + 6 us; busy: union [0, 15] + [30, 35] = 20 us, + 6 us
    assert abs(out["jit_prefill"]["span_s"] - 41e-6) < 1e-15
    assert abs(out["jit_prefill"]["busy_s"] - 26e-6) < 1e-15
    assert abs(out["jit_decode"]["busy_s"] - 6e-6) < 1e-15 and out["jit_decode"]["span_s"] == 12e-6


def test_program_times_without_module_lines_is_empty():
    from benchmarks.speed.devtime import program_times
    assert program_times(_trace([("gemm", 0.0, 1.0)])) == {}


def test_program_times_falls_back_to_the_kernels_hlo_module_argument():
    """A GPU trace without ``XLA Modules`` lines: kernels grouped by their ``hlo_module``
    argument (run id stripped), busy = union of their intervals, no calls or spans; the
    device layout lists the device's lines with their event counts."""
    from benchmarks.speed.devtime import device_layout, program_times
    ev = _trace([])
    for name, module, ts, dur in (("gemm", "jit_prefill(3)", 0.0, 10.0),
                                  ("attn", "jit_prefill(3)", 5.0, 10.0),
                                  ("gemm", "jit_decode(4)", 100.0, 4.0),
                                  ("gemm", "jit_prefill(3)", 200.0, 6.0)):
        ev.append({"ph": "X", "pid": 1, "tid": 7, "name": name, "ts": ts, "dur": dur,
                   "args": {"hlo_module": module, "hlo_op": "fusion.1"}})
    out = program_times(ev)
    assert out == {"jit_prefill": {"calls": None, "span_s": None, "kernels": 3,
                                   "busy_s": out["jit_prefill"]["busy_s"]},
                   "jit_decode": {"calls": None, "span_s": None, "kernels": 1,
                                  "busy_s": out["jit_decode"]["busy_s"]}}
    assert abs(out["jit_prefill"]["busy_s"] - 21e-6) < 1e-15  # [0, 15] + [200, 206]
    assert abs(out["jit_decode"]["busy_s"] - 4e-6) < 1e-15
    assert device_layout(ev) == {"/device:GPU:0": {"Stream #7(Compute)": 4}}
