"""benchmarks/trace_summary.py reads what bounds a profiled step from a Chrome trace: the GPU's busy time counts
overlapping kernels once, the left-out last step's work is not counted, and a host thread's time is its outermost
ops' (nested ops are inside them, not added to them)."""

from __future__ import annotations

import gzip
import json

from conftest import benchmark_script


def _trace_summary():
    return benchmark_script("trace_summary")


def _event(name, cat, ts, dur, tid=1):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "tid": tid}


def test_busy_time_counts_overlaps_once_and_leaves_out_the_last_step(tmp_path):
    events = [
        _event("ProfilerStep#1", "user_annotation", 0, 100),
        _event("ProfilerStep#2", "user_annotation", 100, 100),
        _event("ProfilerStep#3", "user_annotation", 200, 1000),  # e.g. a checkpoint: left out
        # step 1: two kernels overlapping by 10 us (30 us busy, not 40), a copy after them (10 us)
        _event("gemm", "kernel", 10, 20), _event("softmax", "kernel", 20, 20),
        _event("Memcpy HtoD", "gpu_memcpy", 50, 10),
        _event("gemm", "kernel", 110, 20),  # step 2
        _event("Memcpy DtoH", "gpu_memcpy", 300, 500),  # step 3's
        # the main thread: a region with an op nested in it; the backward's thread
        _event("Torch-Compiled Region", "cpu_op", 0, 60), _event("aten::mm", "cpu_op", 5, 10),
        _event("Torch-Compiled Region", "cpu_op", 100, 60),
        _event("CompiledFunctionBackward", "cpu_op", 60, 30, tid=2),
    ]
    path = tmp_path / "trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events + [{"ph": "M", "name": "process_name"}]}, f)
    module = _trace_summary()
    out = module.summarize(module.load(path), skip_last=1)
    assert out["steps"] == 2 and out["wall_ms_per_step"] == 0.1
    assert out["gpu_busy_ms_per_step"] == 0.03  # (30 + 10 + 20) us over 2 steps
    assert out["gpu_busy_share"] == 0.3
    assert out["gpu_ms_per_step"] == {"kernel": 0.03, "gpu_memcpy": 0.005}
    assert out["kernels_per_step"] == 1.5
    assert out["host_threads"]["1"]["busy_ms_per_step"] == 0.06  # the nested mm is inside its region
    assert out["host_threads"]["2"]["busy_ms_per_step"] == 0.015
    assert list(out["top_kernels_ms_per_step"]) == ["gemm", "softmax"]
    assert module.summarize(module.load(path), skip_last=0)["gpu_ms_per_step"]["gpu_memcpy"] > 0.1


def test_gpu_work_is_read_within_the_steps_gpu_side_spans(tmp_path):
    """The GPU runs behind the host: step 2's kernel starts after the host's last kept step has ended."""
    events = [
        _event("ProfilerStep#1", "user_annotation", 0, 100), _event("ProfilerStep#2", "user_annotation", 100, 100),
        _event("ProfilerStep#3", "user_annotation", 200, 100),
        _event("ProfilerStep#1", "gpu_user_annotation", 50, 150),
        _event("ProfilerStep#2", "gpu_user_annotation", 200, 150),
        _event("ProfilerStep#3", "gpu_user_annotation", 350, 100),
        _event("gemm", "kernel", 60, 100), _event("gemm", "kernel", 210, 100),  # steps 1 and 2
        _event("gemm", "kernel", 360, 50),  # step 3's: left out
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    module = _trace_summary()
    assert module.summarize(module.load(path), skip_last=1)["gpu_busy_ms_per_step"] == 0.1  # (100 + 100) us / 2


def test_top_kernels_keep_two_names_that_share_their_first_100_characters_apart(tmp_path):
    """Inductor's fused kernels are named by their ops: two of the loss's shared 100 characters (5.72 + 2.21 ms
    were once listed as one kernel)."""
    stem = "triton_red_fused_" + "x" * 100
    events = [_event("ProfilerStep#1", "user_annotation", 0, 100),
              _event("ProfilerStep#1", "gpu_user_annotation", 0, 100), _event(stem + "_exp_1", "kernel", 0, 30),
              _event(stem + "_sum_2", "kernel", 30, 20)]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    module = _trace_summary()
    out = module.summarize(module.load(path), skip_last=0)
    assert out["top_kernels_ms_per_step"] == {stem + "_exp_1": 0.03, stem + "_sum_2": 0.02}


def test_kernel_changes_match_a_fused_kernel_across_graphs_by_its_name_without_the_number():
    before = {"triton_red_fused_softmax_7": 8.0, "gemm": 1.0, "triton_poi_fused_exp_2": 2.0}
    after = {"triton_red_fused_softmax_3": 1.5, "gemm": 1.0, "triton_poi_fused_exp_9": 1.0,
             "triton_poi_fused_exp_11": 3.0, "triton_red_fused_lse_0": 0.5}
    changes = _trace_summary().kernel_changes(before, after, top=3)
    assert [c["kernel"] for c in changes] == ["triton_red_fused_softmax", "triton_poi_fused_exp",
                                               "triton_red_fused_lse"]
    assert changes[0] == {"kernel": "triton_red_fused_softmax", "before_ms": 8.0, "after_ms": 1.5, "change_ms": -6.5}
    assert changes[1]["after_ms"] == 4.0 and changes[1]["change_ms"] == 2.0  # two graphs' copies of one kernel
    assert changes[2] == {"kernel": "triton_red_fused_lse", "before_ms": 0.0, "after_ms": 0.5, "change_ms": 0.5}


def test_against_compares_whole_names_and_orders_ties_by_name(tmp_path, monkeypatch, capsys):
    """Two kernels whose names share their first 100 characters stay apart, and --against wires the two traces."""
    stem = "triton_red_fused_" + "x" * 100

    def trace(name: str, kernels: list[tuple[str, int]]):
        events = [_event(f"ProfilerStep#{i}", "user_annotation", 100 * (i - 1), 100) for i in (1, 2)]
        events += [_event(k, "kernel", 10 + 5 * i, dur) for i, (k, dur) in enumerate(kernels)]  # all in step 1
        path = tmp_path / name
        path.write_text(json.dumps({"traceEvents": events}))
        return path
    before = trace("before.json", [(stem + "_a_4", 30), (stem + "_b_1", 20), ("gemm", 10), ("zeta_0", 10)])
    after = trace("after.json", [(stem + "_a_9", 10), (stem + "_b_3", 20), ("gemm", 10), ("alpha_2", 10)])
    module = _trace_summary()
    monkeypatch.setattr("sys.argv", ["trace_summary", str(after), "--against", str(before), "--top", "5"])
    module.main()
    changes = json.loads(capsys.readouterr().out)["kernel_changes_from_against"]
    def shown(name):  # head and tail: the two names differ only past their first 100 characters
        return name[:60] + "..." + name[-37:]
    assert [(c["kernel"], c["change_ms"]) for c in changes] == [
        (shown(stem + "_a"), -0.02), ("alpha", 0.01), ("zeta", -0.01), ("gemm", 0.0), (shown(stem + "_b"), 0.0)]
