"""Hardware profiles: YAML files with units in key names and a provenance for every number.

A profile leaf that is a physical quantity is written `{value: X, basis: B, source: "..."}`
where B is `spec` (vendor datasheet), `measured` (a published or own measurement), `fitted`
(written by `zerosim calibrate`), `assumed` (a stated estimate awaiting a fit) or `override`
(patched by a scenario). Values are converted to bytes, seconds and FLOP/s once, here.

A profile that names its CPU (`host.cpu_model`, a model of `zerosim/hardware/cpus.yaml`) may
leave out what the model supplies (`zerosim.hardware.cpus`): CPU Adam's per-thread ceiling (basis
`derived`, the formula in its source), the host path's clock, the CPU's name and, where the
family has a testbed, its per-thread elementwise and page-zeroing rates. A value written wins.

Network keys: `network.nic_GBps` is the bandwidth of ONE network interface, per direction (a
100 Gb/s EFA or InfiniBand port is 12.5 GB/s each way); `network.nics_per_node` (a count,
optional, default 1) says how many a node has, so the node's inter-node bandwidth is
nics_per_node x nic_GBps per direction. `network.latency_us` is the latency of one step of an
inter-node ring, `nvlink.latency_us` that of one step within a node.

Within a node: `nvlink.bus_GBps` is the NCCL ring's bus bandwidth between the node's GPUs
over whatever carries it, which `intra_node.transport` names (default `nvlink`): NVLink, a
fabric apart from PCIe; `pcie_p2p`, peer-to-peer over PCIe, where the ring's bytes also leave
and enter each GPU over its own PCIe link, beside its host copies; `shm`, through host memory
(peer-to-peer off, as on GeForce cards), which adds a write and a read of each byte in the
host memory of the GPU's NUMA domain.

PCIe switches: `pcie.gpus_per_switch` GPUs (default 1: each on its own link to the CPU) share
one switch whose uplink to the CPU (`pcie.switch_uplink_GBps` per direction, by default the
pinned host-to-device rate) carries every byte they exchange with host memory: their copies,
a ring through host memory, and peer-to-peer bytes to GPUs under another switch.
"""

from __future__ import annotations

import copy
import functools
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from zerosim.errors import ScenarioError, ScenarioWarning
from zerosim.hardware import cpus
from zerosim.hardware.alternatives import SECTION as ALTERNATIVES
from zerosim.hardware.alternatives import STACK_PREFIX, Alternative, parse_alternatives
from zerosim.hardware.provenance import (
    BASES,
    DERIVED,
    Provenance,
    check_carried,
    parse_provenance,
    provenance_values,
)
from zerosim.inputs import check_plausible
from zerosim.units import GB, GHZ, MS, TFLOPS, US, GiB
from zerosim.vocabulary import PeerTransport
from zerosim.yamlio import flatten_nested, parse_yaml_text, read_yaml_file

__all__ = ["BASES", "DERIVED", "HardwareProfile", "Provenance", "load_profile",
           "parse_profile", "parse_provenance"]

PLACEMENTS = ("round_robin", "gpu_local", "interleaved")


@dataclass(frozen=True)
class HardwareProfile:
    """One node type (times `nodes`), in SI units. Built only by `load_profile`/`parse_profile`."""

    name: str
    description: str
    nodes: int
    gpus_per_node: int
    gpu_name: str
    gpu_numa_domain: tuple[int, ...]
    hbm_bytes: float
    hbm_Bps: float
    peak_16bit_flops: float
    sm_clock_fraction: float
    """The SM clock the GPU sustains in the run, as a fraction of the one its rates were
    measured at: a power cap or heat lowers it. What the SMs bound slows with it (GEMMs, fused
    attention, PyTorch's strided elementwise path and softmax); contiguous streams, bound by
    HBM, which has its own clock, do not."""
    sm_count: int
    gemm_efficiency: float
    gemm_tile_m: int
    gemm_tile_n: int
    gemm_k_overhead: float
    gemm_latency_s: float
    flash_attention_efficiency: float
    flash_attention_block_keys: float
    flash_attention_softmax_dims: float
    memory_efficiency: float
    gemm_memory_efficiency: float
    """Fraction of HBM peak a GEMM kernel streams its operands and output at where they, not
    its arithmetic, bound it (eager attention's short-K products): below `memory_efficiency`,
    a STREAM kernel's rate, on the H100 measured."""
    strided_memory_efficiency: float
    """Fraction of HBM peak PyTorch's 16-bit elementwise kernels reach when an operand is a
    strided or broadcast view (their non-vectorized path): below `memory_efficiency`."""
    softmax_memory_efficiency: float
    """Fraction of HBM peak PyTorch's softmax kernels (ATen's `cunn_SoftMax*`, one block a
    row) reach over the rows of attention scores: bound by each SM's work on its rows, not
    by HBM, below `memory_efficiency` on an H100."""
    kernel_gap_s: float
    runtime_context_bytes: float
    cuda_malloc_Bps: float
    """How fast `cudaMalloc` hands the host thread fresh device memory (the driver backing and
    mapping the pages while the thread waits), paid where the caching allocator has to grow."""
    h2d_pinned_Bps: float
    d2h_pinned_Bps: float
    h2d_pageable_Bps: float
    d2h_pageable_Bps: float
    pcie_latency_s: float
    gpus_per_switch: int
    """GPUs behind one PCIe switch, whose uplink to the CPU they share (1: none shared)."""
    switch_uplink_Bps: float
    nvlink_Bps: float
    nvlink_latency_s: float
    intra_node_transport: PeerTransport
    nic_Bps: float
    nics_per_node: int
    network_latency_s: float
    cpu_name: str
    cpu_model: str
    """The `zerosim/hardware/cpus.yaml` model the CPU values not written come from ('' none)."""
    cpu_boost_Hz: float
    sockets: int
    cores_per_socket: int
    threads_per_core: int
    numa_domains: int
    host_memory_bytes: float
    os_resident_bytes: float
    """Host memory the OS and the node's services hold whatever the training does (the
    kernel, its caches that cannot be reclaimed, daemons)."""
    memory_Bps_per_domain: float
    dma_memory_weight: float
    socket_link_Bps: float
    socket_link_total_Bps: float
    """What every DMA crossing between NUMA domains gets together, both directions counted
    (0: no shared limit, each direction carries `socket_link_Bps`)."""
    remote_access_cost: float
    rank_memory_placement: str
    adam_params_per_s_per_thread: float
    adam_bf16_params_per_s_per_thread: float
    """DeepSpeedCPUAdam's ceiling over bf16 params and gradients with fp32 moments."""
    adam_bf16_states_params_per_s_per_thread: float
    """The same with bf16 moments (`bf16.bf16_optimizer_states`)."""
    adam_fp16_params_per_s_per_thread: float
    """DeepSpeedCPUAdam's ceiling over fp16 params and gradients with fp32 moments
    (`fp16.fp16_master_weights_and_grads`)."""
    adam_fp16_states_params_per_s_per_thread: float
    """The same with fp16 moments (`optimizer.params.fp32_optimizer_states` off)."""
    fp16_check_elements_per_s_per_thread: float
    elementwise_Bps_per_thread: float
    page_zeroing_Bps: float
    page_zeroing_contention: float
    """How much each further thread of one process faulting pages in at once slows them all
    (the serialised share of the fault path): n threads zero n x `page_zeroing_Bps` /
    (1 + (n - 1) x this) together (0: they scale freely)."""
    cast_threads: float
    oversubscription_penalty: float
    oversubscribed_region_s: float
    """What each OpenMP parallel region of a rank loses while the node's pools oversubscribe
    its hardware threads, per extra pool's worth (0: nothing beyond the shared throughput)."""
    nvme_drives_per_node: int
    nvme_read_Bps_per_drive: float
    nvme_write_Bps_per_drive: float
    nvme_latency_s: float
    nvme_capacity_bytes_per_drive: float
    provenance: Mapping[str, Provenance] = field(repr=False, compare=False)
    observed: Mapping[str, Provenance] = field(repr=False, compare=False)
    alternatives: tuple[Alternative, ...] = field(default=(), repr=False, compare=False)
    """Other readings of the data behind the profile (`zerosim.hardware.alternatives`)."""
    alternative: str | None = None
    """The alternative whose values the profile runs with (`hardware.alternative`), if any."""

    @property
    def other_alternatives(self) -> tuple[Alternative, ...]:
        """Its alternatives other than the one it runs with."""
        return tuple(a for a in self.alternatives if a.name != self.alternative)

    @property
    def label(self) -> str:
        """'h100-jlse', or 'h100-jlse, alternative stream_host_memory'."""
        return self.name if self.alternative is None else (
            f"{self.name}, alternative {self.alternative}")

    def gpu_domain(self, gpu: int) -> int:
        """The NUMA domain GPU `gpu` (an index over every node) hangs off."""
        return self.gpu_numa_domain[gpu % self.gpus_per_node]

    @property
    def tensor_flops(self) -> float:
        """Dense 16-bit tensor-core peak at the clock the GPU sustains in the run."""
        return self.peak_16bit_flops * self.sm_clock_fraction

    @property
    def hardware_threads(self) -> int:
        return self.sockets * self.cores_per_socket * self.threads_per_core

    @property
    def physical_cores(self) -> int:
        return self.sockets * self.cores_per_socket

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def switch_of(self, gpu: int) -> int:
        """The PCIe switch (within its node) GPU `gpu` (an index over every node) sits behind."""
        return gpu % self.gpus_per_node // self.gpus_per_switch

    @property
    def node_network_Bps(self) -> float:
        """What one node's NICs carry together, per direction."""
        return self.nics_per_node * self.nic_Bps

    @property
    def has_nvme(self) -> bool:
        return self.nvme_drives_per_node > 0

    @property
    def nvme_bytes_per_node(self) -> float:
        return self.nvme_drives_per_node * self.nvme_capacity_bytes_per_drive


def _positive(x: float) -> bool:
    return x > 0


def _fraction(x: float) -> bool:
    return 0 < x <= 1


def _at_least_one(x: float) -> bool:
    return x >= 1


def _non_negative(x: float) -> bool:
    return x >= 0


# key path -> (dataclass field, scale to SI, check, expected-text)
Quantity = tuple[str, float, Callable[[float], bool], str]
QUANTITIES: dict[str, Quantity] = {
    "gpu.hbm_GiB": ("hbm_bytes", GiB, _positive, "a positive number of GiB"),
    "gpu.hbm_GBps": ("hbm_Bps", GB, _positive, "a positive bandwidth in GB/s"),
    "gpu.peak_16bit_TFLOPS": ("peak_16bit_flops", TFLOPS, _positive, "a positive TFLOP/s"),
    "gpu.sm_clock_fraction": ("sm_clock_fraction", 1.0, _fraction, "a fraction in (0, 1]"),
    "gpu.gemm_efficiency": ("gemm_efficiency", 1.0, _fraction, "a fraction in (0, 1]"),
    "gpu.gemm_k_overhead": ("gemm_k_overhead", 1.0, _non_negative,
                            "a number of K elements >= 0"),
    "gpu.gemm_latency_us": ("gemm_latency_s", US, _non_negative,
                            "a time >= 0 in microseconds"),
    "gpu.flash_attention_efficiency": ("flash_attention_efficiency", 1.0, _fraction,
                                       "a fraction in (0, 1]"),
    "gpu.flash_attention_block_keys": ("flash_attention_block_keys", 1.0, _non_negative,
                                       "a number of keys >= 0"),
    "gpu.flash_attention_softmax_dims": ("flash_attention_softmax_dims", 1.0, _non_negative,
                                         "a number of head dimensions >= 0"),
    "gpu.memory_efficiency": ("memory_efficiency", 1.0, _fraction, "a fraction in (0, 1]"),
    "gpu.gemm_memory_efficiency": ("gemm_memory_efficiency", 1.0, _fraction,
                                   "a fraction in (0, 1]"),
    "gpu.strided_memory_efficiency": ("strided_memory_efficiency", 1.0, _fraction,
                                      "a fraction in (0, 1]"),
    "gpu.softmax_memory_efficiency": ("softmax_memory_efficiency", 1.0, _fraction,
                                      "a fraction in (0, 1]"),
    "gpu.kernel_gap_us": ("kernel_gap_s", US, _non_negative, "a time >= 0 in microseconds"),
    "gpu.runtime_context_GiB": ("runtime_context_bytes", GiB, _non_negative, "GiB >= 0"),
    "gpu.cuda_malloc_GBps": ("cuda_malloc_Bps", GB, _positive,
                             "a positive rate in GB/s of fresh device memory"),
    "pcie.h2d_pinned_GBps": ("h2d_pinned_Bps", GB, _positive, "a positive bandwidth in GB/s"),
    "pcie.d2h_pinned_GBps": ("d2h_pinned_Bps", GB, _positive, "a positive bandwidth in GB/s"),
    "pcie.h2d_pageable_GBps": ("h2d_pageable_Bps", GB, _positive, "a positive bandwidth in GB/s"),
    "pcie.d2h_pageable_GBps": ("d2h_pageable_Bps", GB, _positive, "a positive bandwidth in GB/s"),
    "pcie.latency_us": ("pcie_latency_s", US, _non_negative, "a time >= 0 in microseconds"),
    "pcie.switch_uplink_GBps": ("switch_uplink_Bps", GB, _positive,
                                "a positive bandwidth in GB/s per direction"),
    "nvlink.bus_GBps": ("nvlink_Bps", GB, _positive, "a positive bandwidth in GB/s"),
    "nvlink.latency_us": ("nvlink_latency_s", US, _non_negative, "a time >= 0 in microseconds"),
    "network.nic_GBps": ("nic_Bps", GB, _positive,
                         "a positive bandwidth in GB/s per NIC per direction"),
    "network.latency_us": ("network_latency_s", US, _non_negative, "a time >= 0 in microseconds"),
    "host.memory_GiB": ("host_memory_bytes", GiB, _positive, "a positive number of GiB"),
    "host.os_resident_GiB": ("os_resident_bytes", GiB, _non_negative, "GiB >= 0"),
    "host.cpu_boost_GHz": ("cpu_boost_Hz", GHZ, _positive, "a positive clock in GHz"),
    "host.memory_GBps_per_domain": ("memory_Bps_per_domain", GB, _positive,
                                    "a positive bandwidth in GB/s"),
    "host.dma_memory_weight": ("dma_memory_weight", 1.0, _positive, "a positive weight"),
    "host.socket_link_GBps": ("socket_link_Bps", GB, _positive,
                              "a positive bandwidth in GB/s per direction"),
    "host.socket_link_total_GBps": ("socket_link_total_Bps", GB, _non_negative,
                                    "a bandwidth >= 0 in GB/s, both directions together "
                                    "(0: no shared limit)"),
    "host.remote_access_cost": ("remote_access_cost", 1.0, _at_least_one,
                                "a cost factor >= 1 (1: remote bytes cost what local ones do)"),
    "cpu.adam_params_per_s_per_thread": ("adam_params_per_s_per_thread", 1.0, _positive,
                                         "a positive rate in params/s"),
    "cpu.adam_bf16_params_per_s_per_thread": ("adam_bf16_params_per_s_per_thread", 1.0,
                                              _positive, "a positive rate in params/s"),
    "cpu.adam_bf16_states_params_per_s_per_thread": (
        "adam_bf16_states_params_per_s_per_thread", 1.0, _positive, "a positive rate in params/s"),
    "cpu.adam_fp16_params_per_s_per_thread": ("adam_fp16_params_per_s_per_thread", 1.0,
                                              _positive, "a positive rate in params/s"),
    "cpu.adam_fp16_states_params_per_s_per_thread": (
        "adam_fp16_states_params_per_s_per_thread", 1.0, _positive, "a positive rate in params/s"),
    "cpu.fp16_check_elements_per_s_per_thread": ("fp16_check_elements_per_s_per_thread", 1.0,
                                                 _positive, "a positive rate in elements/s"),
    "cpu.elementwise_GBps_per_thread": ("elementwise_Bps_per_thread", GB, _positive,
                                        "a positive bandwidth in GB/s"),
    "cpu.page_zeroing_GBps": ("page_zeroing_Bps", GB, _positive, "a positive bandwidth in GB/s"),
    "cpu.page_zeroing_contention": ("page_zeroing_contention", 1.0, _non_negative,
                                    "a number >= 0 (0: faulting threads scale freely)"),
    "cpu.cast_threads": ("cast_threads", 1.0, _positive, "a positive (effective) thread count"),
    "cpu.oversubscription_penalty": ("oversubscription_penalty", 1.0, _non_negative,
                                     "a number >= 0"),
    "cpu.oversubscribed_region_ms": ("oversubscribed_region_s", MS, _non_negative,
                                     "a time >= 0 in milliseconds"),
    "nvme.read_GBps_per_drive": ("nvme_read_Bps_per_drive", GB, _positive,
                                 "a positive bandwidth in GB/s"),
    "nvme.write_GBps_per_drive": ("nvme_write_Bps_per_drive", GB, _positive,
                                  "a positive bandwidth in GB/s"),
    "nvme.latency_us": ("nvme_latency_s", US, _non_negative, "a time >= 0 in microseconds"),
    "nvme.capacity_GiB_per_drive": ("nvme_capacity_bytes_per_drive", GiB, _positive,
                                    "a positive number of GiB"),
}
FRACTION_KEYS = frozenset(k for k, (_, _, check, _) in QUANTITIES.items() if check is _fraction)
"""Quantities that are fractions in (0, 1]: a fit or a step may not take them past 1."""
AT_LEAST_ONE_KEYS = frozenset(k for k, (_, _, check, _) in QUANTITIES.items()
                              if check is _at_least_one)
"""Quantities of at least 1 (a cost factor): a fit or a step may not take them below 1."""
CAPACITY_KEYS = frozenset({"gpu.hbm_GiB", "gpu.runtime_context_GiB", "host.memory_GiB",
                           "host.os_resident_GiB", "nvme.capacity_GiB_per_drive"})
"""Quantities that decide whether a configuration fits, not how long it takes: no time moves
with them (`zerosim sensitivity` leaves them out, `zerosim calibrate` refuses to fit them)."""
COUNTS = {
    "nodes": "nodes",
    "gpu.per_node": "gpus_per_node",
    "gpu.sm_count": "sm_count",
    "gpu.gemm_tile_m": "gemm_tile_m",
    "gpu.gemm_tile_n": "gemm_tile_n",
    "host.sockets": "sockets",
    "host.cores_per_socket": "cores_per_socket",
    "host.threads_per_core": "threads_per_core",
    "host.numa_domains": "numa_domains",
    "network.nics_per_node": "nics_per_node",
    "pcie.gpus_per_switch": "gpus_per_switch",
}
OPTIONAL_COUNTS = {"nvme.drives_per_node": "nvme_drives_per_node"}
"""Counts that may be 0 (a node without that hardware)."""
TEXTS = {"name": "name", "description": "description", "gpu.name": "gpu_name",
         "host.cpu_name": "cpu_name", "host.cpu_model": "cpu_model"}
CHOICES = {"host.rank_memory_placement": ("rank_memory_placement", PLACEMENTS),
           "intra_node.transport": ("intra_node_transport", tuple(PeerTransport))}
OTHER_KEYS = {"gpu.numa_domain", "pcie.generation", "observed", ALTERNATIVES}
WHOLE_SECTIONS = ("observed", ALTERNATIVES)
"""Sections read whole, not walked key by key."""
GEN4_NVME = "a typical PCIe Gen4 x4 datacenter NVMe drive"


@dataclass(frozen=True)
class CarriedDefault:
    """A default that is a shipped profile's own value for the key (`carried_from` it)."""

    origin: str

    def leaf(self, key: str, why: str, profile_name: Any) -> dict[str, Any]:
        leaf = {"value": _builtin_values(self.origin)[key], "basis": "assumed",
                "source": f"default: {why}"}
        if profile_name != self.origin:
            leaf["carried_from"] = self.origin
        return leaf


@dataclass(frozen=True)
class CatalogDefault:
    """A default the CPU catalog (`cpus.yaml`) computes, read when a profile needs it."""

    read: Callable[[], float]

    def leaf(self, key: str, why: str, profile_name: Any) -> dict[str, Any]:
        return {"value": self.read(), "basis": "assumed", "source": f"default: {why}"}


DEFAULTS: dict[str, tuple[Any, str]] = {
    "gpu.gemm_tile_m": (256, "cuBLAS's usual output tile for large 16-bit GEMMs on A100/H100 "
                        "is 256 x 128 (rows x columns)"),
    "gpu.gemm_tile_n": (128, "cuBLAS's usual output tile for large 16-bit GEMMs on A100/H100 "
                        "is 256 x 128 (rows x columns)"),
    "gpu.gemm_k_overhead": (0, "no fixed cost per output tile: profiles written before the "
                            "key existed priced a GEMM by its FLOPs and wave quantisation "
                            "alone"),
    "gpu.flash_attention_block_keys": (0, "no fixed cost per block of queries: profiles "
                                       "written before the key existed priced a fused "
                                       "attention kernel at one rate whatever its sequence"),
    "gpu.flash_attention_softmax_dims": (0, "no softmax work per score beside the products: "
                                         "profiles written before the key existed priced a "
                                         "fused attention kernel at one rate whatever its "
                                         "head dimension"),
    "gpu.gemm_latency_us": (0, "no fixed time per GEMM kernel beyond its waves of tiles: "
                            "profiles written before the key existed priced a GEMM by its "
                            "tiles alone"),
    "gpu.sm_clock_fraction": (1.0, "the GPU sustains the SM clock its tensor-core rates were "
                              "measured at"),
    "gpu.cuda_malloc_GBps": (CarriedDefault("h100-jlse"), "no measurement of this GPU: the "
                             "rate fitted on the study's H100 node (h100-jlse), which only "
                             "runs that empty the CUDA cache at every phase pay"),
    "cpu.fp16_check_elements_per_s_per_thread": (
        CatalogDefault(cpus.measured_core_check_rate), "no CPU model named: the rate of the "
        "Sapphire Rapids-class core its cycles were counted on, their clock over their count "
        "(zerosim/hardware/cpus.yaml, fp16_overflow_check), which a named CPU's all-core "
        "clock replaces"),
    "host.socket_link_total_GBps": (0, "no limit shared by the two directions: profiles "
                                    "written before the key existed let each direction carry "
                                    "host.socket_link_GBps whatever the other did"),
    "cpu.page_zeroing_contention": (0, "no contention between one process's faulting "
                                    "threads: profiles written before the key existed let page "
                                    "faults scale with the threads that take them"),
    "cpu.oversubscribed_region_ms": (0, "no time lost per parallel region when the node's "
                                     "OpenMP pools oversubscribe its hardware threads beyond "
                                     "the throughput cpu.oversubscription_penalty takes: "
                                     "profiles written before the key existed charged none"),
    "host.os_resident_GiB": (0, "nothing held by the OS and the node's services: profiles "
                             "written before the key existed counted training's own memory "
                             "alone"),
    "host.remote_access_cost": (1.0, "a byte read or written from another NUMA domain costs "
                                "its domain what a local byte costs: profiles written before "
                                "the key existed charged no more for it"),
    "pcie.gpus_per_switch": (1, "each GPU on a PCIe link of its own to the CPU, none shared: "
                             "profiles written before the key existed priced each GPU's "
                             "copies on its own link"),
    "network.nics_per_node": (1, "one NIC per node: profiles written before the key existed "
                              "gave the node's whole network bandwidth as network.nic_GBps"),
    "nvme.drives_per_node": (0, "no NVMe drives: profiles written before the NVMe tier "
                             "describe nodes without one"),
    "nvme.read_GBps_per_drive": (7.0, f"sequential read of {GEN4_NVME} (spec sheets of the "
                                 "class list 6.8-7.0 GB/s)"),
    "nvme.write_GBps_per_drive": (4.2, f"sequential write of {GEN4_NVME} (spec sheets of the "
                                  "class list 4-5 GB/s)"),
    "nvme.latency_us": (80, f"access latency of {GEN4_NVME} (tens of microseconds to about "
                        "100); negligible against MB-sized swaps"),
    "nvme.capacity_GiB_per_drive": (3576, f"3.84 TB, a common size of {GEN4_NVME}"),
    "intra_node.transport": (PeerTransport.NVLINK.value, "the GPUs of a node reach each other "
                             "over NVLink, apart from their PCIe links: profiles written before "
                             "the key existed describe NVLink nodes"),
}
"""Keys a profile may leave out: key -> (value in the key's unit, why that default). A resource
added to zerosim gets a default here, so profiles written before it keep loading; what a
default fills in is recorded with basis `assumed` and its reason."""
DEFAULTS_FROM: dict[str, tuple[str, str]] = {
    "pcie.switch_uplink_GBps": (
        "pcie.h2d_pinned_GBps", "a switch's uplink of the GPUs' own generation and width, "
        "which carries what one GPU's pinned copy reaches"),
    "gpu.gemm_memory_efficiency": (
        "gpu.memory_efficiency", "no measurement of memory-bound GEMMs on this GPU: they stream "
        "at the STREAM rate (gpu.memory_efficiency), as profiles written before the key existed "
        "priced them"),
    "gpu.strided_memory_efficiency": (
        "gpu.memory_efficiency", "no measurement of PyTorch's elementwise kernels on strided "
        "views on this GPU: they stream at the STREAM rate (gpu.memory_efficiency), as profiles "
        "written before the key existed priced them"),
    "gpu.softmax_memory_efficiency": (
        "gpu.memory_efficiency", "no measurement of PyTorch's softmax over attention scores on "
        "this GPU: it streams at the STREAM rate (gpu.memory_efficiency), as profiles written "
        "before the key existed priced it"),
}
"""Keys a profile may leave out whose default is another key's value: key -> (that key, why)."""


OPTIONAL_KEYS = {*DEFAULTS, *DEFAULTS_FROM, *cpus.SUPPLIED_KEYS, cpus.NAME_KEY,
                 "host.cpu_model"}
"""Keys a profile may leave out (a default, or its CPU model, fills them in)."""


def _with_defaults(flat: Mapping[str, Any]) -> dict[str, Any]:
    filled = dict(flat)
    for key, (value, why) in DEFAULTS.items():
        if key in filled:
            continue
        if isinstance(value, CarriedDefault | CatalogDefault):
            filled[key] = value.leaf(key, why, filled.get("name"))
        elif key in QUANTITIES or key in CHOICES:
            filled[key] = {"value": value, "basis": "assumed", "source": f"default: {why}"}
        else:
            filled[key] = value
    for key, (origin, why) in DEFAULTS_FROM.items():
        given = filled.get(origin)
        if key not in filled and given is not None:
            value = given.get("value") if isinstance(given, Mapping) else given
            filled[key] = {"value": value, "basis": "assumed", "source": f"default: {why}"}
    return filled


def _walk(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested mappings to dotted paths, stopping at provenance leaves."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if path in WHOLE_SECTIONS:
            flat[path] = value
        elif isinstance(value, Mapping) and "value" not in value:
            flat.update(_walk(value, f"{path}."))
        else:
            flat[path] = value
    return flat


def _number(prov: Provenance, source: str, key: str, check: Callable[[float], bool],
            expected: str) -> float:
    value = prov.value
    if isinstance(value, bool) or not isinstance(value, int | float) or not check(value):
        raise ScenarioError(source, f"{key}.value", expected, value)
    check_plausible(f"hardware.{key}", value, source=source, key_path=f"{key}.value")
    return float(value)


def _count(flat: Mapping[str, Any], key: str, source: str, *, least: int = 1) -> int:
    value = flat.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        expected = "a positive integer" if least == 1 else f"an integer >= {least}"
        raise ScenarioError(source, key, expected, value if key in flat else "nothing")
    check_plausible(f"hardware.{key}", value, source=source, key_path=key)
    return value


def _numa_map(flat: Mapping[str, Any], source: str, gpus: int, domains: int) -> tuple[int, ...]:
    value = flat.get("gpu.numa_domain")
    ok = (isinstance(value, list) and len(value) == gpus
          and all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < domains
                  for d in value))
    if not ok:
        raise ScenarioError(source, "gpu.numa_domain",
                            f"a list of {gpus} NUMA domain indices in [0, {domains})", value)
    return tuple(value)


def _from_cpu_model(given: Mapping[str, Any], source: str
                    ) -> tuple[cpus.CpuModel | None, dict[str, Any]]:
    """The CPU model a profile names (`host.cpu_model`) and what it supplies for the keys
    the profile leaves out."""
    if "host.cpu_model" not in given:
        return None, {}
    model = cpus.load_catalog().model(given["host.cpu_model"], source=source)
    cpus.check_host(given, model, source)

    def testbed(name: str) -> dict[str, Any]:
        return builtin_profile_tree(name, source=cpus.CATALOG,
                                    key_path=f"families.{model.family.key}.testbed")

    return model, cpus.cpu_values(given, model, source, testbed)


def parse_profile(tree: Any, source: str) -> HardwareProfile:
    """Validate a profile mapping and convert it to SI units."""
    if not isinstance(tree, Mapping):
        raise ScenarioError(source, "<root>", "a mapping", type(tree).__name__)
    given = _walk(tree)
    model, supplied = _from_cpu_model(given, source)
    supplied.update(cpus.low_precision_adam_values({**given, **supplied}, model))
    flat = _with_defaults({**given, **supplied})
    known = (set(QUANTITIES) | set(COUNTS) | set(OPTIONAL_COUNTS) | set(TEXTS) | set(CHOICES)
             | OTHER_KEYS)
    for key in flat:
        if key not in known:
            raise ScenarioError(source, key, f"a known profile key ({', '.join(sorted(known))})",
                                key)
    values: dict[str, Any] = {}
    provenance: dict[str, Provenance] = {}
    for key, (name, scale, check, expected) in QUANTITIES.items():
        if key not in flat:
            raise ScenarioError(source, key, expected, "nothing")
        prov = parse_provenance(flat[key], source, key,
                                bases=(*BASES, DERIVED) if key in supplied else BASES)
        number = _number(prov, source, key, check, expected)
        values[name] = number * scale
        provenance[key] = prov
    for key, (name, choices) in CHOICES.items():
        prov = parse_provenance(flat.get(key), source, key)
        if prov.value not in choices:
            raise ScenarioError(source, f"{key}.value", f"one of {', '.join(choices)}", prov.value)
        values[name] = choices[choices.index(prov.value)]
        provenance[key] = prov
    counts = [(key, name, 1) for key, name in COUNTS.items()]
    counts += [(key, name, 0) for key, name in OPTIONAL_COUNTS.items()]
    for key, name, least in counts:
        values[name] = _count(flat, key, source, least=least)
        if key in DEFAULTS and key not in given:
            provenance[key] = Provenance(values[name], "assumed", f"default: {DEFAULTS[key][1]}")
    for key, name in TEXTS.items():
        text = flat.get(key, "")
        if not isinstance(text, str) or (key == "name" and not text):
            raise ScenarioError(source, key, "a text", text)
        if text:
            check_plausible(f"hardware.{key}", text, source=source, key_path=key)
        values[name] = text
    values["gpu_numa_domain"] = _numa_map(flat, source, values["gpus_per_node"],
                                          values["numa_domains"])
    observed_raw = flat.get("observed") or {}
    if not isinstance(observed_raw, Mapping):
        raise ScenarioError(source, "observed", "a mapping of observations", observed_raw)
    observed = {k: parse_provenance(v, source, f"observed.{k}") for k, v in observed_raw.items()}
    alternatives = profile_alternatives(flat, source)
    if model is not None:
        cpus.check_memory(values["memory_Bps_per_domain"] / GB, values["sockets"],
                          values["numa_domains"], model, source)
    check_carried(provenance, values["name"], source, kind="profile", names=profile_names(),
                  values_of=_builtin_values)
    _check_streaming_rates(values, provenance, source)
    _check_pageable_rates(values, provenance, source)
    _check_pcie_link(flat.get("pcie.generation"), values, source)
    if values["gpus_per_switch"] > values["gpus_per_node"]:
        raise ScenarioError(source, "pcie.gpus_per_switch",
                            f"at most gpu.per_node ({values['gpus_per_node']})",
                            values["gpus_per_switch"])
    return HardwareProfile(**values, provenance=provenance, observed=observed,
                           alternatives=alternatives)


def _alternative_value(source: str) -> Callable[[str, Any, str], float]:
    """How an alternative's value is checked: a numeric profile key's valid, plausible value."""
    def check(key: str, value: Any, key_path: str) -> float:
        if key.startswith(STACK_PREFIX):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ScenarioError(source, key_path, "a number (a value of the scenario's "
                                    "software stack, in the key's unit)", value)
            check_plausible(key, value, source=source, key_path=key_path)
            return float(value)
        if key not in QUANTITIES:
            raise ScenarioError(source, key_path, "a numeric profile key, as hardware.overrides "
                                f"names it ({', '.join(sorted(QUANTITIES))}), or stack.<key>",
                                key)
        _, _, valid, expected = QUANTITIES[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not valid(value):
            raise ScenarioError(source, key_path, expected, value)
        check_plausible(f"hardware.{key}", value, source=source, key_path=key_path)
        return float(value)

    return check


def _shipped_alternatives(source: str) -> Callable[[str, str], Mapping[str, Any]]:
    """How a `carried_from` alternative finds its origin: a shipped profile's section."""
    def section(origin: str, key_path: str) -> Mapping[str, Any]:
        names = profile_names()
        if origin not in names:
            raise ScenarioError(source, key_path, f"a shipped profile ({', '.join(names)})",
                                origin)
        return _builtin_alternatives(origin)

    return section


def profile_alternatives(tree: Mapping[str, Any], source: str) -> tuple[Alternative, ...]:
    """The `alternatives` section of a profile's tree, checked as `parse_profile` checks it
    (a scenario picks one before the tree is patched and parsed)."""
    return parse_alternatives(tree.get(ALTERNATIVES), source,
                              check_value=_alternative_value(source),
                              carried_section=_shipped_alternatives(source))


@functools.cache
def _builtin_alternatives(name: str) -> Mapping[str, Any]:
    """A shipped profile's `alternatives` section as its file writes it."""
    section = builtin_profile_tree(name, source=f"profile {name}").get(ALTERNATIVES) or {}
    return MappingProxyType(dict(section)) if isinstance(section, Mapping) else {}


@functools.cache
def _builtin_values(name: str) -> Mapping[str, Any]:
    """The values a shipped profile's file gives, by dotted key."""
    return MappingProxyType(provenance_values(builtin_profile_tree(name,
                                                                   source=f"profile {name}")))


PCIE_LANE_GBps = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
"""A PCIe lane's raw rate in one direction by generation, GB/s: 2.5 and 5 GT/s with 8b/10b
coding, then 8, 16 and 32 GT/s with 128b/130b, and 64 GT/s PAM4 in 242-of-256-byte flits
(PCI-SIG's base specifications)."""

PCIE_LINK = re.compile(r"PCIe Gen\s*(\d)\s*x\s*(\d+)", re.IGNORECASE)


def _check_pcie_link(generation: Any, values: Mapping[str, Any], source: str) -> None:
    """No copy crosses a PCIe link faster than its lanes signal: where `pcie.generation` names
    the link ("PCIe Gen4 x16"), a copy rate above that raw rate is told (a what-if on a faster
    link should name it there; another kind of link, a GH200's NVLink-C2C, is not checked)."""
    match = PCIE_LINK.search(generation) if isinstance(generation, str) else None
    if match is None or int(match[1]) not in PCIE_LANE_GBps:
        return
    raw = PCIE_LANE_GBps[int(match[1])] * int(match[2])
    for direction in ("h2d", "d2h"):
        for kind in ("pinned", "pageable"):
            rate = values[f"{direction}_{kind}_Bps"] / GB
            if rate > raw * (1 + 1e-9):
                warnings.warn(f"{source}: pcie.{direction}_{kind}_GBps: {rate:g} GB/s is more "
                              f"than the {match[0]} link named by pcie.generation signals in "
                              f"one direction ({raw:g} GB/s): a faster link wants its own "
                              "pcie.generation", ScenarioWarning, stacklevel=2)


def _beyond(value: float, ceiling: float, prov: Provenance) -> bool:
    """`value` above `ceiling` by more than its standard error (2% where it gives none)."""
    return value > ceiling * (1 + max(prov.stderr or 0.0, 0.02))


def _check_pageable_rates(values: Mapping[str, Any], provenance: Mapping[str, Provenance],
                          source: str) -> None:
    """A pageable copy goes through the driver's pinned staging buffer, so it cannot beat a
    pinned one in the same direction: one that does, beyond its standard error, is told."""
    for direction in ("h2d", "d2h"):
        key = f"pcie.{direction}_pageable_GBps"
        pageable, pinned = values[f"{direction}_pageable_Bps"], values[f"{direction}_pinned_Bps"]
        if _beyond(pageable, pinned, provenance[key]):
            warnings.warn(f"{source}: {key}: {pageable / GB:g} GB/s is faster than "
                          f"pcie.{direction}_pinned_GBps ({pinned / GB:g}): a pageable copy is "
                          "staged through pinned memory and cannot beat a pinned one",
                          ScenarioWarning, stacklevel=2)


STREAMING_RATES = ("gpu.gemm_memory_efficiency", "gpu.strided_memory_efficiency",
                   "gpu.softmax_memory_efficiency")
"""Rates of classes of memory-bound GPU kernels, each a fraction of HBM peak like
`gpu.memory_efficiency`, what a STREAM copy reaches."""


def _check_streaming_rates(values: Mapping[str, Any], provenance: Mapping[str, Provenance],
                           source: str) -> None:
    """A class of memory-bound kernels priced faster than a STREAM copy streams, by more than
    the value's standard error (2% where none is given), is told: no kernel moves bytes
    through HBM faster than STREAM, and a rate carried over from a part with more HBM
    bandwidth (an SM-bound rate of an 80 GB A100 on a 40 GB one) is the usual cause."""
    stream = values["memory_efficiency"]
    for key in STREAMING_RATES:
        rate = values[QUANTITIES[key][0]]
        if _beyond(rate, stream, provenance[key]):
            warnings.warn(f"{source}: {key}: {rate:g} of HBM peak is faster than "
                          f"gpu.memory_efficiency ({stream:g}), what a STREAM copy reaches, "
                          "beyond its standard error: no memory-bound kernel streams faster "
                          "than STREAM (a rate taken from a part with more HBM bandwidth?)",
                          ScenarioWarning, stacklevel=2)


def profile_names() -> list[str]:
    folder = resources.files("zerosim.hardware") / "profiles"
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir()
                  if p.name.endswith(".yaml"))


def builtin_profile_tree(name: Any, *, source: str = "<inline>",
                         key_path: str = "hardware") -> dict[str, Any]:
    """A catalog profile's tree. Only catalog names are looked up: a path to a profile file is
    given as `{file: path}`."""
    names = profile_names()
    if name not in names:
        raise ScenarioError(source, key_path, f"a profile name ({', '.join(names)}; a profile "
                            "file is given as {file: path/to/profile.yaml})", name)
    path = resources.files("zerosim.hardware") / "profiles" / f"{name}.yaml"
    return parse_yaml_text(path.read_text(encoding="utf-8"),
                           f"zerosim/hardware/profiles/{name}.yaml")


def profile_tree_from_file(path: Path, *, source: str, key_path: str) -> dict[str, Any]:
    return read_yaml_file(path, referenced_from=source, key_path=key_path)


def _is_provenance(value: Any) -> bool:
    return isinstance(value, Mapping) and "value" in value


def flatten_overrides(overrides: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{pcie: {h2d_pageable_GBps: 12}}` -> `{"pcie.h2d_pageable_GBps": 12}`: a nested override
    patches the keys it names, not the whole section. A `{value, basis, source}` mapping is one
    value, and so are the `observed` and `alternatives` sections."""
    return flatten_nested(overrides, lambda dotted, value: not _is_provenance(value)
                          and dotted not in WHOLE_SECTIONS, prefix)


def apply_overrides(tree: Mapping[str, Any], overrides: Mapping[str, Any], *,
                    source: str, key_path: str = "hardware.overrides") -> dict[str, Any]:
    """Patch profile values by dotted key (nested mappings patch key by key); a plain number
    keeps the key's unit and gets basis `override`, a `{value, basis, source}` mapping replaces
    the value with its provenance."""
    patched = copy.deepcopy(dict(tree))
    for dotted, value in flatten_overrides(overrides).items():
        node = patched
        parts = dotted.split(".")
        defaulted = dotted in OPTIONAL_KEYS
        for part in parts[:-1]:
            if defaulted and part not in node:
                node[part] = {}
            if not isinstance(node.get(part), dict):
                raise ScenarioError(source, f"{key_path}.{dotted}", "an existing profile key",
                                    dotted)
            node = node[part]
        leaf = parts[-1]
        if leaf not in node and not defaulted:
            raise ScenarioError(source, f"{key_path}.{dotted}", "an existing profile key", dotted)
        provenance_leaf = ((isinstance(node.get(leaf), Mapping) and "value" in node[leaf])
                           or (leaf not in node and (dotted in QUANTITIES or dotted in CHOICES)))
        if provenance_leaf and not _is_provenance(value):
            node[leaf] = {"value": value, "basis": "override", "source": f"override in {source}"}
        else:
            node[leaf] = value
    return patched


def load_profile(name_or_path: str | Path, overrides: Mapping[str, Any] | None = None
                 ) -> HardwareProfile:
    """A built-in profile by name, or a profile YAML file by path."""
    text = str(name_or_path)
    if text.endswith((".yaml", ".yml")) or Path(text).is_file():
        tree, source = read_yaml_file(Path(text)), text
    else:
        tree, source = builtin_profile_tree(text, source=text), f"profile {text}"
    if overrides:
        tree = apply_overrides(tree, overrides, source=source)
    return parse_profile(tree, source)
