"""qgZ, ZeRO++'s quantized gradients (DeepSpeed 0.10.0+): ZeRO-3's bucket reduction by int4
all-to-alls within each node and then across nodes, where the ranks span several nodes.

`__avg_scatter_grads` (stage3.py) hands the bucket's gradients, in parameter order, to
`all_to_all_quant_reduce` (runtime/comm/coalesced_collectives.py), which reduces them one at a
time. A multi-dimensional gradient of n elements, with G = max(its first two dimensions, world)
quantization groups, on nodes of g GPUs, N nodes, world W = N g:

1. `swizzle_quant`: read the 16-bit gradient, write n/2 bytes of int4 and G fp32 scales;
2. `all_to_all_single` of the int4 blocks, then of the scales, over the node's g ranks;
3. `quantized_reduction`: dequantize what came in, sum over the node, quantize again: n/(2g)
   bytes of int4 and G // g scales;
4. the same two all-to-alls over the N ranks of this local index, one a node;
5. `dequantize` to n/g fp16 elements, then `sum` of its N chunks (N adds, the first to
   Python's 0) and the division by N: this rank's n/W elements, each add and the division
   making a new tensor before the last is dropped (the running sum: one n/W more, held while
   they run).

A vector (a bias, a norm), and from DeepSpeed 0.13.2 a tensor whose n is not a multiple of 2W
(`qgz_indivisible_fallback`), goes through `reduce_scatter_coalesced` alone instead.

With LoCo (`zeropp_loco_param`, 0.16.2+: `all_to_all_loco_quant_reduce`), each matrix's
quantization errors within the node (n elements) and across nodes (n/g) are kept between steps
as int8 with their scales (`model_states`: the memory category `qgZ error feedback (LoCo)`),
dequantized before step 1, fed into its quantization and into the reduction's, and quantized
back after each (`_LocoErrors`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from zerosim.engine.plan import QGZ_SCALE_BYTES, Param
from zerosim.engine.rank import Gen, RankCore
from zerosim.engine.streams import InOrderStream, NcclQueue, NcclTurn
from zerosim.units import ordered_sum
from zerosim.vocabulary import Category, Collective, OpKind

INT4_PER_BYTE = 2
SCALE_BYTES = QGZ_SCALE_BYTES
DEQUANTIZED_BYTES = 2
"""`dequantize` is bound to its `__half` instance: the result is fp16."""
QUANTIZER_KERNELS = 3
"""`swizzle_quant`, `quantized_reduction`, `dequantize`; the chunks' sum and the division
come on top (`nodes + 1` kernels)."""
ALL_TO_ALLS = 4
LOCO_KERNELS = 4
"""LoCo's: the two errors' `dequantize` and their two `quantize` back to int8."""


@dataclass
class _Bucket:
    """What a bucket's reduction holds: the last quantized tensor's buffers, the copy in the
    communication dtype, and this rank's partitions (until they are moved)."""

    buffers: int = 0
    cast: int = 0
    partitions: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class _LocoErrors:
    """LoCo's work on one matrix of n elements, G groups, on nodes of g GPUs
    (`all_to_all_loco_quant_reduce`, steady state: the previous step's int8 errors exist):
    the errors within the node (n elements) and across nodes (n / g) dequantized to fp16,
    each read and written again by the kernel that feeds it into the quantization
    (`loco_swizzle_quant`, `loco_quantized_reduction`), then quantized back to int8 with G
    and G // g scales. Each `reset_T` reductions the errors restart from zeros instead, which
    a steady iteration does not replay."""

    numel: int
    groups: int
    per_node: int

    @property
    def _node(self) -> tuple[float, float]:
        """(int8 bytes, scale bytes) of the errors within the node (`_across`: across
        nodes)."""
        return float(self.numel), float(SCALE_BYTES * self.groups)

    @property
    def _across(self) -> tuple[float, float]:
        return self.numel / self.per_node, float(SCALE_BYTES * (self.groups // self.per_node))

    @property
    def dequantized_bytes(self) -> float:
        """Both `dequantize` calls: read int8 and scales, write fp16."""
        return ordered_sum(q + s + DEQUANTIZED_BYTES * q for q, s in (self._node, self._across))

    @property
    def fed_in_bytes(self) -> float:
        """`loco_swizzle_quant` reads and writes the fp16 errors within the node."""
        return 2 * DEQUANTIZED_BYTES * self._node[0]

    @property
    def fed_in_across_bytes(self) -> float:
        return 2 * DEQUANTIZED_BYTES * self._across[0]

    @property
    def requantized_node_bytes(self) -> float:
        """`quantize` of the fp16 errors within the node into int8 and scales."""
        q, s = self._node
        return DEQUANTIZED_BYTES * q + q + s

    @property
    def requantized_across_bytes(self) -> float:
        q, s = self._across
        return DEQUANTIZED_BYTES * q + q + s

    @property
    def transient_bytes(self) -> float:
        """The fp16 errors, and the new int8 ones made before the old are dropped."""
        return ordered_sum(DEQUANTIZED_BYTES * q + q + s for q, s in (self._node, self._across))


_NO_ERRORS = _LocoErrors(0, 0, 1)
"""Without LoCo: no error bytes anywhere."""


@dataclass(frozen=True)
class _Tensor:
    """How qgZ reduces one gradient: `groups` quantization groups (0: reduce-scattered)."""

    name: str
    numel: int
    groups: int


class QuantizedGradientReduction:
    """A rank's qgZ: its two all-to-all groups (utils/groups.py `_get_local_all_to_all_group`:
    `local_{node}` the g ranks of its node, `global_{local index}` one rank a node), and the
    ops that reduce a bucket, one a tensor on the reduction stream, each issued by the host
    after its launches."""

    def __init__(self, core: RankCore, nccl: NcclQueue):
        self.core = core
        self.nccl = nccl
        """The data-parallel group's NCCL stream, which the vectors' reduce-scatters use."""
        per_node = core.profile.gpus_per_node
        world = len(core.ranks)
        self.nodes = world // per_node
        node, local = divmod(core.rank, per_node)
        self.local_ranks = tuple(range(node * per_node, (node + 1) * per_node))
        self.global_ranks = tuple(local + j * per_node for j in range(self.nodes))
        self._tensors: dict[Param, _Tensor] = {}
        self.loco = core.ds.zero_plus_plus.loco is not None
        """LoCo's error feedback around each matrix's quantizations."""

    def tensor(self, param: Param) -> _Tensor:
        known = self._tensors.get(param)
        if known is None:
            known = self._tensors[param] = self._describe(param)
        return known

    def _describe(self, param: Param) -> _Tensor:
        plan = self.core.plan
        return _Tensor(plan.modules[param.module].name, param.numel,
                       plan.qgz_groups(param, self.core.behaviours.qgz_indivisible_fallback))

    def reduce(self, params: list[Param], stream: InOrderStream, cast_s: tuple[float, float],
               cast_bytes: float) -> Gen:
        """Issue the reduction of `params` (a bucket, in parameter order as DeepSpeed sorts it
        by `ds_id`), one op a tensor on `stream`; `cast_s` the casts into the communication
        dtype before the first and back after the last (`IpgBuckets.cast_seconds`),
        `cast_bytes` what the first holds until then. Returns the bytes of this rank's
        partitions, held until they are moved (filled as the ops run), and the last op's
        event."""
        core = self.core
        bucket = _Bucket()
        tensors = [self.tensor(p) for p in params]
        last = len(tensors) - 1
        done = None
        for i, tensor in enumerate(tensors):
            if tensor.groups:
                core.plain_launches += ALL_TO_ALLS
                yield from core.host_time((QUANTIZER_KERNELS + LOCO_KERNELS * self.loco
                                           + self.nodes + 1) * core.kernel_launch_s,
                                          OpKind.LAUNCH)
                work = self._quantized(tensor, bucket, stream)
                label, kind = f"qgZ all-to-all {tensor.name}", OpKind.ALL_TO_ALL
            else:
                core.launches += 1
                work = self._reduce_scatter(tensor, bucket, stream, self.nccl.issue(),
                                            core.next_key(Collective.REDUCE_SCATTER))
                label, kind = f"reduce-scatter {tensor.name}", OpKind.REDUCE_SCATTER
            yield from core.pay_launches()
            done = stream.launch(label, self._op(work, bucket, stream, cast_s, cast_bytes,
                                                 first=i == 0, last=i == last),
                                 kind=kind, nbytes=core.comm_bytes * tensor.numel)
        return bucket.partitions, done

    def _op(self, work: Callable[[], Gen], bucket: _Bucket, stream: InOrderStream,
            cast_s: tuple[float, float], cast_bytes: float, *, first: bool, last: bool
            ) -> Callable[[], Gen]:
        """A tensor's op: the bucket's cast into the communication dtype before the first
        tensor (its copy held to the end), the tensor's work, and after the last tensor the
        cast back and the end of `all_to_all_quant_reduce`, which drops its last buffers."""
        core = self.core

        def op() -> Gen:
            if first:
                bucket.cast = core.gpu.allocate(Category.GRAD_PARTITIONS, cast_bytes,
                                                "gradients in the communication dtype")
                if cast_s[0]:
                    yield from core.gpu_kernel(cast_s[0], stream)
            yield from work()
            if last:
                if cast_s[1]:
                    yield from core.gpu_kernel(cast_s[1], stream)
                core.gpu.free(Category.GRAD_PARTITIONS, bucket.cast)
                core.gpu.free(Category.QUANTIZED_REDUCE, bucket.buffers)
        return op

    def _quantized(self, tensor: _Tensor, bucket: _Bucket, stream: InOrderStream
                   ) -> Callable[[], Gen]:
        """The five steps of the module docstring, LoCo's around them where it is on. The
        tensor's buffers (int4 blocks and scales, what each all-to-all receives, the fp16
        dequantized result; with LoCo the fp16 errors and the new int8 ones, made before the
        old go) are made as it starts and held until the next tensor's are: the loop's
        variables keep them."""
        core = self.core
        n, groups, per_node = tensor.numel, tensor.groups, len(self.local_ranks)
        int4 = n / INT4_PER_BYTE
        scales = SCALE_BYTES * groups
        node_int4, node_scales = int4 / per_node, SCALE_BYTES * (groups // per_node)
        dequantized = DEQUANTIZED_BYTES * n / per_node
        partition = DEQUANTIZED_BYTES * (n // len(core.ranks))
        sums = partition * (2 + 3 * (self.nodes - 1) + 2)
        local = [(*core.next_key("all_to_all local"), self.local_ranks[0]) for _ in "ds"]
        across = [(*core.next_key("all_to_all global"), self.global_ranks[0]) for _ in "ds"]
        held = 2 * (int4 + scales) + 2 * (node_int4 + node_scales) + dequantized
        errors = _LocoErrors(n, groups, per_node) if self.loco else _NO_ERRORS
        held += errors.transient_bytes
        quantize = core.comm_bytes * n + int4 + scales + errors.fed_in_bytes
        reduction = int4 + scales + node_int4 + node_scales + errors.fed_in_across_bytes

        def kernel(nbytes: float) -> Gen:
            if nbytes:
                yield from core.gpu_kernel(core.hbm_seconds(nbytes, passes=1), stream)

        def exchange(keys: list[tuple], sizes: tuple[float, float], ranks: tuple[int, ...]
                     ) -> Gen:
            for key, nbytes in zip(keys, sizes, strict=True):
                yield from core.machine.collective(core.rank, key, Collective.ALL_TO_ALL,
                                                   nbytes, ranks)

        def work() -> Gen:
            buffers = core.gpu.allocate(Category.QUANTIZED_REDUCE, held, f"qgZ {tensor.name}")
            core.gpu.free(Category.QUANTIZED_REDUCE, bucket.buffers)
            bucket.buffers = buffers
            yield from kernel(errors.dequantized_bytes)
            yield from kernel(quantize)
            yield from exchange(local, (int4, scales), self.local_ranks)
            yield from kernel(errors.requantized_node_bytes)
            yield from kernel(reduction)
            yield from exchange(across, (node_int4, node_scales), self.global_ranks)
            yield from kernel(errors.requantized_across_bytes)
            yield from kernel(node_int4 + node_scales + dequantized)
            bucket.partitions.append(core.gpu.allocate(
                Category.GRAD_PARTITIONS, partition, f"qgZ partition {tensor.name}"))
            running = core.gpu.allocate(Category.QUANTIZED_REDUCE, partition,
                                        f"qgZ running sum {tensor.name}")
            yield from kernel(sums)
            core.gpu.free(Category.QUANTIZED_REDUCE, running)
        return work

    def _reduce_scatter(self, tensor: _Tensor, bucket: _Bucket, stream: InOrderStream,
                        turn: NcclTurn, key: tuple) -> Callable[[], Gen]:
        """`reduce_scatter_coalesced([tensor])`: a tensor that divides evenly is used as it
        is, another is padded into a flat buffer (`torch.cat` of its rank chunks); then the
        pre-divide over it and the reduce-scatter over every rank, after what was issued on
        the data-parallel group before it."""
        core = self.core
        ranks = len(core.ranks)
        n = tensor.numel
        padded = 0 if n % ranks == 0 else math.ceil(n / ranks) * ranks
        before_s = core.hbm_seconds(core.comm_bytes * (padded + (padded or n)))

        def work() -> Gen:
            bucket.partitions.append(core.gpu.allocate(
                Category.GRAD_PARTITIONS, core.comm_bytes * padded, "reduce-scatter buffer"))
            yield from core.gpu_kernel(before_s, stream)
            yield from turn.wait()
            yield from core.machine.collective(core.rank, key, Collective.REDUCE_SCATTER,
                                               core.comm_bytes * n, core.ranks)
            turn.done()
        return work
