"""One vocabulary for every layer: streams, phases, op kinds, buffer kinds, memory categories,
devices, link kinds, and what became of a run (its status) or of a validation cell.

The engine writes these values into its records as fields; results, plots, validation and tests
select on the fields, never on display text. Values are `StrEnum`s, so they compare equal to
their plain text (`Stream.COMPUTE == "compute"`) and land in DataFrames and CSV as that text.
Pure: imports nothing from zerosim.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class Stream(StrEnum):
    """In-order queues of a rank: CUDA streams, copy-engine tracks, host threads."""

    HOST = "host"
    """The rank's host thread while it works (ZeRO's hooks, launches, `cudaMalloc`, the
    loop's bookkeeping), recorded only where a run keeps every record (`run_engine(full=True)`):
    what it waits for is the other streams' work."""
    COMPUTE = "compute"
    ALLGATHER = "allgather"
    """Where the all-gathers run: the process group's NCCL stream (PyTorch launches every
    collective on it, after the stream the call was made on)."""
    FETCH_COPIES = "allgather.copies"
    """DeepSpeed's `__allgather_stream`: the parameter fetch's copies (offloaded partitions
    copied in, the split of a coalesced all-gather); a wait on an all-gather queues there,
    not behind later ones."""
    REDUCE = "reduce"
    PCIE_H2D = "pcie.h2d"
    PCIE_D2H = "pcie.d2h"
    CPU = "cpu"
    FLUSH = "flush"
    CPU_FLUSH = "cpu.flush"
    OPTIMIZER_GPU = "optimizer.gpu"
    STATE_TO_GPU = "optimizer.gpu.in"
    COPY_BACK = "copy-back"
    CPU_COPY_BACK = "cpu.copy-back"
    COPIER_PARAMS = "copier.params"
    COPIER_EXP_AVG = "copier.exp_avg"
    COPIER_EXP_AVG_SQ = "copier.exp_avg_sq"
    COPIER_FP16 = "copier.fp16"
    CPU_DOWNSCALE = "cpu.downscale"
    CPU_ZENFLOW = "cpu.zenflow"
    """ZenFlow's optimizer process: the CPU update of the previous window's gradients, which
    runs while this window's steps do."""
    CPU_SUPEROFFLOAD = "cpu.superoffload"
    """SuperOffload's optimizer process: each sub-group's CPU Adam, from the moment the
    boundary backward completes its gradients."""
    NVME_READ = "nvme.read"
    NVME_WRITE = "nvme.write"
    SWAP = "swap"

    @property
    def is_copy_engine(self) -> bool:
        """A track that draws DMA transfers (several may overlap), not an in-order queue."""
        return self in COPY_ENGINE_STREAMS


COPY_ENGINE_STREAMS = frozenset({Stream.PCIE_H2D, Stream.PCIE_D2H, Stream.NVME_READ,
                                 Stream.NVME_WRITE})

PCIE_STREAMS = {"h2d": Stream.PCIE_H2D, "d2h": Stream.PCIE_D2H}
"""The copy-engine track of each PCIe direction."""


class Phase(StrEnum):
    SETUP = "setup"
    FORWARD = "forward"
    BACKWARD = "backward"
    UPDATE = "update"
    BETWEEN = "between"
    """Outside every phase's timer: the host thread's work between phases (the training loop's,
    before the first phase too), which no phase counts."""


class PhaseTime(StrEnum):
    """The phase times a run's summary reports (`summary["phases_s"]`): a micro-batch's
    backward pass is either a non-boundary one or the accumulation boundary."""

    FORWARD = "forward"
    BACKWARD_NON_BOUNDARY = "backward_non_boundary"
    BACKWARD_BOUNDARY = "backward_boundary"
    UPDATE = "update"


PHASE_TIMES: tuple[str, ...] = tuple(p.value for p in PhaseTime)
"""The keys of `summary["phases_s"]`, in order, as plain text."""


class Status(StrEnum):
    """What became of a run, a sweep or tune point, or a row of a table of measured runs
    (`summary["status"]`, the `status` column of every table written)."""

    OK = "ok"
    """Simulated to its end."""
    OOM = "oom"
    """Simulated until a device or the host ran out of memory: a result, not a failure."""
    ERROR = "error"
    """Not simulated: the simulation failed (a bug, named in the row's error)."""
    REFUSED = "refused"
    """Not simulated: a configuration zerosim does not replay, or a row it cannot read."""
    PRUNED = "pruned"
    """Not simulated: `zerosim tune` ruled the point out from others' results."""
    PENDING = "pending"
    """Not simulated yet (`zerosim tune`'s rows while it runs)."""


SIMULATED = frozenset({Status.OK, Status.OOM})
"""The statuses of a run that was simulated (one that does not fit is a result)."""


class Verdict(StrEnum):
    """What `zerosim validate` says of a cell: judged against its tolerance, or reported."""

    PASS = "pass"
    FAIL = "fail"
    REPORTED = "reported"
    """Shown beside the measurement, not judged (fitted on it, or not comparable)."""
    EXCLUDED = "excluded"
    """Left out of the judgement for a reason the reference data state."""


JUDGED = frozenset({Verdict.PASS, Verdict.FAIL})
"""The verdicts of a cell judged against its tolerance."""


class OpKind(StrEnum):
    """What an op does, whatever its display name says."""

    FORWARD = "forward"
    BACKWARD = "backward"
    RECOMPUTE = "recompute"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_REDUCE = "all_reduce"
    ALL_TO_ALL = "all_to_all"
    """qgZ: a bucket's gradients reduced by int4 all-to-alls within and then across nodes
    (its one-dimensional tensors by reduce-scatters); Ulysses: Q, K, V and the attention's
    output exchanged over the sequence-parallel group, on the compute stream."""
    GATHER_SPLIT = "gather_split"
    """Each tensor of a coalesced all-gather copied out of its flat buffer (`torch.cat`)."""
    PARAM_FETCH = "param_fetch"
    """A parameter partition brought to the GPU before its all-gather (offload_param)."""
    PARAM_NORM = "param_norm"
    """ZeRO-3 before DeepSpeed 0.6.0: a fetched module's parameter norm, taken for a debug
    message that is not printed (its `.item()` a blocking copy)."""
    QUANTIZE = "quantize"
    """qwZ: the partitions to be all-gathered made int8 blocks with fp32 scales."""
    DEQUANTIZE = "dequantize"
    """qwZ: an int8 all-gather's output made 16-bit again."""
    SECONDARY_PARTITION = "secondary_partition"
    """hpZ: a gathered parameter's share copied into its secondary partition."""
    CHECKPOINT_TO_HOST = "checkpoint_to_host"
    """A checkpointed block's input copied to host memory (`runtime.checkpoint_in_cpu`)."""
    CHECKPOINT_FROM_HOST = "checkpoint_from_host"
    """It copied back to the GPU before the block's recompute."""
    GRAD_TO_BUCKET = "grad_to_bucket"
    GRAD_WAIT = "grad_wait"
    STREAM_WAIT = "stream_wait"
    """The compute stream waiting for what is queued on another stream (`wait_stream`)."""
    PARTITION_GRADS = "partition_grads"
    GRAD_TO_HOST = "grad_to_host"
    """A gradient partition moved into the host accumulation buffer."""
    GRAD_FROM_HOST = "grad_from_host"
    GRAD_ACCUMULATE = "grad_accumulate"
    GRAD_FLUSH = "grad_flush"
    """The boundary's fp32 gradient on its way to the optimizer."""
    ZERO_PAGES = "zero_pages"
    CAST = "cast"
    OVERFLOW_CHECK = "overflow_check"
    GRAD_NORM = "grad_norm"
    """The gradient partitions' fp64 norms a step without offload takes on the GPU."""
    UNSCALE = "unscale"
    OPTIMIZER_STEP = "optimizer_step"
    SELECTIVE_UPDATE = "selective_update"
    """ZenFlow's GPU work on the top-k gradient columns: their selection and broadcast, and
    the AdamW step of those columns on the GPU."""
    PARAM_COPY_BACK = "param_copy_back"
    """Updated 16-bit parameters written back to where the GPU reads them."""
    STATE_TO_GPU = "state_to_gpu"
    STATE_TO_HOST = "state_to_host"
    SWAP_IN = "swap_in"
    """NVMe -> host memory."""
    SWAP_OUT = "swap_out"
    """Host memory -> NVMe."""
    HOOKS = "hooks"
    """The host thread in ZeRO-3's module hooks (fetch, release, bookkeeping)."""
    LAUNCH = "launch"
    """The host thread launching kernels."""
    CUDA_MALLOC = "cuda_malloc"
    """The host thread in `cudaMalloc`, reserving device memory for the caching allocator."""
    COLLECTIVE_LAUNCH = "collective_launch"
    """The host thread calling collectives (DeepSpeed's bookkeeping and NCCL's launch)."""
    LOOP = "loop"
    """The training loop's own host work per micro-batch and per step, outside DeepSpeed."""
    STEP_BOOKKEEPING = "step_bookkeeping"
    """DeepSpeed's host work in the optimizer step per tensor (releases, flattening, the
    persistent tensors gathered again)."""
    USED_PARAM_CHECK = "used_param_check"
    """DeepSpeed's count of the parameters used in the backward."""
    MEMORY_REPORT = "memory_report"
    """DeepSpeed's memory reports around a phase with `memory_breakdown` (`gc.collect()` and
    `see_memory_usage`), between the phases."""


class UpdateDevice(StrEnum):
    """Where Deep Optimizer States' interleaved update steps a sub-group."""

    CPU_PREFETCH = "cpu+prefetch"
    """On the CPU, after starting the moves of the GPU sub-groups' state around it."""
    CPU = "cpu"
    GPU = "gpu"


class BufferKind(StrEnum):
    """Where the host side of a copy or an allocation lives."""

    NONE = ""
    PINNED = "pinned"
    PAGEABLE = "pageable"
    DEVICE = "device"
    NVME = "nvme"


def host_buffer(pinned: bool) -> BufferKind:
    return BufferKind.PINNED if pinned else BufferKind.PAGEABLE


def span_kind(op_kind: str, buffer_kind: str, op: str) -> str:
    """What a span does, from its fields: its op kind with the host buffer it copies to or
    from, e.g. 'grad_to_host (pinned)'. A span without an op kind (a result folder that
    predates the column) is named by its whole `op`."""
    if not op_kind:
        return str(op)
    return f"{op_kind} ({buffer_kind})" if buffer_kind else str(op_kind)


class PathGap(StrEnum):
    """A stretch of a phase's critical path that no recorded op covers
    (`zerosim.results.critical`)."""

    HOST = "host"
    """The rank's host thread: no op the phase waited on ended there, so the next one started
    when the host issued it (its recorded work is `Stream.HOST`'s spans: this is the rest, or
    all of it in a folder written before they were recorded)."""


class Category(StrEnum):
    """Memory categories (what occupies HBM, host memory or NVMe)."""

    RUNTIME_CONTEXT = "runtime context"
    FRAMEWORK_BUFFERS = "framework buffers"
    PARAMS_16BIT = "params 16-bit"
    PARAMS_PERSISTENT = "params persistent"
    PARAMS_GATHERED = "params gathered"
    PARAMS_SECONDARY = "params secondary (hpZ)"
    """hpZ's secondary partitions: each parameter's share over its group of ranks, made at its
    first release after a step and dropped by the step."""
    QUANTIZED_GATHER = "quantized all-gather buffers"
    """qwZ's int8 all-gather buffer and its fp32 scales, from the call to the last wait."""
    QGZ_ERROR_FEEDBACK = "qgZ error feedback (LoCo)"
    """LoCo's int8 quantization errors of every matrix qgZ reduces, within and across nodes,
    kept between steps."""
    QUANTIZED_REDUCE = "quantized reduction buffers"
    """qgZ's int4 gradient blocks, their fp32 scales and the 16-bit result of their
    dequantization, while one tensor is reduced."""
    IPG_BUCKET = "ipg bucket"
    GRADS = "grads"
    GRAD_PARTITIONS = "grad partitions"
    FP32_MASTER = "fp32 master params"
    OPTIMIZER_STATES = "optimizer states"
    FP32_GRADS = "fp32 grads"
    GRAD_ACCUMULATION = "grad accumulation"
    FP32_MASTER_GPU = "fp32 master params (GPU)"
    OPTIMIZER_STATES_GPU = "optimizer states (GPU)"
    FP32_GRADS_GPU = "fp32 grads (GPU)"
    ACTIVATIONS = "activations"
    WORKSPACE = "workspace"
    PAGEABLE_TEMPORARIES = "pageable temporaries"
    BOUNDARY_GRAD_BUFFER = "boundary grad buffer"
    PREFETCHED_STATE = "prefetched optimizer state"
    SWAP_BUFFERS = "swap buffers"
    CPU_ADAM_BUFFERS = "CPU Adam buffers"
    FORKED_PAGES = "pages kept by forked workers"
    """Pre-fork pages of pageable host state the rank rewrote, still held by the worker
    processes its data loader forked (copy-on-write)."""
    RANK_PROCESSES = "rank processes"
    """What a rank's processes hold besides its tensors: interpreter, framework, workers."""
    OS = "OS and services"
    """What a node's OS and services hold whatever its ranks do."""

    @property
    def is_static(self) -> bool:
        """Allocated once for the whole run (model states and their buffers)."""
        return self in STATIC_CATEGORIES


STATIC_CATEGORIES = frozenset({
    Category.RUNTIME_CONTEXT, Category.FRAMEWORK_BUFFERS, Category.PARAMS_16BIT,
    Category.PARAMS_PERSISTENT,
    Category.IPG_BUCKET, Category.FP32_MASTER, Category.OPTIMIZER_STATES, Category.FP32_GRADS,
    Category.GRAD_ACCUMULATION, Category.FP32_MASTER_GPU, Category.OPTIMIZER_STATES_GPU,
    Category.FP32_GRADS_GPU, Category.SWAP_BUFFERS, Category.CPU_ADAM_BUFFERS,
    Category.FORKED_PAGES, Category.RANK_PROCESSES, Category.OS,
})


def category_label(category: Category, buffer: BufferKind = BufferKind.NONE) -> str:
    """What a memory record calls a category: 'fp32 grads (pinned)' for a host buffer whose
    kind matters, the category alone otherwise."""
    if buffer in (BufferKind.PINNED, BufferKind.PAGEABLE):
        return f"{category.value} ({buffer.value})"
    return category.value


_CATEGORY_OF_LABEL = {category_label(c, b): c for c in Category for b in BufferKind}


def base_category(label: str) -> Category | None:
    """The category a memory record's label names ('fp32 grads (pinned)' -> FP32_GRADS,
    'fp32 master params (GPU)' -> FP32_MASTER_GPU); None for a label no category makes."""
    return _CATEGORY_OF_LABEL.get(label)


class DeviceKind(StrEnum):
    GPU = "gpu"
    HOST = "host"
    NVME = "nvme"


def device_name(kind: DeviceKind, index: int) -> str:
    return f"{kind.value}{index}"


def device_parts(device: str) -> tuple[DeviceKind, int] | None:
    """(kind, index) of a device named by `device_name`; None for any other name."""
    for kind in DeviceKind:
        index = device.removeprefix(kind.value)
        if index != device and index.isdigit():
            return kind, int(index)
    return None


def device_kind(device: str) -> DeviceKind:
    """The kind of a device named by `device_name`."""
    parts = device_parts(device)
    if parts is None:
        raise ValueError(f"not a device name: {device!r}")
    return parts[0]


def devices_of(names: Iterable[str], kind: DeviceKind) -> list[str]:
    """The distinct names among `names` that are devices of `kind`, in index order (gpu0,
    gpu1, ..., gpu10)."""
    found = {(parts[1], name) for name in names
             if (parts := device_parts(str(name))) is not None and parts[0] is kind}
    return [name for _, name in sorted(found)]


def is_gpu(device: str) -> bool:
    """Whether `device` names a GPU (False for any name `device_name` does not make)."""
    parts = device_parts(device)
    return parts is not None and parts[0] is DeviceKind.GPU


class PeerTransport(StrEnum):
    """How NCCL carries a ring's bytes between two GPUs of one node (a profile's
    `intra_node.transport`): over NVLink (its own fabric, apart from PCIe), peer-to-peer over
    PCIe (NCCL's P2P transport: out of the sender's PCIe link, into the receiver's), or
    through host memory (its SHM transport, where peer-to-peer is off: the sender's GPU writes
    into a shared host buffer, the receiver's reads it)."""

    NVLINK = "nvlink"
    PCIE_P2P = "pcie_p2p"
    SHM = "shm"


class LinkKind(StrEnum):
    """Shared resources of the flow network, by kind."""

    PCIE_H2D = "pcie.h2d"
    PCIE_D2H = "pcie.d2h"
    NVLINK = "nvlink"
    PEER = "peer"
    """The ring's own limit between a node's GPUs where they have no NVLink (PCIe switches,
    the CPU's root complex): `nvlink.bus_GBps` of a profile whose transport is not NVLink."""
    SWITCH_H2D = "uplink.h2d"
    SWITCH_D2H = "uplink.d2h"
    """A PCIe switch's uplink to the CPU, per direction, shared by the GPUs behind it
    (`pcie.gpus_per_switch`): 'host0.switch1.uplink.h2d'."""
    NIC = "nic"
    HOST_MEMORY = "memory"
    SOCKET_LINK = "socket link"
    CPU = "cpu"
    NVME_READ = "nvme.read"
    NVME_WRITE = "nvme.write"


def resource_name(device: str, kind: LinkKind) -> str:
    """The flow-network resource of `kind` on `device`: 'gpu0.pcie.h2d', 'host0.cpu'."""
    return f"{device}.{kind.value}"


def split_resource(resource: str) -> tuple[str, LinkKind | None, str]:
    """(device, kind, where) of a flow-network resource: 'gpu0.pcie.h2d' -> ('gpu0',
    PCIE_H2D, ''), 'host0.numa1.memory' -> ('host0', HOST_MEMORY, 'numa1'),
    'host0.numa0->numa1' -> ('host0', SOCKET_LINK, 'numa0->numa1'),
    'host0.switch1.uplink.h2d' -> ('host0', SWITCH_H2D, 'switch1'); kind None for a
    resource of no known kind (where then holds the rest of the name)."""
    device, _, rest = resource.partition(".")
    if rest in _LINK_KINDS:
        return device, _LINK_KINDS[rest], ""
    part, _, kind = rest.partition(".")
    if part.startswith("switch") and kind in _SWITCH_KINDS:
        return device, _SWITCH_KINDS[kind], part
    where, _, tail = rest.rpartition(".")
    if where and tail == LinkKind.HOST_MEMORY:
        return device, LinkKind.HOST_MEMORY, where
    if "->" in rest:
        return device, LinkKind.SOCKET_LINK, rest
    return device, None, rest


_SWITCH_KINDS = {kind.value: kind for kind in (LinkKind.SWITCH_H2D, LinkKind.SWITCH_D2H)}
_LINK_KINDS = {kind.value: kind for kind in LinkKind
               if kind not in (LinkKind.HOST_MEMORY, LinkKind.SOCKET_LINK, *_SWITCH_KINDS.values())}


class Collective(StrEnum):
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_REDUCE = "all_reduce"
    ALL_TO_ALL = "all_to_all"
