"""The NVMe tier: profile keys, scenario keys, Machine.nvme_read/nvme_write and swap-buffer sizes.

Every expected value is worked out by hand in the comments next to it.
"""

from __future__ import annotations

import pytest
import simpy

import zerosim
from tests.conftest import deep_merge, q, toy_profile, toy_tree
from zerosim import scenario_from_dict
from zerosim.engine.machine import Machine
from zerosim.errors import ScenarioError, UnsupportedConfigError
from zerosim.hardware import nvme
from zerosim.hardware.profile import apply_overrides, load_profile, parse_profile

# --------------------------------------------------------------------------- a toy node with NVMe

TOY_NVME = {
    "drives_per_node": 2,
    "read_GBps_per_drive": q(1.0),    # 2 drives: 2 GB/s of reads per node
    "write_GBps_per_drive": q(0.5),   # 2 drives: 1 GB/s of writes per node
    "latency_us": q(0),
    "capacity_GiB_per_drive": q(100),
}


def nvme_profile(gpus: int = 2, *, memory_GBps: float = 1e6, latency_us: float = 0):
    tree = toy_profile(gpus)
    tree["nvme"] = dict(TOY_NVME, latency_us=q(latency_us))
    tree["host"]["memory_GBps_per_domain"] = q(memory_GBps)
    return parse_profile(tree, "toy+nvme")


def run(machine: Machine, *jobs) -> dict[str, float]:
    """Start every (name, generator) at t = 0; return when each one finished."""
    env = machine.env
    done: dict[str, float] = {}

    def job(name, gen):
        yield from gen
        done[name] = env.now

    for name, gen in jobs:
        env.process(job(name, gen))
    env.run()
    machine.assert_idle()
    return done


def machine_for(profile, ranks: int = 2) -> Machine:
    return Machine(simpy.Environment(), profile, ranks, None)


# --------------------------------------------------------------------------- profile keys

def test_profile_without_nvme_keys_loads_with_stated_defaults():
    profile = parse_profile(toy_profile(), "toy")
    assert profile.nvme_drives_per_node == 0 and not profile.has_nvme
    assert profile.nvme_read_Bps_per_drive == 7.0e9
    assert profile.nvme_write_Bps_per_drive == 4.2e9
    assert profile.nvme_latency_s == pytest.approx(80e-6)
    assert profile.nvme_capacity_bytes_per_drive == 3576 * 2**30
    prov = profile.provenance["nvme.read_GBps_per_drive"]
    assert prov.basis == "assumed" and prov.source.startswith("default: ")


def test_profile_with_nvme_keys():
    profile = nvme_profile()
    assert profile.nvme_drives_per_node == 2
    assert profile.nvme_read_Bps_per_drive == 1e9
    assert profile.nvme_write_Bps_per_drive == 0.5e9
    assert profile.nvme_capacity_bytes_per_drive == 100 * 2**30


def test_study_node_has_two_gen4_drives_of_1_5_TB():
    profile = load_profile("h100-jlse")
    assert profile.nvme_drives_per_node == 2
    # 1397 GiB = 1,499,998,...: the study's 1.5 TB to 0.02%
    assert profile.nvme_capacity_bytes_per_drive == pytest.approx(1.5e12, rel=2e-4)
    for key in ("nvme.read_GBps_per_drive", "nvme.write_GBps_per_drive"):
        assert profile.provenance[key].basis == "fitted"
        assert "h100_nvme_runs.csv" in profile.provenance[key].source
    assert "study section 3.1" in profile.provenance["nvme.capacity_GiB_per_drive"].source


def test_negative_drive_count_is_an_error():
    tree = toy_profile()
    tree["nvme"] = {"drives_per_node": -1}
    with pytest.raises(ScenarioError, match=r"nvme.drives_per_node: expected an integer >= 0"):
        parse_profile(tree, "toy")


def test_override_adds_a_defaulted_nvme_key():
    tree = apply_overrides(toy_profile(), {"nvme.drives_per_node": 4,
                                           "nvme.read_GBps_per_drive": 3.0}, source="t")
    profile = parse_profile(tree, "t")
    assert profile.nvme_drives_per_node == 4
    assert profile.nvme_read_Bps_per_drive == 3e9
    assert profile.provenance["nvme.read_GBps_per_drive"].basis == "override"


# --------------------------------------------------------------------------- nvme_read / nvme_write

def test_read_and_write_alone_run_at_the_striped_drive_bandwidth():
    m = machine_for(nvme_profile())
    # read: 4e9 B / (2 drives x 1 GB/s) = 2.0 s
    assert run(m, ("r", m.nvme_read(0, 4e9))) == {"r": pytest.approx(2.0)}
    m = machine_for(nvme_profile())
    # write: 4e9 B / (2 drives x 0.5 GB/s) = 4.0 s
    assert run(m, ("w", m.nvme_write(0, 4e9))) == {"w": pytest.approx(4.0)}


def test_latency_comes_first():
    m = machine_for(nvme_profile(latency_us=10))
    # 10 us, then 2e9 B / 2 GB/s = 1.0 s
    assert run(m, ("r", m.nvme_read(0, 2e9))) == {"r": pytest.approx(1.0 + 10e-6)}


def test_zero_bytes_take_no_time():
    m = machine_for(nvme_profile(latency_us=10))
    assert run(m, ("r", m.nvme_read(0, 0))) == {"r": 0.0}


def test_two_ranks_share_the_drives_max_min_fairly():
    m = machine_for(nvme_profile())
    # 2 GB/s shared: 1 GB/s each until rank 0's 1e9 B are done at t = 1.0; rank 1 has
    # 3e9 - 1e9 = 2e9 B left, alone at 2 GB/s: 1.0 s more, t = 2.0.
    done = run(m, ("r0", m.nvme_read(0, 1e9)), ("r1", m.nvme_read(1, 3e9)))
    assert done == {"r0": pytest.approx(1.0), "r1": pytest.approx(2.0)}


def test_reads_and_writes_share_the_drives_time():
    m = machine_for(nvme_profile())
    # Read 2e9 B (2 GB/s alone) beside a write of 1e9 B (1 GB/s alone): both run at x with
    # x / 2e9 + x / 1e9 = 1, x = 2/3 GB/s, so the write ends at 1e9 / x = 1.5 s; the read has
    # 1e9 B left then, alone at 2 GB/s: 0.5 s more, t = 2.0 (separate capacities: 1.0 and 1.0).
    done = run(m, ("r", m.nvme_read(0, 2e9)), ("w", m.nvme_write(1, 1e9)))
    assert done == {"r": pytest.approx(2.0), "w": pytest.approx(1.5)}


def test_host_memory_bounds_a_read():
    m = machine_for(nvme_profile(memory_GBps=1.5))
    # 1 B of host memory per byte: min(2 GB/s drives, 1.5 GB/s memory) = 1.5 GB/s;
    # 3e9 B / 1.5e9 B/s = 2.0 s
    assert run(m, ("r", m.nvme_read(0, 3e9))) == {"r": pytest.approx(2.0)}


def test_a_read_and_a_gpu_dma_share_the_numa_domain():
    m = machine_for(nvme_profile(memory_GBps=3.0))
    # One NUMA domain of 3 GB/s carries both (1 B per byte each, equal weights since the toy's
    # dma_memory_weight is 1): 1.5 GB/s each, under the drives' 2 GB/s and PCIe's 10 GB/s.
    # 3e9 B / 1.5 GB/s = 2.0 s for both.
    done = run(m, ("nvme", m.nvme_read(0, 3e9)),
               ("d2h", m.dma(1, "d2h", 3e9, pinned=True)))
    assert done == {"nvme": pytest.approx(2.0), "d2h": pytest.approx(2.0)}


def test_a_node_without_drives_refuses_nvme_io():
    m = machine_for(parse_profile(toy_profile(2), "toy"))
    assert m.nvme == {}
    with pytest.raises(ValueError, match="has no NVMe drives"):
        run(m, ("r", m.nvme_read(0, 1e9)))


def test_one_drive_resource_per_node_measured_in_drive_time():
    m = machine_for(nvme_profile())
    assert [r.name for r in m.nvme.values()] == ["host0.nvme"]
    assert m.nvme[0].capacity == 1.0


# --------------------------------------------------------------------------- scenario keys

def nvme_scenario(zero_patch=None, top_patch=None):
    """The toy scenario on a toy node with two NVMe drives (a node without drives refuses
    NVMe offload when the scenario is resolved)."""
    tree = deep_merge(toy_tree(), {"hardware": {"nvme": dict(TOY_NVME)},
                                   "deepspeed": {"zero_optimization": zero_patch or {}}})
    return scenario_from_dict(deep_merge(tree, {"deepspeed": top_patch or {}}), source="s.yaml")


NVME_OPT = {"offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme"}}
NVME_PARAM = {"offload_param": {"device": "nvme", "nvme_path": "/local_nvme"}}


def test_nvme_offload_loads_with_deepspeed_defaults(recwarn):
    ds = nvme_scenario(deep_merge(NVME_OPT, NVME_PARAM)).deepspeed
    opt, param, aio = ds.offload_optimizer, ds.offload_param, ds.aio
    assert (opt.device, opt.nvme_path, opt.buffer_count) == ("nvme", "/local_nvme", 4)
    assert (opt.pipeline_read, opt.pipeline_write, opt.fast_init) == (False, False, False)
    assert not opt.pipelined
    assert (param.buffer_count, param.buffer_size, param.max_in_cpu) == (5, 10**8, 10**9)
    assert (aio.block_size, aio.queue_depth, aio.thread_count) == (1048576, 8, 1)
    assert (aio.single_submit, aio.overlap_events) == (False, True)
    assert not [w for w in recwarn if "does not model" in str(w.message)]


def test_nvme_keys_are_read_and_written_back():
    ds = nvme_scenario(
        {"offload_optimizer": {"device": "nvme", "nvme_path": "/n", "buffer_count": 12,
                               "pipeline_read": True, "pipeline_write": True, "fast_init": True},
         "offload_param": {"device": "nvme", "nvme_path": "/n", "buffer_count": 8,
                           "buffer_size": 2e8, "max_in_cpu": 5e8}},
        {"aio": {"block_size": 262144, "queue_depth": 32, "thread_count": 2,
                 "single_submit": True, "overlap_events": False}}).deepspeed
    out = ds.to_dict()
    assert out["zero_optimization"]["offload_optimizer"] == {
        "device": "nvme", "nvme_path": "/n", "pin_memory": True, "ratio": 1.0,  # toy: pinned
        "buffer_count": 12, "pipeline_read": True, "pipeline_write": True, "fast_init": True}
    assert out["zero_optimization"]["offload_param"] == {
        "device": "nvme", "nvme_path": "/n", "pin_memory": False, "buffer_count": 8,
        "buffer_size": 200_000_000, "max_in_cpu": 500_000_000}
    assert out["aio"] == {"block_size": 262144, "queue_depth": 32, "thread_count": 2,
                          "single_submit": True, "overlap_events": False}
    assert ds.offload_optimizer.pipelined


def test_cpu_offload_still_resolves_as_before():
    ds = nvme_scenario().deepspeed
    assert ds.offload_optimizer.device == "cpu" and ds.offload_optimizer.nvme_path is None
    assert ds.aio.block_size == 1048576


@pytest.mark.parametrize(("zero", "top", "message"), [
    ({"offload_optimizer": {"device": "nvme"}}, None,
     r"s.yaml: deepspeed.zero_optimization.offload_optimizer.nvme_path: expected a filesystem "
     r"path .* got 'nothing'"),
    ({"offload_param": {"device": "nvme"}}, None,
     r"deepspeed.zero_optimization.offload_param.nvme_path: expected .*cannot be None"),
    (dict(NVME_OPT, stage=2), None,
     r"deepspeed.zero_optimization.offload_optimizer.device: expected 'cpu' or 'none' unless "
     r"stage is 3 .* got 'nvme'"),
    ({"offload_optimizer": dict(NVME_OPT["offload_optimizer"], buffer_count=0)}, None,
     r"offload_optimizer.buffer_count: expected at least 1 .* got 0"),
    ({"offload_param": {"buffer_size": 1.5}}, None,
     r"offload_param.buffer_size: expected a whole number, got 1.5"),
    ({"offload_param": {"buffer_count": -1}}, None,
     r"offload_param.buffer_count: expected a number >= 0, got -1"),
    (None, {"aio": {"thread_count": 0}}, r"deepspeed.aio.thread_count: expected a number >= 1"),
    (None, {"aio": {"queue_dept": 4}}, r"deepspeed.aio.queue_dept: .*did you mean 'queue_depth'"),
])
def test_nvme_errors_name_file_key_expected_and_got(zero, top, message):
    with pytest.raises(ScenarioError, match=message):
        nvme_scenario(zero, top)


# --------------------------------------------------------------------------- swap-buffer sizes

def test_io_alignment():
    # 1024 B x thread_count: 256 fp32 elements per thread, 512 16-bit ones
    assert nvme.io_alignment_elements(4, 1) == 256
    assert nvme.io_alignment_elements(4, 2) == 512
    assert nvme.io_alignment_elements(2, 1) == 512
    assert nvme.io_aligned_numel(1000, 4, 1) == 1024
    assert nvme.io_aligned_numel(1024, 4, 1) == 1024
    assert nvme.io_aligned_numel(1025, 4, 1) == 1280


def test_optimizer_swap_buffers():
    # 1e6 fp32 elements: 1e6 / 256 = 3906.25 -> 3907 x 256 = 1,000,192 elements, 4,000,768 B,
    # each pinned as the next power of two, 2^22 = 4,194,304 B: 4 buffers 16,777,216 B
    assert nvme.optimizer_swap_buffer_bytes(1_000_000, buffer_count=4, thread_count=1) \
        == 16_777_216


def test_param_swap_buffers():
    # buffer_size 1e8 16-bit elements: 1e8 / 512 = 195312.5 -> 195313 x 512 = 100,000,256;
    # one tensor of 5 buffers x 100,000,256 x 2 B = 1,000,002,560 B, pinned as 2^30 B
    assert nvme.param_swap_buffer_bytes(buffer_count=5, buffer_size=10**8, thread_count=1) \
        == 1_073_741_824


@pytest.mark.parametrize(("sub_groups", "read", "write", "needed"), [
    (0, True, True, 1),     # nothing swapped, but SwapBufferManager reads buffer 0
    (1, True, True, 4),     # no neighbour to overlap with: fp32, exp_avg, exp_avg_sq, grad
    (5, False, False, 4),
    (5, True, False, 8),    # + the next sub-group's read
    (5, False, True, 8),    # + the previous sub-group's write
    (2, True, True, 8),     # two sub-groups: only one neighbour at a time
    (3, True, True, 12),    # middle sub-group: previous write, own step, next read
])
def test_optimizer_buffers_needed(sub_groups, read, write, needed):
    assert nvme.optimizer_buffers_needed(sub_groups, pipeline_read=read,
                                         pipeline_write=write) == needed


def test_what_is_small_enough_to_stay_in_memory():
    # 1 MiB = 262,144 fp32 elements
    assert nvme.swappable(262_144, 4, 1_048_576)
    assert not nvme.swappable(262_143, 4, 1_048_576)
    assert not nvme.swappable(262_144, 4, 2 * 1_048_576)  # a larger aio.block_size raises it


def test_param_partition_must_be_smaller_than_a_buffer():
    assert not nvme.param_partition_fits(10**8, buffer_size=10**8, element_bytes=2,
                                         block_size=1_048_576)
    assert nvme.param_partition_fits(10**8 - 1, buffer_size=10**8, element_bytes=2,
                                     block_size=1_048_576)
    # 1000 x 2 B < 1 MiB: kept in host memory, no buffer needed
    assert nvme.param_partition_fits(1000, buffer_size=10, element_bytes=2,
                                     block_size=1_048_576)


def test_swapped_bytes_per_element():
    assert nvme.OPTIMIZER_SWAP_IN_BYTES_PER_ELEMENT == 16   # 4 fp32 tensors in
    assert nvme.OPTIMIZER_SWAP_OUT_BYTES_PER_ELEMENT == 12  # 3 fp32 tensors out
    assert nvme.GRADIENT_SWAP_OUT_BYTES_PER_ELEMENT == 4


# ------------------------------------------------------------------ the engine's NVMe tier

# A toy big enough to swap: DeepSpeed leaves tensors under 1 MiB in memory. Hidden 256,
# intermediate 1024, vocab 4096, 2 layers: embed and lm_head 4096 x 256 = 1048576 params each,
# a layer 2 x 256 + 4 x 65536 + 3 x 262144 = 1049088, the final norm 256: 4195584 in all.
WIDE = {"hidden_size": 256, "intermediate_size": 1024, "vocab_size": 4096}
WIDE_PARAMS = 4195584
# sub_group_size 2e6 closes group 0 at layer 0's down_proj (1048576 + 1049088 = 2097664) and
# group 1 at the last parameter (1049088 + 256 + 1048576 = 2097920); both are >= 1 MiB of fp32.
GROUPS = (2097664, 2097920)
READ_BPS, WRITE_BPS = 2e9, 1e9  # two toy drives


def nvme_run(zero: dict, gpus: int = 1):
    tree = deep_merge(toy_tree(gpus), {
        "model": WIDE, "hardware": {"nvme": dict(TOY_NVME)},
        "deepspeed": {"zero_optimization": deep_merge(
            {"sub_group_size": 2e6, **NVME_OPT}, zero)}})
    return zerosim.simulate(scenario_from_dict(tree, source="wide.yaml"))


def _io(result, stream: str, phase: str | None = None):
    spans = result.spans
    chosen = spans[(spans.stream == stream) & (spans["rank"] == 0)]
    if phase is not None:
        chosen = chosen[chosen.phase == phase]
    return chosen.sort_values("start_s", kind="stable").reset_index(drop=True)


def _state_writes(result):
    """The step's writes of sub-group state (not the boundary gradients' last buffer, which
    the step writes first)."""
    writes = _io(result, "nvme.write", "update")
    return writes[writes.op.str.startswith("swap out sub-group")].reset_index(drop=True)


def test_optimizer_on_nvme_swaps_each_sub_group_in_then_out():
    """No pipelining: read sub-group g (16 B/element at 2 GB/s), step it, write it back
    (12 B/element at 1 GB/s), then read the next one."""
    result = nvme_run({})
    reads, writes = _io(result, "nvme.read", "update"), _state_writes(result)
    assert list(reads.op) == ["swap in sub-group 0", "swap in sub-group 1"]
    assert list(writes.op) == ["swap out sub-group 0", "swap out sub-group 1"]
    assert list(reads.bytes) == [16 * n for n in GROUPS]
    assert list(writes.bytes) == [12 * n for n in GROUPS]
    assert list(reads.end_s - reads.start_s) == pytest.approx(
        [16 * n / READ_BPS for n in GROUPS], rel=1e-9)
    assert list(writes.end_s - writes.start_s) == pytest.approx(
        [12 * n / WRITE_BPS for n in GROUPS], rel=1e-9)
    assert reads.start_s[1] == pytest.approx(writes.end_s[0], rel=1e-12)
    update = result.phases.set_index("phase").loc["update"]
    assert update.end_s == pytest.approx(writes.end_s[1], rel=1e-12)
    adam = result.spans[result.spans.op == "cpu adam sub-group 0"].iloc[0]
    assert reads.end_s[0] <= adam.start_s and adam.end_s <= writes.start_s[0]


def test_pipeline_read_reads_the_next_sub_group_while_this_one_steps():
    result = nvme_run({"offload_optimizer": {"pipeline_read": True, "buffer_count": 8}})
    reads = _io(result, "nvme.read", "update")
    # sub-group 1's read is issued as soon as sub-group 0's read is done
    assert reads.start_s[1] == pytest.approx(reads.end_s[0], rel=1e-12)


def test_pipeline_write_leaves_the_write_in_flight_until_the_next_swap_out():
    result = nvme_run({"offload_optimizer": {"pipeline_write": True, "buffer_count": 8}})
    reads, writes = _io(result, "nvme.read", "update"), _state_writes(result)
    # the read of sub-group 1 overlaps the write of sub-group 0, sharing the drives' time: both
    # at x with x / 2 GB/s + x / 1 GB/s = 1 (x = 2/3 GB/s) until the write's 12 g0 bytes are
    # done, then the read's rest alone at 2 GB/s
    assert reads.start_s[1] == pytest.approx(writes.start_s[0], rel=1e-12)
    shared = 12 * GROUPS[0] / (2 / 3 * 1e9)
    assert writes.end_s[0] - writes.start_s[0] == pytest.approx(shared, rel=1e-9)
    assert reads.end_s[1] - writes.end_s[0] == pytest.approx(
        (16 * GROUPS[1] - 12 * GROUPS[0]) / READ_BPS, rel=1e-9)
    # the write of sub-group 1 waits for the write of sub-group 0
    assert writes.start_s[1] >= writes.end_s[0]


def test_too_few_swap_buffers_for_pipelining_are_refused_as_deepspeed_does():
    with pytest.raises(ScenarioError, match="at least 8"):
        nvme_run({"offload_optimizer": {"pipeline_read": True}})


def test_nvme_traffic_is_conserved():
    """Over an iteration every swapped element is read once (16 B) and written once in the
    step (12 B) and once as a boundary gradient (4 B, each gradient I/O-aligned in its swap
    buffer); DP=2 halves each rank's share."""
    for gpus in (1, 2):
        result = nvme_run({"offload_optimizer": {"pipeline_read": True,
                                                 "pipeline_write": True,
                                                 "buffer_count": 12}}, gpus=gpus)
        spans = result.spans
        partition = sum(-(-n // gpus) for n in _wide_param_numels())
        for rank in range(gpus):
            mine = spans[spans["rank"] == rank]
            assert mine[mine.stream == "nvme.read"].bytes.sum() == 16 * partition
            writes = mine[mine.stream == "nvme.write"]
            grads = writes.op.str.startswith("swap out grads")
            assert writes[~grads].bytes.sum() == 12 * partition
            assert writes[grads].bytes.sum() == 4 * sum(
                nvme.io_aligned_numel(-(-n // gpus), 4, thread_count=1)
                for n in _wide_param_numels())
        assert result.summary["status"] == "ok"


def _wide_param_numels() -> list[int]:
    from zerosim.models import ModelSpec, Workload, build_modules

    spec = ModelSpec(name="wide", family="llama", hidden_size=256, num_hidden_layers=2,
                     intermediate_size=1024, num_attention_heads=4, num_key_value_heads=4,
                     vocab_size=4096)
    modules = build_modules(spec, Workload(sequence_length=8, micro_batch_size=1,
                                           attention="eager", activation_checkpointing=False,
                                           dtype_bytes=2))
    numels = [n for m in modules for n in m.param_numels]
    assert sum(numels) == WIDE_PARAMS
    return numels


def test_parameters_on_nvme_are_read_before_their_fetch_and_written_after_the_step():
    """max_in_cpu 0: every 16-bit partition of at least 1 MiB (524288 elements) lives on NVMe:
    embed_tokens and lm_head (1048576 each). Each forward fetch of one reads 2 MiB at 2 GB/s;
    after the step the cast values of each sub-group's part go back (2 B/element)."""
    result = nvme_run(NVME_PARAM | {"offload_param": {"device": "nvme",
                                                      "nvme_path": "/local_nvme",
                                                      "max_in_cpu": 0,
                                                      "pin_memory": True}})
    reads = _io(result, "nvme.read", "forward")
    assert list(reads.op) == ["swap in embed_tokens", "swap in lm_head"]
    assert list(reads.end_s - reads.start_s) == pytest.approx([2 * 1048576 / READ_BPS] * 2,
                                                               rel=1e-9)
    fetch = _io(result, "pcie.h2d", "forward")
    assert fetch.op[0] == "fetch embed_tokens (pinned)"
    assert fetch.start_s[0] == pytest.approx(reads.end_s[0], rel=1e-12)
    writes = _io(result, "nvme.write", "update")
    params_out = writes[writes.op.str.startswith("swap out params")]
    assert list(params_out.bytes) == [2 * 1048576, 2 * 1048576]
    memory = result.memory
    on_nvme = memory[(memory.device == "nvme0") & (memory.category == "params 16-bit")]
    assert on_nvme.bytes.max() == 2 * 2 * 1048576


def test_gradient_buffers_fill_submit_and_wait_as_deepspeed_does():
    """async_swapper.py: a gradient that does not fit submits the current buffer and takes a
    free one; with none free the host waits for every write, which frees them all. Buffers of
    1024 elements, I/O-aligned to 256 (1024 B x 1 thread / 4 B)."""
    buffers = nvme.GradientSwapBuffers(2, 1024, thread_count=1)
    assert buffers.insert(512) == (0, False)     # buffer 1 taken
    assert buffers.insert(512) == (0, False)     # and filled
    assert buffers.insert(200) == (1024, False)  # no room: buffer 1 written, buffer 2 taken
    assert buffers.insert(1000) == (256, True)   # 1024 aligned: buffer 2 written, none free:
    #                                              wait, then both are free and one is filled
    assert buffers.insert(1) == (1024, False)    # no room: it is written, the other taken
    assert buffers.release() == 256              # the step writes the partly filled one
    with pytest.raises(ValueError, match="exceeds a swap buffer"):
        buffers.insert(1025)


def test_full_gradient_buffers_hold_the_backward_until_every_write_is_done():
    """sub_group_size 5e5: each swap buffer holds the largest sub-group (the embedding's,
    1048576 elements), four of them. The layers' gradients fill all four, so the embedding's,
    the last, is copied only once every gradient write in flight has finished."""
    result = nvme_run({"sub_group_size": 5e5, "offload_optimizer": {"buffer_count": 4}})
    spans = result.spans[result.spans["rank"] == 0]
    writes = spans[(spans.stream == "nvme.write") & (spans.phase == "backward")]
    assert len(writes) == 4 and writes.op.str.startswith("swap out grads").all()
    copy = spans[spans.op == "fp32 grad embed_tokens (pinned)"].iloc[0]
    # its fp32 cast was made with the rest of its bucket: the copy starts as the writes end
    assert copy.start_s == pytest.approx(writes.end_s.max(), rel=1e-12)
    assert copy.start_s - writes.start_s.min() >= writes.bytes.sum() / WRITE_BPS


def test_a_bucket_keeps_its_fp32_gradients_on_the_gpu_until_it_swaps_them_out():
    """stage3.py `partition_grads`: each swapped gradient is cast to fp32 on the GPU
    (`grad_buffer.float()`) and kept in `offload_fp32_gradients` until the bucket's last one;
    then `swap_out_gradients` copies them into the swap buffers and they are freed. DP=1,
    one bucket (the default 5e8 holds all 4195584 gradients): at the embedding's cast, the
    last, the GPU holds the bucket's reduce-scatter buffer (2 B each), every other fp32 cast
    (4 B each) and the embedding's 16-bit copy with its fp64 copy for the norm ((2 + 8) B x
    1048576, `_constant_buffered_norm2`); no copy to a swap buffer starts before it."""
    result = nvme_run({})
    memory = result.memory
    partitions = memory[(memory.device == "gpu0") & (memory.category == "grad partitions")]
    assert partitions.bytes.max() == 6 * WIDE_PARAMS + (2 + 8 - 4) * 1048576
    spans = result.spans[(result.spans["rank"] == 0) & (result.spans.phase == "backward")]
    last_in = spans[spans.op == "accum → GPU embed_tokens (pinned)"].end_s.iloc[0]
    swap_copies = spans[spans.op.str.startswith("fp32 grad")]
    assert len(swap_copies) == 21 and swap_copies.start_s.min() > last_in


@pytest.mark.parametrize(("buffers", "head_in_first_prefetch"), [(1, False), (2, True)])
def test_a_prefetch_stops_at_a_partition_on_nvme_without_a_free_swap_buffer(
        buffers, head_in_first_prefetch):
    """max_in_cpu 0 puts embed_tokens and lm_head on NVMe. The embedding's hook fetches it
    (one swap buffer) and prefetches the rest of the model in one call; with one buffer that
    call stops before lm_head, which waits for the embedding's buffer (DeepSpeed's prefetch
    breaks at a partition still on NVMe, to keep the trace's order); with two it takes it."""
    result = nvme_run(NVME_PARAM | {"stage3_max_reuse_distance": 0, "offload_param": {
        "device": "nvme", "nvme_path": "/local_nvme", "max_in_cpu": 0, "pin_memory": True,
        "buffer_count": buffers}}, gpus=2)
    gathers = _io(result, "allgather", "forward")
    calls = list(gathers[gathers.op_kind == "all_gather"].op)
    assert calls[0] == "all-gather embed_tokens"
    assert calls[1].startswith("all-gather layers.0.input_layernorm + ")
    assert calls[1].endswith(" + lm_head") == head_in_first_prefetch


def test_swap_buffers_are_pinned_as_pytorch_pins_them():
    """Every swap buffer goes through `pin_memory()`, so PyTorch's caching host allocator pins
    the next power of two. The optimizer's: 4 buffers of the largest swapped sub-group
    (2097920 fp32, already aligned: 8,391,680 B), 2^24 B each. The parameters': one tensor of
    5 x 100,000,256 16-bit elements, 2^30 B. The swap-out pool: the sub-group with the most
    partition elements (group 1) at its parameters' whole sizes, each aligned to 512
    elements (the three 256-element norms take 512): 3 x 512 + 4 x 65536 + 3 x 262144 +
    1048576 = 2,098,688 elements, 4,197,376 B, pinned as 2^23 B."""
    result = nvme_run(NVME_PARAM | {"offload_param": {"device": "nvme",
                                                      "nvme_path": "/local_nvme",
                                                      "max_in_cpu": 0,
                                                      "pin_memory": True}})
    memory = result.memory
    start = memory[(memory.device == "host0") & (memory.t_s == 0)]
    swap = start[start.category == "swap buffers (pinned)"].bytes.iloc[-1]
    assert swap == 4 * 2**24 + 2**30 + 2**23


def test_a_leaf_takes_a_swap_buffer_per_tensor_and_fewer_than_its_tensors_are_refused():
    """The whole model one ZeRO-3 leaf (`leaf_module.names: [""]`, DeepSpeed 0.19.5): its hook
    swaps in the embedding and the LM head, both on NVMe, at once, a buffer each; with one
    buffer DeepSpeed's swapper asserts 'Not enough buffers', so the configuration is refused."""
    from zerosim.engine.plan import plan_of

    def wide(buffers):
        tree = deep_merge(toy_tree(), {
            "model": WIDE, "hardware": {"nvme": dict(TOY_NVME)},
            "runtime": {"deepspeed_version": "0.19.5"},
            "deepspeed": {"zero_optimization": {
                "sub_group_size": 2e6, **NVME_OPT, "leaf_module": {"names": [""]},
                "offload_param": {"device": "nvme", "nvme_path": "/local_nvme", "max_in_cpu": 0,
                                  "pin_memory": True, "buffer_count": buffers}}}})
        return scenario_from_dict(tree, source="wide.yaml")

    plan = plan_of(wide(2))
    assert list(plan.leaves) == [0] and plan.nvme_tensors(0) == 2
    assert zerosim.simulate(wide(2)).summary["status"] == "ok"
    with pytest.raises(UnsupportedConfigError, match=r"offload_param\.buffer_count: expected at "
                       r"least 2, the tensors on NVMe of the widest ZeRO-3 leaf"):
        wide(1)
