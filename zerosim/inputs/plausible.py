"""The plausible range of every number and text zerosim reads, in one table.

A value outside its key's range is refused with the range, not simulated: a range is wide
enough for any real machine, model or DeepSpeed config (the largest known values times a
margin), and narrow enough that the simulation stays finite and quick enough to finish (no
1e30-layer model, no 1e-300 GB/s link, no infinity). Booleans are never numbers here
(`stage: true` is refused, not read as 1), and NaN and infinities are never plausible.

Keys are dotted paths as they appear in a scenario: `deepspeed.` for ds_config keys (inline
or from a file), `model.` for Hugging Face config fields, `hardware.` for profile keys (inline,
from a file or a catalog profile, overridden or not). A key of the table may end in a `*`
pattern (`hardware.*_GBps`): keys without their own row take the first pattern that matches,
so a profile key added later is bounded by its unit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from functools import lru_cache
from typing import Any

from zerosim.errors import Described, ScenarioError


@dataclass(frozen=True)
class Plausible:
    """The plausible range [low, high] of a key's value, and what the value is."""

    low: float
    high: float
    what: str
    whole: bool = False  # a count: an integer

    def expected(self) -> str:
        return f"{self.what} in [{_number_text(self.low)}, {_number_text(self.high)}]"


FOLDER_NAME_MAX_BYTES = 230
"""The longest folder name zerosim writes an output to, in UTF-8 bytes: the 255 a file name
may have on Linux and macOS, less the `.zerosim-staging-` prefix and the 8 hex digits of the
temporary folder written beside it (`results.folders`)."""


@dataclass(frozen=True)
class PlausibleText:
    """The longest plausible text of a key, and whether it must be usable as a folder name."""

    max_chars: int
    folder_name: bool = False

    def expected(self) -> str:
        base = f"a text of 1 to {self.max_chars} characters"
        if self.folder_name:
            return (f"{base} usable as a folder name (at most {FOLDER_NAME_MAX_BYTES} bytes in "
                    "UTF-8, no '/', '\\' or control characters, not starting with '.')")
        return base


def _count(low: float, high: float, what: str) -> Plausible:
    return Plausible(low, high, what, whole=True)


ELEMENTS = "a number of elements"
ELEMENTS_MAX = 1e15      # 1000x the parameters of the largest published dense model
GBPS = (1e-3, 1e9)       # 1 MB/s .. 1 EB/s (tests use 1e6 GB/s for "never binds")
MICROSECONDS = (0, 1e7)  # up to 10 s

PLAUSIBLE: dict[str, Plausible | PlausibleText] = {
    # ---- the scenario's own keys
    "name": PlausibleText(128, folder_name=True),
    "description": PlausibleText(10_000),
    "sequence_length": _count(1, 1e8, "a sequence length in tokens"),
    "document_length": _count(1, 1e8, "a packed document's length in tokens"),
    "data_parallel": _count(1, 1e6, "a rank count"),
    "runtime.cpu_threads_per_rank": _count(1, 16_384, "a thread count"),
    "runtime.tiled_mlp_shards": _count(1, 4_096, "a slice count"),
    "runtime.tiled_loss_shards": _count(1, 4_096, "a slice count"),
    "what_if.gpu_update_every": _count(0, 1e6, "a sub-group interval"),
    # ---- Hugging Face config.json fields
    "model.name": PlausibleText(256),
    "model.hidden_size": _count(1, 2**20, "a hidden size"),
    "model.num_hidden_layers": _count(1, 10_000, "a layer count"),
    "model.intermediate_size": _count(1, 2**22, "an MLP size"),
    "model.num_attention_heads": _count(1, 2**16, "a head count"),
    "model.num_key_value_heads": _count(1, 2**16, "a head count"),
    "model.vocab_size": _count(1, 2**24, "a vocabulary size"),
    "model.max_position_embeddings": _count(1, 2**32, "a position count"),
    "model.num_kv_heads": _count(1, 2**16, "a head count"),
    "model.head_dim": _count(0, 2**16, "a head size (0: hidden_size / heads)"),
    "model.word_embed_proj_dim": _count(0, 2**20, "a hidden size (0: hidden_size)"),
    "model.num_experts": _count(1, 4096, "an expert count"),
    "model.num_local_experts": _count(1, 4096, "an expert count"),
    "model.n_routed_experts": _count(1, 4096, "an expert count"),
    "model.n_shared_experts": _count(0, 4096, "an expert count"),
    "model.num_experts_per_tok": _count(1, 4096, "an expert count"),
    "model.moe_layer_freq": _count(1, 10_000, "a layer interval"),
    "model.decoder_sparse_step": _count(1, 10_000, "a layer interval"),
    "model.*_size": _count(0, 2**22, "a size"),
    "model.*_dim": _count(0, 2**22, "a size"),
    # ---- ds_config keys
    "deepspeed.train_micro_batch_size_per_gpu": _count(1, 1e6, "a micro-batch size"),
    "deepspeed.gradient_accumulation_steps": _count(1, 65_536, "a micro-batch count"),
    "deepspeed.train_batch_size": _count(1, 1e12, "a batch size"),
    "deepspeed.gradient_clipping": Plausible(0, 1e12, "a gradient norm"),
    "deepspeed.zero_optimization.stage": _count(0, 3, "a ZeRO stage"),
    "deepspeed.zero_optimization.reduce_bucket_size": Plausible(1, ELEMENTS_MAX, ELEMENTS),
    "deepspeed.zero_optimization.allgather_bucket_size": Plausible(1, ELEMENTS_MAX, ELEMENTS),
    "deepspeed.zero_optimization.sub_group_size": Plausible(1, ELEMENTS_MAX, ELEMENTS),
    "deepspeed.zero_optimization.stage3_prefetch_bucket_size":
        Plausible(0, ELEMENTS_MAX, ELEMENTS),
    "deepspeed.zero_optimization.stage3_max_live_parameters":
        Plausible(0, ELEMENTS_MAX, ELEMENTS),
    "deepspeed.zero_optimization.stage3_max_reuse_distance":
        Plausible(0, ELEMENTS_MAX, ELEMENTS),
    "deepspeed.zero_optimization.stage3_param_persistence_threshold":
        Plausible(0, ELEMENTS_MAX, ELEMENTS),
    "deepspeed.zero_optimization.offload_optimizer.ratio": Plausible(0, 1, "a fraction"),
    "deepspeed.zero_optimization.offload_optimizer.cpuadam_cores_perc":
        Plausible(0, 1, "a fraction"),
    "deepspeed.zero_optimization.offload_optimizer.buffer_count":
        _count(0, 1e6, "a buffer count"),
    "deepspeed.zero_optimization.offload_param.buffer_count": _count(0, 1e6, "a buffer count"),
    "deepspeed.zero_optimization.offload_param.buffer_size": _count(0, ELEMENTS_MAX, ELEMENTS),
    "deepspeed.zero_optimization.offload_param.max_in_cpu": _count(0, ELEMENTS_MAX, ELEMENTS),
    "deepspeed.zero_optimization.zero_hpz_partition_size": _count(0, 1e6, "a rank count"),
    "deepspeed.zero_optimization.mics_shard_size": _count(-1, 1e6,
                                                          "a rank count (-1 or 0: off)"),
    "deepspeed.sequence_parallel_size": _count(1, 1e6, "a rank count"),
    "deepspeed.zero_optimization.zeropp_loco_param.err_beta": Plausible(0, 1, "a fraction"),
    "deepspeed.zero_optimization.zeropp_loco_param.reset_T": _count(0, 1e12, "a step count"),
    "deepspeed.aio.block_size": _count(1, 2**40, "a block size in bytes"),
    "deepspeed.aio.queue_depth": _count(1, 1e6, "a queue depth"),
    "deepspeed.aio.thread_count": _count(1, 16_384, "a thread count"),
    # ---- Hugging Face Trainer arguments that fill "auto"
    "trainer.per_device_train_batch_size": _count(1, 1e6, "a micro-batch size"),
    "trainer.gradient_accumulation_steps": _count(1, 65_536, "a micro-batch count"),
    "trainer.max_grad_norm": Plausible(0, 1e12, "a gradient norm"),
    # ---- software-stack keys (zerosim/stacks)
    "stack.host.reference_GHz": Plausible(1e-3, 100, "a clock in GHz"),
    "stack.host.*_us": Plausible(*MICROSECONDS, "a time in microseconds"),
    "stack.host.*_ms": Plausible(0, 1e5, "a time in milliseconds"),
    "stack.host.*_ns": Plausible(0, 1e6, "a time in nanoseconds"),
    "stack.host.leaf_hook_share": Plausible(0, 1, "a share of a module's hook time"),
    "stack.host.repeat_hook_share": Plausible(0, 1, "a share of a module's hook time"),
    "stack.kernels.backward_bytes_factor": Plausible(0, 1e3, "a factor"),
    "stack.kernels.*.kernels": _count(0, 10_000, "a kernel count"),
    "stack.attention_memory.*": Plausible(0, 64, "bytes per attention score"),
    "stack.allocator.heap_reuse_MiB": Plausible(0, 1024**2, "a size in MiB"),
    "stack.processes.rank_resident_GiB": Plausible(0, 1e4, "a memory size in GiB"),
    "stack.processes.gc_objects": Plausible(0, 1e10, "an object count"),
    "stack.processes.gc_objects_per_tensor": Plausible(0, 1e7, "an object count"),
    "stack.processes.gc_objects_per_zero3_tensor": Plausible(0, 1e7, "an object count"),
    # ---- hardware profile keys
    "hardware.description": PlausibleText(10_000),
    "hardware.alternative": PlausibleText(64),
    "hardware.nodes": _count(1, 1e6, "a node count"),
    "hardware.gpu.per_node": _count(1, 1024, "a GPU count"),
    "hardware.host.sockets": _count(1, 1024, "a socket count"),
    "hardware.host.cores_per_socket": _count(1, 1e5, "a core count"),
    "hardware.host.threads_per_core": _count(1, 64, "a thread count"),
    "hardware.host.numa_domains": _count(1, 1024, "a NUMA domain count"),
    "hardware.network.nics_per_node": _count(1, 1024, "a NIC count"),
    "hardware.pcie.gpus_per_switch": _count(1, 1024, "a GPU count"),
    "hardware.nvme.drives_per_node": _count(0, 1024, "a drive count"),
    "hardware.gpu.hbm_GiB": Plausible(1e-3, 1e6, "a memory size in GiB"),
    "hardware.gpu.peak_16bit_TFLOPS": Plausible(1e-3, 1e7, "a throughput in TFLOP/s"),
    "hardware.gpu.runtime_context_GiB": Plausible(0, 1e6, "a memory size in GiB"),
    "hardware.host.memory_GiB": Plausible(1e-3, 1e8, "a memory size in GiB"),
    "hardware.host.os_resident_GiB": Plausible(0, 1e5, "a memory size in GiB"),
    "hardware.host.dma_memory_weight": Plausible(1e-4, 1e4, "a weight"),
    "hardware.host.remote_access_cost": Plausible(1, 100, "a cost factor"),
    "hardware.host.socket_link_total_GBps": Plausible(0, GBPS[1], "a bandwidth in GB/s "
                                                      "(0: no shared limit)"),
    "hardware.nvme.capacity_GiB_per_drive": Plausible(1e-3, 1e8, "a capacity in GiB"),
    "hardware.cpu.adam_params_per_s_per_thread": Plausible(1, 1e13, "a rate in params/s"),
    "hardware.cpu.adam_fp16_params_per_s_per_thread": Plausible(1, 1e13, "a rate in params/s"),
    "hardware.cpu.adam_fp16_states_params_per_s_per_thread": Plausible(1, 1e13,
                                                                        "a rate in params/s"),
    "hardware.cpu.adam_bf16_params_per_s_per_thread": Plausible(1, 1e13, "a rate in params/s"),
    "hardware.cpu.adam_bf16_states_params_per_s_per_thread": Plausible(1, 1e13,
                                                                       "a rate in params/s"),
    "hardware.cpu.fp16_check_elements_per_s_per_thread": Plausible(1, 1e13,
                                                                  "a rate in elements/s"),
    "hardware.cpu.cast_threads": Plausible(1e-3, 1e6, "an effective thread count"),
    "hardware.cpu.oversubscription_penalty": Plausible(0, 1e4, "a penalty factor"),
    "hardware.cpu.oversubscribed_region_ms": Plausible(0, 1e3, "milliseconds per region"),
    "hardware.cpu.page_zeroing_contention": Plausible(0, 100, "a contention factor per thread"),
    "hardware.*.source": PlausibleText(4000),
    "hardware.*_efficiency": Plausible(1e-4, 1, "a fraction"),
    "hardware.*GBps*": Plausible(*GBPS, "a bandwidth in GB/s"),
    "hardware.*_us": Plausible(*MICROSECONDS, "a time in microseconds"),
    "hardware.*_GiB*": Plausible(0, 1e8, "a memory size in GiB"),
    "hardware.*TFLOPS*": Plausible(1e-3, 1e7, "a throughput in TFLOP/s"),
    "hardware.gpu.sm_count": _count(1, 100_000, "a multiprocessor count"),
    "hardware.gpu.gemm_tile_*": _count(1, 65_536, "a tile size"),
    "hardware.gpu.gemm_k_overhead": Plausible(0, 1e5, "a number of K elements"),
    "hardware.*GHz*": Plausible(1e-3, 100, "a clock in GHz"),
    "hardware.*name": PlausibleText(256),
    "hardware.host.cpu_model": PlausibleText(256),
    "hardware.*": Plausible(-1e15, 1e15, "a number"),
    "model.*": _count(0, 2**32, "a count"),
}
"""key (or `*` pattern) -> its plausible range. Patterns come after every exact key."""


RULES_KEPT = 4096
"""Keys whose row `rule_for` remembers (a scenario checks about a hundred, every load)."""


@lru_cache(maxsize=RULES_KEPT)
def rule_for(key: str) -> Plausible | PlausibleText | None:
    """The row of `key`: its own, else the first pattern that matches, else none (a pure
    function of the key: the table is a constant)."""
    rule = PLAUSIBLE.get(key)
    if rule is not None:
        return rule
    for pattern, candidate in PLAUSIBLE.items():
        if "*" in pattern and fnmatchcase(key, pattern):
            return candidate
    return None


def check_plausible(key: str, value: Any, *, source: str, key_path: str) -> None:
    """Refuse `value` if it is outside the plausible range of `key` (a table key)."""
    rule = rule_for(key)
    if isinstance(rule, Plausible):
        _check_number(rule, value, source, key_path)
    elif isinstance(rule, PlausibleText):
        _check_text(rule, value, source, key_path)


def check_section(tree: Any, *, prefix: str, source: str, key_prefix: str = "") -> None:
    """Check every value of a mapping that has a row in the table under `prefix`.

    `prefix` is where the mapping sits in a scenario (`deepspeed.`); `key_prefix` what errors
    put before a key (the same for a ds_config, empty for a file named on its own).
    """
    if not isinstance(tree, Mapping):
        return
    for key, value in _leaves(tree):
        check_plausible(prefix + key, value, source=source, key_path=key_prefix + key)


def _leaves(tree: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    leaves: list[tuple[str, Any]] = []
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            leaves.extend(_leaves(value, f"{path}."))
        else:
            leaves.append((path, value))
    return leaves


def _check_number(rule: Plausible, value: Any, source: str, key_path: str) -> None:
    if isinstance(value, bool):
        raise ScenarioError(source, key_path, f"{rule.expected()} (a number, not true/false)",
                            value)
    if not isinstance(value, int | float):
        return  # a text or a mapping: the section's own validation names the type
    if isinstance(value, float) and not math.isfinite(value):
        raise ScenarioError(source, key_path, f"{rule.expected()} (a finite number)", value)
    if not rule.low <= value <= rule.high:
        raise ScenarioError(source, key_path, rule.expected(), value)


def _check_text(rule: PlausibleText, value: Any, source: str, key_path: str) -> None:
    if not isinstance(value, str):
        return
    if not value or len(value) > rule.max_chars:
        raise ScenarioError(source, key_path, rule.expected(),
                            Described(f"a text of {len(value)} characters"))
    if rule.folder_name and len(value.encode()) > FOLDER_NAME_MAX_BYTES:
        raise ScenarioError(source, key_path, rule.expected(),
                            Described(f"a text of {len(value.encode())} bytes in UTF-8"))
    if rule.folder_name and not _usable_folder_name(value):
        raise ScenarioError(source, key_path, rule.expected(), value)


def _usable_folder_name(text: str) -> bool:
    return (not text.startswith(".") and "/" not in text and "\\" not in text
            and all(ch.isprintable() for ch in text))


def _number_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e7 else f"{value:g}"
