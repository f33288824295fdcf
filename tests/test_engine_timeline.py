"""Exact timelines of tiny runs, SimPy style: every expected time is worked out by hand below.

The toy node and model are described in `conftest.py`. Units here: picoseconds (PS), since
the toy GPU does 1 FLOP or 1 HBM byte per picosecond (1e12 /s) and a module's time is
max(FLOPs, HBM bytes) ps. Expected values never come from zerosim's cost functions.

Toy model (Llama, h=64, 2 layers, i=128, 4 heads, vocab 256) at 8 tokens, fp16 (2 B):

  module           FLOPs                     HBM bytes                          time (ps)
  embed_tokens     0                         2*64*8 = 1024                      1024
  RMSNorm (h=64)   5*64*8 = 2560             2*2*64*8 = 2048                    2560
  q/k/v/o (64x64)  2*64*64*8 = 65536         2*(4096 + 8*(64+64)) = 10240       65536
  attn core        4*8*8*64 = 16384          2*8*(2*64+2*64) + 12*(4*8*8)=7168  16384
  gate/up/down     2*64*128*8 = 131072       2*(8192 + 8*(64+128)) = 19456      131072
  act_fn (SwiGLU)  5*128*8 = 5120            3*2*128*8 = 6144                   6144
  lm_head (64x256) 2*64*256*8 = 262144       2*(16384 + 8*(64+256)) = 37888     262144
  loss (v=256)     5*256*8 = 10240           (2+4+4)*256*8 = 20480              20480

Backward = 2 x forward, and after q_proj's, k_proj's and gate_proj's backward the sum of their
input gradient into the later projections' (autograd's InputBuffer: read 2, write 1 element of
8 x 64 at 2 B = 3072 B, 3072 ps). Parameters (numel): embed 256*64 = 16384, each norm 64, q/k/v/o
64*64 = 4096, gate/up/down 64*128 = 8192, lm_head 16384; total 16384 + 2*41088 + 64 + 16384
= 115008 (41088 per layer = 2*64 + 4*4096 + 3*8192).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import q, toy_stack

from zerosim.errors import ScenarioError
from zerosim.hardware.profile import load_profile
from zerosim.stacks import load_stack
from zerosim.vocabulary import PathGap

PS = 1e-12

LAYER = [
    ("input_layernorm", 2560),
    ("self_attn.q_proj", 65536),
    ("self_attn.k_proj", 65536),
    ("self_attn.v_proj", 65536),
    ("attn.core", 16384),
    ("self_attn.o_proj", 65536),
    ("post_attention_layernorm", 2560),
    ("mlp.gate_proj", 131072),
    ("mlp.up_proj", 131072),
    ("mlp.act_fn", 6144),
    ("mlp.down_proj", 131072),
]
FORWARD_PS = (
    [("embed_tokens", 1024)]
    + [(f"layers.{layer}.{name}", ps) for layer in (0, 1) for name, ps in LAYER]
    + [("norm", 2560), ("lm_head", 262144), ("loss", 20480)]
)
FORWARD_TOTAL_PS = 1024 + 2 * 683008 + 2560 + 262144 + 20480  # layer: 683008 ps
assert sum(ps for _, ps in FORWARD_PS) == FORWARD_TOTAL_PS == 1652224
GRADIENT_SUM_PS = 3 * 2 * 64 * 8  # 3072: read 2, write 1 16-bit element of 8 tokens x 64
SUMS_INPUT_GRADIENT = ("self_attn.q_proj", "self_attn.k_proj", "mlp.gate_proj")
BACKWARD_PS = [(name, 2 * ps + (GRADIENT_SUM_PS if name.endswith(SUMS_INPUT_GRADIENT) else 0))
               for name, ps in reversed(FORWARD_PS)]
BACKWARD_TOTAL_PS = 2 * FORWARD_TOTAL_PS + 6 * GRADIENT_SUM_PS  # two layers of three sums
assert sum(ps for _, ps in BACKWARD_PS) == BACKWARD_TOTAL_PS == 3322880

LAYER_PARAMS = {
    "input_layernorm": 64, "self_attn.q_proj": 4096, "self_attn.k_proj": 4096,
    "self_attn.v_proj": 4096, "self_attn.o_proj": 4096, "post_attention_layernorm": 64,
    "mlp.gate_proj": 8192, "mlp.up_proj": 8192, "mlp.down_proj": 8192,
}
PARAMS = {"embed_tokens": 16384, "norm": 64, "lm_head": 16384} | {
    f"layers.{layer}.{name}": n for layer in (0, 1) for name, n in LAYER_PARAMS.items()}
TOTAL_PARAMS = 115008
assert sum(PARAMS.values()) == TOTAL_PARAMS
# Gradients arrive in backward order: the modules that own params, last module first.
GRAD_ORDER = [name for name, _ in reversed(FORWARD_PS) if name in PARAMS]

# Per-parameter costs (n = numel = partition numel at DP=1), in ps:
D2H_PINNED_PS = 200  # 2n B at 10 GB/s = 2n/1e10 s = 200n ps (same for H2D)
GRAD_NORM_PS = 18  # the fp64 norm: read 2n B, write 8n B and read them back, at 1e12 B/s
ZERO_PAGES_PS = 2000  # 2n B of fresh pages at 1 GB/s (one faulting thread)
D2H_PAGEABLE_PS = 400  # 2n B at 5 GB/s
CPU_CAST_PS = 6000  # 6n B (read 2, write 4) at 1 GB/s: every toy tensor is below PyTorch's grain
# size (32,768 elements), so the cast runs in the calling thread alone (no parallel region)
GPU_CAST_FP32_PS = 6  # 1.5 passes over 4n B at 1e12 B/s
D2H_FP32_PINNED_PS = 400  # 4n B at 10 GB/s


def _ops(spans: pd.DataFrame, stream: str, phase: str | None = None,
         micro: int | None = None) -> pd.DataFrame:
    chosen = spans[spans.stream == stream]
    if phase is not None:
        chosen = chosen[chosen.phase == phase]
    if micro is not None:
        chosen = chosen[chosen.micro_batch == micro]
    return chosen.sort_values(["start_s", "end_s"], kind="stable").reset_index(drop=True)


def _assert_timeline(spans: pd.DataFrame, expected: list[tuple[str, int, int]]) -> None:
    """`expected`: (op, start_ps, end_ps) in order; spans must match one to one."""
    assert list(spans.op) == [op for op, _, _ in expected]
    assert list(spans.start_s) == pytest.approx([s * PS for _, s, _ in expected], rel=1e-9)
    assert list(spans.end_s) == pytest.approx([e * PS for _, _, e in expected], rel=1e-9)


def _compute_timeline(prefix: str, costs: list[tuple[str, int]], start: int
                      ) -> list[tuple[str, int, int]]:
    """Back-to-back ops on one stream from `start`."""
    timeline, t = [], start
    for name, ps in costs:
        timeline.append((f"{prefix} {name}", t, t + ps))
        t += ps
    return timeline


# ---------------------------------------------------------------------------- DP=1, GA=1


@pytest.fixture(scope="module")
def dp1_ga1(toy):
    """DP=1, GA=1, 0.13.3, pinned buffers, one IPG bucket, sub_group_size 50000."""
    return toy.run()


def _backward_and_bucket_copies(start_ps: int
                                ) -> tuple[list[tuple[str, int, int]], list[tuple[str, int, int]]]:
    """The backward's compute ops from `start_ps`, and each gradient's copy into the IPG bucket
    (2 passes over 2n B = 4n ps) on the reduce stream as its module's backward ends. The copy
    takes the SMs from the next module's backward, which starts with it and so ends 4n ps
    later (`SharedSMs`); the copies never queue, as each ends before the next module does."""
    compute, copies, t, held = [], [], start_ps, 0
    for name, ps in BACKWARD_PS:
        compute.append((f"backward {name}", t, t + held + ps))
        t += held + ps
        held = 4 * PARAMS.get(name, 0)
        if name in PARAMS:
            copies.append((name, t, t + held))
    return compute, copies


COPIED_PS = 4 * (TOTAL_PARAMS - PARAMS["embed_tokens"])
"""What the bucket copies hold the backward back: every gradient's but the last's (embed_tokens',
which no backward follows): 4 x 98624 = 394496 ps."""


def test_forward_runs_back_to_back_and_each_bucket_copy_holds_back_the_next_backward(dp1_ga1):
    spans = dp1_ga1.spans
    forward = _compute_timeline("forward", FORWARD_PS, 0)
    _assert_timeline(_ops(spans, "compute", "forward"), forward)
    # DP=1 gathers nothing and the host never waits during backward (pinned, one bucket
    # reduced in the epilogue): backward is the modules reversed at 2x with the input-gradient
    # sums, from 1652224 ps, each after a module with parameters held back by its copy.
    backward, copies = _backward_and_bucket_copies(FORWARD_TOTAL_PS)
    _assert_timeline(_ops(spans, "compute", "backward"), backward)
    assert backward[-1][2] == FORWARD_TOTAL_PS + BACKWARD_TOTAL_PS + COPIED_PS == 5369600
    # e.g. lm_head's gradient (65536 ps) is copied from 2217472 ps, as norm's backward starts:
    # norm (5120 ps) ends at 2288128 ps; then norm's (256 ps) holds back down_proj (262144 ps).
    assert copies[0] == ("lm_head", 2217472, 2283008)
    assert backward[2] == ("backward norm", 2217472, 2288128)
    assert backward[3] == ("backward layers.1.mlp.down_proj", 2288128, 2550528)
    bucket = _ops(spans, "reduce", "backward")
    bucket = bucket[bucket.op_kind == "grad_to_bucket"]
    _assert_timeline(bucket, [(f"copy grad {name}", s, e) for name, s, e in copies])
    phases = dp1_ga1.phases.set_index("phase")
    assert phases.loc["forward", "end_s"] == pytest.approx(FORWARD_TOTAL_PS * PS, rel=1e-9)
    # The summary reports the holds: none in the forward, the copies' in the backward.
    held = dp1_ga1.summary["compute_held_s"]
    assert held["backward_non_boundary"] is None  # GA=1: every backward is the boundary's
    assert [held["forward"], held["backward_boundary"], held["update"]] == pytest.approx(
        [0.0, COPIED_PS * PS, 0.0], rel=1e-9)
    assert phases.loc["backward", "compute_held_s"] == pytest.approx(COPIED_PS * PS, rel=1e-9)


def test_boundary_flush_of_0_13_3_param_by_param(dp1_ga1):
    spans = dp1_ga1.spans
    copies_end = _backward_and_bucket_copies(FORWARD_TOTAL_PS)[1][-1][2]
    # embed_tokens is the last grad: ready at 5369600 ps, copied by 5435136 ps.
    assert copies_end == 5369600 + 4 * 16384 == 5435136
    # DP=1 reduce-scatter: `reduce_scatter_coalesced` concatenates the gradients into its flat
    # buffer and pre-divides it, each 2 passes over 2 x 115008 B; the one-rank collective then
    # moves nothing.
    t = copies_end + 2 * 2 * 2 * TOTAL_PARAMS
    d2h, h2d, cpu = [], [], []
    for name in GRAD_ORDER:
        n = PARAMS[name]
        d2h.append((f"grad → accum {name} (pinned)", t, t + D2H_PINNED_PS * n))
        t += D2H_PINNED_PS * n
        h2d.append((f"accum → GPU {name} (pinned)", t, t + D2H_PINNED_PS * n))
        t += D2H_PINNED_PS * n + GRAD_NORM_PS * n
        cpu.append((f"zero pages {name}", t, t + ZERO_PAGES_PS * n))
        t += ZERO_PAGES_PS * n
        d2h.append((f"fp32 flush {name} (pageable)", t, t + D2H_PAGEABLE_PS * n))
        t += D2H_PAGEABLE_PS * n
        cpu.append((f"cast fp16→fp32 {name}", t, t + CPU_CAST_PS * n))
        t += CPU_CAST_PS * n
    backward = _ops(spans, "pcie.d2h", "backward")
    _assert_timeline(backward, d2h)
    _assert_timeline(_ops(spans, "pcie.h2d", "backward"), h2d)
    _assert_timeline(_ops(spans, "cpu", "backward"), cpu)
    # Bytes: every move of the 16-bit partition is 2 B/element, the flush included.
    assert list(backward.bytes) == [2 * PARAMS[name] for name in GRAD_ORDER for _ in (0, 1)]
    phases = dp1_ga1.phases.set_index("phase")
    assert phases.loc["backward", "end_s"] == pytest.approx(t * PS, rel=1e-9)
    # Per parameter: 5818 ps x n on top of the copies and the local reduce-scatter.
    per_param = (2 * D2H_PINNED_PS + GRAD_NORM_PS + ZERO_PAGES_PS + D2H_PAGEABLE_PS
                 + CPU_CAST_PS)
    assert t == copies_end + 920064 + per_param * TOTAL_PARAMS


def test_the_critical_path_is_the_compute_then_the_flush_param_by_param(dp1_ga1):
    """What each phase waited on (`Result.critical_path`): the forward and backward kernels
    back to back, then the last bucket copy, the local reduce-scatter and, per parameter, the
    chain of the boundary flush above, the fp64 norm (GRAD_NORM_PS) inside the reduce stream's
    `partition grads` op that runs the chain; no host stretch anywhere (the toy's host costs
    nothing)."""
    path = dp1_ga1.critical_path
    forward = path[path.phase == "forward"]
    _assert_timeline(forward, _compute_timeline("forward", FORWARD_PS, 0))
    assert set(forward.stream) == {"compute"}
    compute, copies = _backward_and_bucket_copies(FORWARD_TOTAL_PS)
    t = copies[-1][2] + 2 * 2 * 2 * TOTAL_PARAMS
    expected = [*compute, (f"copy grad {copies[-1][0]}", *copies[-1][1:]),
                ("reduce-scatter 0M", copies[-1][2], t)]
    streams = ["compute"] * len(compute) + ["reduce", "reduce"]
    for name in GRAD_ORDER:
        n = PARAMS[name]
        for op, stream, ps in ((f"grad → accum {name} (pinned)", "pcie.d2h", D2H_PINNED_PS),
                               (f"accum → GPU {name} (pinned)", "pcie.h2d", D2H_PINNED_PS),
                               ("partition grads 21 params", "reduce", GRAD_NORM_PS),
                               (f"zero pages {name}", "cpu", ZERO_PAGES_PS),
                               (f"fp32 flush {name} (pageable)", "pcie.d2h", D2H_PAGEABLE_PS),
                               (f"cast fp16→fp32 {name}", "cpu", CPU_CAST_PS)):
            expected.append((op, t, t + ps * n))
            streams.append(stream)
            t += ps * n
    backward = path[path.phase == "backward"]
    _assert_timeline(backward, expected)
    assert list(backward.stream) == streams
    assert PathGap.HOST not in set(path.stream)


REUSE_BYTES = 12_000
"""A heap-reuse size between the toy's largest 16-bit partition of a projection or norm
(q/k/v/o: 2 x 4096 = 8192 B) and the smallest larger one (gate/up/down: 16384 B)."""


def _run_with_heap_reuse(toy, nbytes: int):
    """The toy run with its stack's allocator reusing heap pages below `nbytes`."""
    stack = toy_stack() | {"allocator": {"heap_reuse_MiB": {
        "value": nbytes / 2**20, "basis": "spec", "source": "toy"}}}
    return toy.run({"runtime": {"framework": stack}})


def test_temporaries_below_the_heap_reuse_size_skip_the_page_zeroing(toy, dp1_ga1):
    """The same flush as above with the stack's allocator reusing heap pages for temporaries
    below 12,000 B: the norms' and q/k/v/o's 16-bit temporaries (128 and 8192 B) no longer
    fault fresh pages; gate/up/down, embed and lm_head's (16384 and 32768 B) still do. Each
    skipped zeroing takes 2000n ps out of the flush, in order, and out of the backward."""
    reused = _run_with_heap_reuse(toy, REUSE_BYTES)
    zeroed = [n for n in GRAD_ORDER if 2 * PARAMS[n] > REUSE_BYTES]
    assert {PARAMS[n] for n in zeroed} == {8192, 16384}
    cpu = _ops(reused.spans, "cpu", "backward")
    assert [op for op in cpu.op if op.startswith("zero pages")] == [
        f"zero pages {n}" for n in zeroed]
    skipped = sum(ZERO_PAGES_PS * PARAMS[n] for n in GRAD_ORDER if n not in zeroed)
    assert skipped == 2000 * (5 * 64 + 8 * 4096)  # five norms, eight q/k/v/o
    before = dp1_ga1.phases.set_index("phase").loc["backward", "end_s"]
    after = reused.phases.set_index("phase").loc["backward", "end_s"]
    assert (before - after) / PS == pytest.approx(skipped, rel=1e-9)


def test_a_temporary_of_exactly_the_heap_reuse_size_is_mapped_anew(toy, dp1_ga1):
    """glibc maps a request whose size, with its header and alignment, reaches the mmap
    threshold: at a threshold of 8192 B the q/k/v/o temporaries (8192 B) fault fresh pages
    like the larger ones, and only the five norms' (128 B) skip the zeroing."""
    reused = _run_with_heap_reuse(toy, 8192)
    cpu = _ops(reused.spans, "cpu", "backward")
    assert [op for op in cpu.op if op.startswith("zero pages")] == [
        f"zero pages {n}" for n in GRAD_ORDER if PARAMS[n] > 64]
    before = dp1_ga1.phases.set_index("phase").loc["backward", "end_s"]
    after = reused.phases.set_index("phase").loc["backward", "end_s"]
    assert (before - after) / PS == pytest.approx(2000 * 5 * 64, rel=1e-9)


def test_the_shipped_heap_reuse_size_is_what_glibc_does_in_the_hook_thread():
    """benchmarks/node_probe/heap_reuse_probe.py on glibc 2.36: the boundary flush's 16-bit
    temporaries, replayed in the main thread and in a worker (where the backward's hooks
    run), get fresh pages above the stacks' 32 MiB and mostly reused ones below it, from
    the third round on; with a fixed mmap threshold in the environment, all fresh."""
    folder = Path(__file__).parents[1] / "benchmarks" / "node_probe"
    reuse = load_stack("megatron-deepspeed").heap_reuse_bytes
    assert reuse == 32 * 2**20 == load_stack("hf-transformers").heap_reuse_bytes
    measured = json.loads((folder / "heap_reuse_devbox_2026-12-05.json").read_text())
    fixed = json.loads((folder / "heap_reuse_devbox_2026-12-05_fixed_threshold.json")
                       .read_text())
    for pattern in measured["patterns"]:
        for size, fresh in pattern["fresh_by_size"].items():
            nbytes = float(size.removesuffix(" MB")) * 1e6
            assert fresh == 1.0 if nbytes > reuse else fresh <= 0.25, (pattern["pattern"], size)
    assert {fresh for pattern in fixed["patterns"]
            for fresh in pattern["fresh_by_size"].values()} == {1.0}


def test_both_testbeds_zero_fresh_pages_at_the_rate_of_4_kib_faults():
    """benchmarks/node_probe/page_fault_probe.py on a Zen 4 KVM guest: a thread faults and
    zeroes 4 KiB pages at 2.5-3.2 GB/s and 2 MiB huge pages at 16 GB/s or more; the fitted
    `cpu.page_zeroing_GBps` of the study's node (3.00) and of Polaris (5.19) lie in the 4 KiB
    regime (within twice its measured rates), far under the huge pages' (the docs' reading:
    their flush temporaries were faulted page by page)."""
    folder = Path(__file__).parents[1] / "benchmarks" / "node_probe"
    record = json.loads((folder / "page_faults_zen4_2026-12-06.json").read_text())
    runs = [run for session in record["sessions"] for run in session["runs"]]
    small = [r["zeroing_GBps_per_thread"] for r in runs if r["bytes_per_fault"] == 4096]
    huge = [r["zeroing_GBps_per_thread"] for r in runs if r["bytes_per_fault"] == 2 << 20]
    assert len(small) == len(huge) == 4
    assert min(small) >= 2.5 and max(small) <= 3.2 and min(huge) >= 15
    for name in ("h100-jlse", "polaris-a100"):
        fitted = load_profile(name).page_zeroing_Bps / 1e9
        assert min(small) <= fitted <= 2 * max(small) < min(huge) / 2, name


def test_update_phase_sub_group_by_sub_group(dp1_ga1):
    spans, phases = dp1_ga1.spans, dp1_ga1.phases.set_index("phase")
    start = phases.loc["update", "start_s"] / PS
    assert phases.loc["backward", "end_s"] == phases.loc["update", "start_s"]
    # sub_group_size 50000 closes the first group at the first param that reaches it:
    # embed (16384) + layer 0 (41088) = 57472; the rest is layer 1 + norm + lm_head.
    groups = [16384 + 41088, 41088 + 64 + 16384]
    assert groups == [57472, 57536]
    # Overflow check: 115008 elements at 4 threads x 2.5e8 a second: 115008 ns.
    t = start
    cpu = [("overflow check", t, t + 1000 * TOTAL_PARAMS)]
    t += 1000 * TOTAL_PARAMS
    h2d, copy_engine = [], []
    for g, e in enumerate(groups):
        unscale = 2000 * e  # 8 B/element over 4 threads x 1 GB/s
        adam = 2500 * e  # 4 threads x 1e8 params/s
        cast = 1000 * e + 3000 * e  # zero 2e B on 2 threads at 1 GB/s, then 6 B/elem cast
        upload = 400 * e  # 2e B pageable at 5 GB/s
        cpu += [(f"unscale sub-group {g}", t, t + unscale),
                (f"cpu adam sub-group {g}", t + unscale, t + unscale + adam),
                (f"cast fp32→16-bit sub-group {g}", t + unscale + adam,
                 t + unscale + adam + cast)]
        t += unscale + adam + cast
        h2d.append((f"params sub-group {g} (pageable)", t, t + upload))
        copy_engine.append((f"H2D params sub-group {g}", t, t + upload))
        t += upload
    _assert_timeline(_ops(spans, "cpu", "update"), cpu)
    _assert_timeline(_ops(spans, "pcie.h2d", "update"), h2d)
    _assert_timeline(_ops(spans, "compute", "update"), copy_engine)
    assert list(_ops(spans, "pcie.h2d", "update").bytes) == [2 * e for e in groups]
    assert phases.loc["update", "end_s"] == pytest.approx(t * PS, rel=1e-9)
    assert dp1_ga1.summary["iteration_s"] == pytest.approx(t * PS, rel=1e-9)
    # update = 115008 ns + 8900 ps per element (2000 + 2500 + 4000 + 400)
    assert t - start == pytest.approx(1000 * TOTAL_PARAMS + 8900 * TOTAL_PARAMS, rel=1e-9)


def test_host_temporaries_live_only_during_their_copy(dp1_ga1):
    """The flush's pageable 16-bit temporary and the copy-back's cast temporary come and go:
    the host 'pageable temporaries' level only ever takes values 0 or 2 B x a size."""
    memory = dp1_ga1.memory
    temps = memory[(memory.device == "host0") & (memory.category == "pageable temporaries")]
    sizes = {2 * n for n in PARAMS.values()} | {2 * 57472, 2 * 57536, 0}
    assert set(temps.bytes) <= sizes
    assert list(temps.bytes.iloc[1::2]) == [0] * (len(temps) // 2)
    assert temps.bytes.iloc[-1] == 0


# ---------------------------------------------------------------------------- DP=1, GA=2


@pytest.fixture(scope="module")
def dp1_ga2(toy):
    return toy.run({"deepspeed": {"gradient_accumulation_steps": 2}})


def test_gradient_partition_moves_for_one_parameter_across_micro_batches(dp1_ga2):
    """layers.1.mlp.down_proj (n = 8192, 16384 B in fp16): micro-batch 0 moves D2H into the
    host accumulator then H2D back; micro-batch 1 brings the accumulator H2D, adds on the GPU,
    sends it D2H, then flushes the boundary fp32 gradient (0.13.3: pageable 16-bit)."""
    name, n = "layers.1.mlp.down_proj", 8192
    spans = dp1_ga2.spans
    mine = spans[spans.stream.str.startswith("pcie.") & spans.op.str.contains(name, regex=False)]
    mine = mine.sort_values("start_s", kind="stable")
    assert [(row.micro_batch, row.stream, row.op, row.bytes) for row in mine.itertuples()] == [
        (0, "pcie.d2h", f"grad → accum {name} (pinned)", 2 * n),
        (0, "pcie.h2d", f"accum → GPU {name} (pinned)", 2 * n),
        (1, "pcie.h2d", f"accum → GPU {name} (pinned)", 2 * n),
        (1, "pcie.d2h", f"accum → host {name} (pinned)", 2 * n),
        (1, "pcie.d2h", f"fp32 flush {name} (pageable)", 2 * n),
    ]
    starts, ends = list(mine.start_s / PS), list(mine.end_s / PS)
    durations = [e - s for s, e in zip(starts, ends, strict=True)]
    assert durations == pytest.approx([200 * n, 200 * n, 200 * n, 200 * n, 400 * n], rel=1e-9)
    # micro-batch 0: the H2D starts as the D2H ends.
    assert starts[1] == pytest.approx(ends[0], rel=1e-12)
    # micro-batch 1: between the H2D and the D2H, the add on the GPU: 3 passes over 2n B.
    assert starts[3] - ends[2] == pytest.approx(3 * 2 * n, rel=1e-9)
    # then the fp64 grad norm (2n B read, 8n B written and read back) and the zeroing of the
    # 2n B temporary at 1 GB/s.
    assert starts[4] - ends[3] == pytest.approx(GRAD_NORM_PS * n + 2000 * n, rel=1e-9)


def test_every_parameter_moves_in_the_same_pattern(dp1_ga2):
    spans = dp1_ga2.spans
    pcie = spans[spans.stream.str.startswith("pcie.") & (spans.phase == "backward")]
    pcie = pcie.sort_values("start_s", kind="stable")
    micro0 = [(row.stream, row.op, row.bytes) for row in pcie[pcie.micro_batch == 0].itertuples()]
    micro1 = [(row.stream, row.op, row.bytes) for row in pcie[pcie.micro_batch == 1].itertuples()]
    assert micro0 == [
        item for name in GRAD_ORDER for item in (
            ("pcie.d2h", f"grad → accum {name} (pinned)", 2 * PARAMS[name]),
            ("pcie.h2d", f"accum → GPU {name} (pinned)", 2 * PARAMS[name]))]
    assert micro1 == [
        item for name in GRAD_ORDER for item in (
            ("pcie.h2d", f"accum → GPU {name} (pinned)", 2 * PARAMS[name]),
            ("pcie.d2h", f"accum → host {name} (pinned)", 2 * PARAMS[name]),
            ("pcie.d2h", f"fp32 flush {name} (pageable)", 2 * PARAMS[name]))]
    # The non-boundary backward never touches the CPU.
    assert spans[(spans.stream == "cpu") & (spans.micro_batch == 0)
                 & (spans.phase == "backward")].empty


# ------------------------------------------------------------- boundary flush by version

SMALL_BUCKET = {"deepspeed": {"zero_optimization": {"reduce_bucket_size": 16384}}}
"""With a 16384-element bucket, lm_head's grad fills the first bucket alone; adding norm's grad
reduces it while the backward is still running (norm's backward already launched)."""


def _first_bucket_prefix() -> tuple[int, int]:
    """Start of lm_head's partition moves, and the end of its D2H/H2D + grad norm, in ps."""
    t0 = FORWARD_TOTAL_PS  # backward starts
    lm_head_grad = t0 + 2 * 20480 + 2 * 262144  # loss and lm_head backward: 2217472
    copied = lm_head_grad + 4 * 16384  # into the bucket: 2283008
    scattered = copied + 2 * 2 * 16384  # DP=1 local reduce-scatter: 2348544
    moved = scattered + 2 * D2H_PINNED_PS * 16384 + GRAD_NORM_PS * 16384  # 9197056
    return scattered, moved


@pytest.fixture(scope="module")
def by_version(toy):
    return {v: toy.run(SMALL_BUCKET | {"runtime": {"deepspeed_version": v}})
            for v in ("0.13.3", "0.17.0", "0.19.5")}


def _lm_head_flush(result) -> pd.DataFrame:
    spans = result.spans
    flush = spans[(spans.phase == "backward") & spans.stream.isin(["pcie.d2h", "cpu"])
                  & spans.op.str.contains("lm_head") & ~spans.op.str.contains("accum")]
    return flush.sort_values("start_s", kind="stable").reset_index(drop=True)


def test_flush_0_13_3_is_pageable_16_bit_then_cpu_cast(by_version):
    _, moved = _first_bucket_prefix()
    n = 16384
    zeroed = moved + ZERO_PAGES_PS * n  # 41965056
    copied = zeroed + D2H_PAGEABLE_PS * n  # 48518656
    cast = copied + CPU_CAST_PS * n  # 146822656
    flush = _lm_head_flush(by_version["0.13.3"])
    _assert_timeline(flush, [("zero pages lm_head", moved, zeroed),
                             ("fp32 flush lm_head (pageable)", zeroed, copied),
                             ("cast fp16→fp32 lm_head", copied, cast)])
    assert list(flush.stream) == ["cpu", "pcie.d2h", "cpu"]
    assert list(flush.bytes) == [2 * n, 2 * n, 2 * n]  # 16-bit bytes cross PCIe
    host = by_version["0.13.3"].memory
    temp = host[(host.device == "host0") & (host.category == "pageable temporaries")]
    assert list(temp.bytes.iloc[:2]) == [2 * n, 0]
    assert list(temp.t_s.iloc[:2]) == pytest.approx([moved * PS, cast * PS], rel=1e-9)


def test_flush_0_17_0_is_gpu_cast_then_pinned_fp32_d2h(by_version):
    _, moved = _first_bucket_prefix()
    n = 16384
    cast = moved + GPU_CAST_FP32_PS * n  # 9295360
    copied = cast + D2H_FP32_PINNED_PS * n  # 15848960
    for version in ("0.17.0", "0.19.5"):
        flush = _lm_head_flush(by_version[version])
        _assert_timeline(flush, [("fp32 grad lm_head (pinned)", cast, copied)])
        assert list(flush.bytes) == [4 * n]  # fp32 bytes cross PCIe
        assert by_version[version].spans.query("stream == 'cpu' and phase == 'backward'").empty


@pytest.mark.parametrize("version", ["0.15.4", "0.16.2"])
def test_flush_0_15_4_to_0_16_2_stages_through_a_pinned_buffer(toy, version):
    """PR #6670 to PR #6962: the GPU cast, a blocking D2H into the pinned staging buffer (pinned
    though pin_memory is false here; the accumulation moves before it are pageable, 2n B at
    5 GB/s = 400n ps each), a device synchronize (the compute stream has run out by then),
    then the host copies it into the fp32 gradient (read 4 B, write 4 B per element at 1 GB/s
    in the calling thread, the copy being below PyTorch's grain size: 8000n ps). The host
    held for all of it, down_proj's backward resumes after the copy. The staging buffer, fp32
    of the largest partition (lm_head's), is pinned host memory the whole run."""
    result = toy.run({"deepspeed": {"zero_optimization": {
        "reduce_bucket_size": 16384, "offload_optimizer": {"pin_memory": False}}},
        "runtime": {"deepspeed_version": version}})
    n = 16384
    moved = 2348544 + 2 * 400 * n + GRAD_NORM_PS * n
    cast = moved + GPU_CAST_FP32_PS * n
    copied = cast + D2H_FP32_PINNED_PS * n
    staged = copied + 8000 * n
    flush = _lm_head_flush(result)
    _assert_timeline(flush, [("fp32 grad lm_head (pinned)", cast, copied),
                             ("copy staged fp32 grad lm_head", copied, staged)])
    assert list(flush.stream) == ["pcie.d2h", "cpu"]
    compute = _ops(result.spans, "compute", "backward")
    down = compute[compute.op == "backward layers.1.mlp.down_proj"].iloc[0]
    assert down.start_s == pytest.approx(staged * PS, rel=1e-9)
    host = result.memory[result.memory.device == "host0"]
    staging = host[host.category == "fp32 grads (pinned)"]
    assert staging.bytes.iloc[0] == 4 * n  # 65536 B, a power of two already


NORM_BACKWARD_END_PS = FORWARD_TOTAL_PS + 2 * (20480 + 262144 + 2560) + 2 * 65536  # 2353664
"""With the small bucket, norm's backward (from 2217472 ps) is held back by lm_head's copy
into the bucket (65536 ps, from 2217472) and then by the bucket's DP=1 reduce-scatter, which
concatenates and pre-divides it (2 x 2 passes over 32768 B: 65536 ps, from 2283008)."""


@pytest.mark.parametrize(("version", "resume_ps"), [
    # the host waits for the whole bucket, flush included: 146822656 and 15848960 ps
    ("0.13.3", 9197056 + (ZERO_PAGES_PS + D2H_PAGEABLE_PS + CPU_CAST_PS) * 16384),
    ("0.17.0", 9197056 + (6 + 400) * 16384),
    # non-blocking: down_proj's backward follows norm's on the compute stream
    ("0.19.5", NORM_BACKWARD_END_PS),
])
def test_blocking_flush_holds_back_the_backward(by_version, version, resume_ps):
    """Layer 1's down_proj backward is launched by the host after it reduced the first
    bucket; a blocking flush delays its start, a non-blocking one does not."""
    compute = _ops(by_version[version].spans, "compute", "backward")
    down = compute[compute.op == "backward layers.1.mlp.down_proj"].iloc[0]
    norm = compute[compute.op == "backward norm"].iloc[0]
    assert norm.end_s == pytest.approx(NORM_BACKWARD_END_PS * PS, rel=1e-9)
    assert down.start_s == pytest.approx(resume_ps * PS, rel=1e-9)
    if version != "0.19.5":
        assert down.start_s == pytest.approx(_lm_head_flush(by_version[version]).end_s.max(),
                                             rel=1e-12)


def test_non_blocking_flush_shortens_the_boundary_backward(by_version):
    backward = {v: r.summary["phases_s"]["backward_boundary"] for v, r in by_version.items()}
    assert backward["0.19.5"] < backward["0.17.0"] < backward["0.13.3"]
    # Update and forward do not depend on the version.
    updates = {r.summary["phases_s"]["update"] for r in by_version.values()}
    assert max(updates) == pytest.approx(min(updates), rel=1e-12)


def test_pageable_buffers_block_the_host_even_on_0_19_5(toy):
    """A copy to or from pageable memory is synchronous for the host thread: with
    pin_memory false, 0.19.5 holds the backward back like 0.17.0 (its fp32 D2H is then a
    pageable 4 B/element copy: 4n B at 5 GB/s = 800n ps)."""
    result = toy.run({
        "deepspeed": {"zero_optimization": {"reduce_bucket_size": 16384,
                                            "offload_optimizer": {"pin_memory": False}}},
        "runtime": {"deepspeed_version": "0.19.5"}})
    n = 16384
    # pageable D2H/H2D of 2n B at 5 GB/s = 400n ps each
    moved = 2348544 + 2 * 400 * n + GRAD_NORM_PS * n
    resume = moved + GPU_CAST_FP32_PS * n + 800 * n
    compute = _ops(result.spans, "compute", "backward")
    down = compute[compute.op == "backward layers.1.mlp.down_proj"].iloc[0]
    assert down.start_s == pytest.approx(resume * PS, rel=1e-9)


# --------------------------------------------------------------------------- DP=2 sanity


def test_dp2_all_gather_and_partition_sizes(toy):
    """Two ranks: each forward module waits for its ring all-gather ((2-1)/2 x 2 B x numel per
    link at 100 GB/s); every grad partition is ceil(numel / 2) elements."""
    result = toy.run(gpus=2)
    spans = result.spans
    gathers = spans[(spans.stream == "allgather") & (spans["rank"] == 0)
                    & (spans.phase == "forward")].sort_values("start_s", kind="stable")
    first = gathers.iloc[0]
    assert first.op == "all-gather embed_tokens"
    assert (first.start_s, first.end_s) == pytest.approx((0.0, 16384 / 100e9), rel=1e-9)
    forward = _ops(spans[spans["rank"] == 0], "compute", "forward")
    assert forward.iloc[0].start_s == pytest.approx(first.end_s, rel=1e-12)
    for rank in (0, 1):
        mine = spans[(spans["rank"] == rank) & (spans.stream == "pcie.d2h")
                     & spans.op.str.startswith("grad → accum")]
        assert sorted(mine.bytes) == sorted(2 * -(-n // 2) for n in PARAMS.values())
    assert result.phases.groupby("phase").end_s.nunique().max() == 1  # ranks stay in step


@pytest.mark.parametrize(("version", "flush_op", "flush_bytes", "blocks"), [
    ("0.15.3", "fp32 flush lm_head (pageable)", 2 * 16384, True),  # last CPU-cast version
    ("0.15.4", "fp32 grad lm_head (pinned)", 4 * 16384, True),  # first GPU-cast version
    ("0.19.4", "fp32 grad lm_head (pinned)", 4 * 16384, True),  # last blocking version
    ("0.19.5", "fp32 grad lm_head (pinned)", 4 * 16384, False),  # first non-blocking one
])
def test_flush_behaviour_switches_at_the_documented_versions(toy, version, flush_op,
                                                             flush_bytes, blocks):
    result = toy.run(SMALL_BUCKET | {"runtime": {"deepspeed_version": version}})
    flush = _lm_head_flush(result)
    flush = flush[flush.stream == "pcie.d2h"]
    assert flush.op.iloc[0] == flush_op
    assert flush.bytes.iloc[0] == flush_bytes
    compute = _ops(result.spans, "compute", "backward")
    down = compute[compute.op == "backward layers.1.mlp.down_proj"].iloc[0]
    norm = compute[compute.op == "backward norm"].iloc[0]
    assert (down.start_s > norm.end_s) == blocks


def test_fp32_accumulation_flush_is_a_plain_fp32_copy(toy):
    result = toy.run({"deepspeed": {"data_types": {"grad_accum_dtype": "fp32"}}})
    spans = result.spans
    n = 16384
    # the accumulation moves are fp32 already (4 B/element) ...
    accum = spans[spans.op == "grad → accum lm_head (pinned)"]
    assert list(accum.bytes) == [4 * n]
    # ... so the boundary's fp32 gradient needs no cast: one pinned D2H of 4n bytes
    flush = _lm_head_flush(result)
    assert list(flush.stream) == ["pcie.d2h"]
    assert list(flush.bytes) == [4 * n]
    assert flush.op.iloc[0].endswith("(pinned)")
    assert spans[(spans.stream == "cpu") & (spans.phase == "backward")].empty


def test_fp32_accumulation_on_the_gpu_steps_the_flat_gradient_uncast(toy):
    """Without offload, `flatten(averaged_gradients).to(fp32)` of fp32 gradients is the flat
    copy itself: flattening reads and writes 4 B per element, no cast, and the flat copy is
    what Adam steps."""
    on_gpu = {"offload_optimizer": {"device": "none"}}
    result = toy.run({"deepspeed": {"data_types": {"grad_accum_dtype": "fp32"},
                                    "zero_optimization": on_gpu}})
    spans = result.spans
    flat = spans[spans.op == "fp32 gradient sub-group 0"].iloc[0]
    assert (flat.end_s - flat.start_s) == pytest.approx(8 * 57_472 / 1e12)


def test_summary_tflops_and_pcie_rates(dp1_ga1):
    """Model FLOPs per micro-batch: 3 x forward matmul/attention FLOPs (norms, activations and
    the loss count 0): per layer 4 x 65536 + 16384 + 3 x 131072 = 671744, two layers, plus
    lm_head 262144: 3 x 1605632 = 4816896 FLOP."""
    summary = dp1_ga1.summary
    iteration = summary["iteration_s"]
    assert summary["tflops_per_gpu"] == pytest.approx(4816896 / iteration / 1e12, rel=1e-12)
    # PCIe: H2D = the partition back once + the copy-back; D2H = the partition + the flush.
    assert summary["pcie_GB"] == pytest.approx({"h2d": 4 * TOTAL_PARAMS / 1e9,
                                                "d2h": 4 * TOTAL_PARAMS / 1e9}, rel=1e-12)
    assert summary["pcie_mean_GBps"]["h2d"] == pytest.approx(
        4 * TOTAL_PARAMS / iteration / 1e9, rel=1e-12)


def test_two_ranks_share_one_numa_domain_max_min_fair(toy):
    """DP=2 on one NUMA domain of 10 GB/s. Both ranks move lm_head's grad partition (8192
    elements, 16384 B) at the same instant. A pinned D2H costs 1 host byte per byte: 2 x r <= 10
    GB/s gives 5 GB/s each, half the link (16384 B / 5e9 = 3276800 ps). A pageable D2H costs 3
    host bytes per byte (DMA into the bounce buffer, then memcpy): 2 x 3r <= 10 GB/s gives
    1.667 GB/s each, under its 5 GB/s pageable peak (16384 x 6 / 1e10 s = 9830400 ps)."""
    result = toy.run({"hardware": {"host": {"memory_GBps_per_domain": {"value": 10}}}}, gpus=2)
    spans = result.spans
    for op, ps in [("grad → accum lm_head (pinned)", 3276800),
                   ("accum → GPU lm_head (pinned)", 3276800),
                   ("fp32 flush lm_head (pageable)", 9830400)]:
        both = spans[spans.op == op]
        assert sorted(both["rank"]) == [0, 1]
        assert both.start_s.nunique() == 1  # simultaneous
        assert list(both.end_s - both.start_s) == pytest.approx([ps * PS] * 2, rel=1e-9)


@pytest.mark.parametrize(("penalty", "threads_per_rank", "overflow_ps"), [
    (0.0, None, 115008000),  # 2 ranks x 4 threads on 4: each gets 2 threads
    (1.0, None, 230016000),  # oversubscribed x2, penalty 1: 4 / (1 + 1) = 2 threads in all
    (1.0, 2, 115008000),  # 2 threads per rank: no oversubscription, no penalty
])
def test_cpu_oversubscription_between_ranks(toy, penalty, threads_per_rank, overflow_ps):
    """The overflow check of each rank runs over its 57504 16-bit grads at 2.5e8 elements a
    second per thread: 57504 / (threads x 2.5e8) s."""
    result = toy.run({"hardware": {"cpu": {"oversubscription_penalty": {"value": penalty}}},
                      "runtime": {"cpu_threads_per_rank": threads_per_rank}}, gpus=2)
    spans = result.spans
    check = spans[spans.op == "overflow check"]
    assert sorted(check["rank"]) == [0, 1]
    assert list(check.end_s - check.start_s) == pytest.approx([overflow_ps * PS] * 2,
                                                              rel=1e-9)


@pytest.mark.parametrize(("threads_per_rank", "lost_ps"), [
    (None, 5 * 3_000_000_000),  # 2 ranks x 4 threads on 4: oversubscribed x2, 3 ms x (2 - 1)
    (2, 0),  # 2 threads per rank fill the 4 hardware threads: nothing lost
])
def test_a_parallel_region_on_an_oversubscribed_node_waits_at_its_join(toy, threads_per_rank,
                                                                       lost_ps):
    """The overflow check runs five OpenMP regions (PyTorch's `abs`, `==`, `any`, `!=`,
    `any`): 57504 elements at 2.5e8 a second per thread over the 2 threads each rank gets
    either way (115008000 ps), then, when the node's pools oversubscribe its hardware
    threads, each region's join waits `oversubscribed_region_ms` per extra pool."""
    result = toy.run({"hardware": {"cpu": {"oversubscribed_region_ms": {
                          "value": 3, "basis": "assumed", "source": "this test"}}},
                      "runtime": {"cpu_threads_per_rank": threads_per_rank}}, gpus=2)
    check = result.spans[result.spans.op == "overflow check"]
    assert sorted(check["rank"]) == [0, 1]
    assert list(check.end_s - check.start_s) == pytest.approx(
        [(115008000 + lost_ps) * PS] * 2, rel=1e-9)


def test_default_pool_is_one_thread_per_physical_core(toy):
    """PyTorch sizes its OpenMP pool to the physical cores, so two hardware threads per core
    do not double the pool: the overflow check reads 115008 fp32 grads (460032 B) at 1 GB/s
    per thread with 4 threads (115008000 ps), not 8; an explicit 8 halves it."""
    two_per_core = {"hardware": {"host": {"threads_per_core": 2}}}
    for threads, ps in [(None, 115008000), (8, 57504000)]:
        patch = two_per_core | {"runtime": {"cpu_threads_per_rank": threads}}
        spans = toy.run(patch).spans
        check = spans[spans.op == "overflow check"]
        assert list(check.end_s - check.start_s) == pytest.approx([ps * PS], rel=1e-9)


TWO_SOCKETS = {"sockets": 2, "numa_domains": 2, "cores_per_socket": 2,
               "socket_link_GBps": {"value": 2}}


@pytest.mark.parametrize(("placement", "ps"), [
    ("round_robin", 3276800),  # rank 0 on domain 0, the GPU's own: 32768 B at 10 GB/s
    ("interleaved", 8192000),  # half the bytes cross a 2 GB/s link: r / 2 <= 2e9, 4 GB/s
])
def test_interleaved_pages_send_half_of_a_copy_over_the_socket_link(toy, placement, ps):
    """The GPU hangs off domain 0. lm_head's grad partition (16384 fp16 elements, 32768 B)
    goes to pinned memory: local under round_robin, half on each domain when interleaved."""
    patch = {"hardware": {"host": TWO_SOCKETS | {"rank_memory_placement": {"value": placement}}}}
    spans = toy.run(patch).spans
    accum = spans[spans.op == "grad → accum lm_head (pinned)"]
    assert list(accum.end_s - accum.start_s) == pytest.approx([ps * PS], rel=1e-9)


@pytest.mark.parametrize(("total_GBps", "ps"), [
    (0, 8192000),  # no shared limit: each direction 2 GB/s, 16384 B in 8.192 us
    (2, 16384000),  # both directions share 2 GB/s: 1 GB/s each
    (3, 10922667),  # 1.5 GB/s each
    (4, 8192000),  # 2 GB/s each: the per-direction link binds again
])
def test_crossing_copies_in_opposite_directions_share_the_socket_links_total(toy, total_GBps,
                                                                             ps):
    """GPU 0 hangs off domain 1 and GPU 1 off domain 0, so under round_robin each rank's
    pinned buffers sit on the other socket: at DP=2 both ranks copy lm_head's gradient
    partition (8192 fp16 elements, 16384 B) D2H at the same moment, rank 0's from domain 1 to
    0 and rank 1's from 0 to 1. Each direction of the link carries 2 GB/s; with
    `host.socket_link_total_GBps` the two copies also share that total."""
    host = TWO_SOCKETS | {"socket_link_total_GBps": {"value": total_GBps, "basis": "assumed",
                                                      "source": "test"}}
    spans = toy.run({"hardware": {"host": host, "gpu": {"numa_domain": [1, 0]}}},
                    gpus=2).spans
    accum = spans[spans.op == "grad → accum lm_head (pinned)"]
    assert sorted(accum["rank"]) == [0, 1]
    assert list(accum.start_s) == pytest.approx([accum.start_s.iloc[0]] * 2, rel=1e-12)
    assert list(accum.end_s - accum.start_s) == pytest.approx([ps * PS] * 2, rel=1e-6)


@pytest.mark.parametrize(("placement", "busiest_domain_bytes"), [
    ("gpu_local", 28),  # bound to socket 0: all 28 B of an element on domain 0
    ("round_robin", 20),  # fp32 param + grad (12 B) at home, exp_avg/_sq (16 B) half each
    ("interleaved", 14),  # every page evenly on both domains
])
def test_adam_memory_traffic_follows_where_each_buffer_lives(toy, placement,
                                                             busiest_domain_bytes):
    """Adam on sub-group 0 (57472 elements) with 0.2 GB/s per domain, far below its thread
    ceiling (4 x 1e8 params/s): the busiest domain sets the rate, 0.2e9 / bytes it carries."""
    host = TWO_SOCKETS | {"rank_memory_placement": {"value": placement},
                          "memory_GBps_per_domain": {"value": 0.2}}
    spans = toy.run({"hardware": {"host": host}}).spans
    adam = spans[spans.op == "cpu adam sub-group 0"]
    assert list(adam.end_s - adam.start_s) == pytest.approx(
        [57472 * busiest_domain_bytes / 0.2e9], rel=1e-9)


@pytest.mark.parametrize(("placement", "busiest_domain_bytes"), [
    ("gpu_local", 28),  # threads and pages on domain 0: every byte local
    ("interleaved", 28),  # 14 B per domain, half of them touched from the other: 14 x 2
    ("round_robin", 40),  # domain 0: 12 B at home + 8 B spread, each at (1 + 3) / 2
])
def test_a_remote_byte_costs_its_domain_remote_access_cost_local_bytes(toy, placement,
                                                                        busiest_domain_bytes):
    """As above with host.remote_access_cost 3: unbound threads sit evenly on both domains, so
    a byte on either costs 0.5 x 1 + 0.5 x 3 = 2 local bytes; bound (gpu_local) threads touch
    only their own domain's pages."""
    host = TWO_SOCKETS | {"rank_memory_placement": {"value": placement},
                          "memory_GBps_per_domain": {"value": 0.2},
                          "remote_access_cost": {"value": 3, "basis": "assumed", "source": "test"}}
    spans = toy.run({"hardware": {"host": host}}).spans
    adam = spans[spans.op == "cpu adam sub-group 0"]
    assert list(adam.end_s - adam.start_s) == pytest.approx(
        [57472 * busiest_domain_bytes / 0.2e9], rel=1e-9)


def test_bound_ranks_keep_threads_and_pages_on_their_gpus_domain(toy):
    """Two GPUs, GPU 0 on domain 1 and GPU 1 on domain 0 (as Polaris numbers them backwards),
    interleaved pages when unbound, remote bytes at 3x, sub-group 0 of 57504 elements per rank:
    bound (`bind_cores_to_rank`), each rank's Adam is local (28 B per element on its own
    domain); unbound, each domain carries half of both ranks' bytes at 2x (28 B per element of
    each rank). With fast memory and two hardware threads per core, Adam is bound by its
    threads: unbound, one per physical core (4 each, 8 on 8 hardware threads); bound, the
    rank's share of the physical cores (4 // 2 = 2, OMP_NUM_THREADS), at 1e8 params/s each."""
    gpus = {"per_node": 2, "numa_domain": [1, 0]}
    slow = TWO_SOCKETS | {"rank_memory_placement": {"value": "interleaved"},
                          "memory_GBps_per_domain": {"value": 0.2},
                          "remote_access_cost": {"value": 3, "basis": "assumed",
                                                 "source": "test"}}
    fast = slow | {"memory_GBps_per_domain": {"value": 1e6}, "threads_per_core": 2}
    expected = {("slow", True): 57504 * 28 / 0.2e9, ("slow", False): 2 * 57504 * 28 / 0.2e9,
                ("fast", False): 57504 / 4e8, ("fast", True): 57504 / 2e8}
    for (name, bound), seconds in expected.items():
        patch = {"hardware": {"gpu": gpus, "host": slow if name == "slow" else fast},
                 "runtime": {"bind_cores_to_rank": bound}}
        spans = toy.run(patch, gpus=2).spans
        adam = spans[spans.op == "cpu adam sub-group 0"]
        assert list(adam.end_s - adam.start_s) == pytest.approx([seconds] * 2, rel=1e-9), (
            name, bound)


# DeepSpeed stage3.py: reduce_and_partition_stream = Stream() if overlap_comm else
# default_stream(), so without overlap_comm the reduction is serialized with the backward.
NO_OVERLAP = {"deepspeed": {"zero_optimization": {"overlap_comm": False,
                                                  "reduce_bucket_size": 16384}},
              "runtime": {"deepspeed_version": "0.19.5"}}


def test_without_overlap_comm_reductions_do_not_overlap_compute(toy):
    spans = toy.run(NO_OVERLAP).spans
    compute = spans[spans.stream == "compute"]
    reduce = spans[spans.stream == "reduce"]
    overlapping = [(c.op, r.op) for c in compute.itertuples() for r in reduce.itertuples()
                   if r.start_s < c.end_s - 1e-15 and c.start_s < r.end_s - 1e-15]
    assert overlapping == []


def test_without_overlap_comm_the_backward_waits_for_the_first_bucket(toy):
    """Same small buckets as above on 0.19.5 (non-blocking flush): without overlap_comm the
    first bucket's reduction sits on the compute stream before layer 1 down_proj's backward,
    so down_proj cannot start before lm_head's fp32 D2H has ended (at 15848960 ps with
    overlap on 0.17.0; a few ns later here, as the bucket copies also queue on the compute
    stream), instead of right after norm's backward (2222592 ps)."""
    result = toy.run(NO_OVERLAP)
    compute = _ops(result.spans, "compute", "backward")
    down = compute[compute.op == "backward layers.1.mlp.down_proj"].iloc[0]
    assert down.start_s >= _lm_head_flush(result).end_s.max()


@pytest.mark.parametrize(("zero", "kind", "held_bytes"), [
    ({}, "reduce_scatter", 2 * sum(2 * -(-n // 2) for n in PARAMS.values())),
    ({"reduce_scatter": False}, "all_reduce", 0),
    ({"reduce_scatter": False, "contiguous_gradients": False}, "reduce_scatter",
     2 * sum(2 * -(-n // 2) for n in PARAMS.values())),
])
def test_zero3_all_reduces_a_bucket_in_place_only_with_contiguous_gradients(toy, zero, kind,
                                                                             held_bytes):
    """stage3.py `__reduce_and_partition_ipg_grads`: with `reduce_scatter` off, a bucket
    that sits in the contiguous buffer is pre-divided in place (2 passes over its 2 B x
    115008) and all-reduced (a ring over 2 ranks moves 2 x (2-1)/2 of its 230016 B at
    100 GB/s: 2760192 ps in all), its partitions views of the buffer: nothing is held but
    each partition's 16-bit copy back from the host and, at the boundary, its fp64 copy for
    the norm (lm_head's 8192 x (2 + 8) B the largest).
    Without contiguous gradients every bucket goes through `reduce_scatter_coalesced`, whose
    flat buffer of padded rank chunks stays until the partitions are consumed."""
    result = toy.run({"deepspeed": {"zero_optimization": zero}}, gpus=2)
    spans = result.spans[(result.spans["rank"] == 0) & (result.spans.stream == "reduce")]
    reduction = spans[spans.op_kind.isin(["reduce_scatter", "all_reduce"])]
    assert list(reduction.op_kind) == [kind]
    if kind == "all_reduce":
        only = reduction.iloc[0]
        assert (only.end_s - only.start_s) == pytest.approx(2760192 * PS, rel=1e-9)
    memory = result.memory
    partitions = memory[(memory.device == "gpu0") & (memory.category == "grad partitions")]
    assert partitions.bytes.max() == held_bytes + (2 + 8) * 8192  # and its fp64 norm copy


@pytest.mark.parametrize(("chunk", "fp64_bytes"), [(250_000_000, 8 * 16384), (4096, 8 * 4096)])
def test_the_boundary_norm_holds_one_fp64_chunk_at_a_time(toy, monkeypatch, chunk, fp64_bytes):
    """stage3.py `_constant_buffered_norm2(grad_buffer)`: `part.data.double().norm(2)` over
    `buffer_size` (250M) elements at a time. At DP=1 the largest partitions are lm_head's and
    embed_tokens' 16384 elements: with the bucket's flat buffer (2 B x 115008) and the
    partition's 16-bit copy back from the host (2 B x 16384), the GPU holds its fp64 copy,
    whole under 250M, 4096 elements of it with the chunk made that small."""
    monkeypatch.setattr("zerosim.engine.sinks.GRAD_NORM_CHUNK_NUMEL", chunk)
    memory = toy.run().memory
    partitions = memory[(memory.device == "gpu0") & (memory.category == "grad partitions")]
    assert partitions.bytes.max() == 2 * TOTAL_PARAMS + 2 * 16384 + fp64_bytes


def test_a_gradient_larger_than_the_bucket_is_reduce_scattered_even_without_reduce_scatter(toy):
    """`reduce_scatter: false` with a 10000-element bucket: lm_head's and embed_tokens'
    gradients (16384 elements each) do not fit the contiguous buffer, so each is reduced
    alone through `reduce_scatter_coalesced` (2 B x 16384); every other bucket fits and is
    all-reduced in place."""
    result = toy.run({"deepspeed": {"zero_optimization": {"reduce_scatter": False,
                                                          "reduce_bucket_size": 10000}}},
                     gpus=2)
    spans = result.spans[(result.spans["rank"] == 0) & (result.spans.stream == "reduce")]
    reductions = spans[spans.op_kind.isin(["reduce_scatter", "all_reduce"])]
    kinds = list(reductions.op_kind)
    assert kinds[0] == kinds[-1] == "reduce_scatter"
    assert set(kinds[1:-1]) == {"all_reduce"} and len(kinds) == 12
    assert reductions.bytes.iloc[0] == reductions.bytes.iloc[-1] == 2 * 16384


HOOK_PS = 50000  # fetch_hook_us 0.05 on a core at the stack's reference clock


def _host_and_gpu_forward(syncs: int) -> list[tuple[str, int, int]]:
    """The forward's compute timeline when the host pays HOOK_PS before each module that
    owns parameters and, with `syncs`, waits before each block's MLP until the GPU has run
    everything queued: a module starts once the host has issued it and the GPU is free."""
    timeline, host, gpu = [], 0, 0
    for name, ps in FORWARD_PS:
        if syncs and name.endswith("mlp.gate_proj"):
            host = max(host, gpu)
        if name in PARAMS:
            host += HOOK_PS
        start = max(host, gpu)
        gpu = start + ps
        timeline.append((f"forward {name}", start, gpu))
    return timeline


@pytest.mark.parametrize("syncs", [0, 2])
def test_a_sync_before_the_mlp_exposes_its_first_hook(toy, syncs):
    """Megatron-DeepSpeed makes two scalars on the GPU between a block's attention and its
    MLP (`modules.syncs_before_mlp`): the host, which ran ahead of the GPU, waits there for
    post_attention_layernorm to finish, so gate_proj's hook runs with the GPU idle. In this
    GPU-bound toy (9 hooks of 50000 ps a layer against 683008 ps of kernels) that delays each
    block's MLP by one hook: the forward ends 2 x 50000 ps later."""
    stack = toy_stack()
    stack["host"]["fetch_hook_us"] = q(HOOK_PS * 1e-6)
    if syncs:
        stack["modules"]["syncs_before_mlp"] = {"count": syncs, "source": "test"}
    result = toy.run({"runtime": {"framework": stack}})
    forward = _ops(result.spans, "compute", "forward")
    _assert_timeline(forward, _host_and_gpu_forward(syncs))
    without = _host_and_gpu_forward(0)[-1][2]
    assert forward.end_s.iloc[-1] == pytest.approx(
        (without + (2 * HOOK_PS if syncs else 0)) * PS, rel=1e-9)


def test_faulting_threads_of_one_process_contend_as_the_profile_says(toy, dp1_ga1):
    """`cpu.page_zeroing_contention` 1.0: n threads zero n / (1 + (n - 1)) x 1 GB/s together,
    so the copy-back's two cast threads fault its temporary's 2 B/element in at 1 GB/s, not 2
    (2000 ps/element, not 1000), while the flush's one faulting thread (the D2H's staging)
    keeps its 1 GB/s: the backward is unchanged and the update longer by 1000 ps/element."""
    profile = toy.profile()
    profile["cpu"]["page_zeroing_contention"] = {"value": 1.0, "basis": "assumed",
                                                 "source": "test"}
    contended = toy.run({"hardware": profile})
    phases = contended.phases.set_index("phase")
    before = dp1_ga1.phases.set_index("phase")
    assert phases.loc["backward", "end_s"] == before.loc["backward", "end_s"]
    update = phases.loc["update", "end_s"] - phases.loc["update", "start_s"]
    update_before = before.loc["update", "end_s"] - before.loc["update", "start_s"]
    assert (update - update_before) / PS == pytest.approx(1000 * TOTAL_PARAMS, rel=1e-9)


def test_an_implausible_page_zeroing_contention_is_refused(toy):
    profile = toy.profile()
    profile["cpu"]["page_zeroing_contention"] = {"value": 1e4, "basis": "assumed",
                                                 "source": "test"}
    with pytest.raises(ScenarioError, match="page_zeroing_contention"):
        toy.scenario({"hardware": profile})
