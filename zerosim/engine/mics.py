"""MiCS (DeepSpeed 0.9.2+, zero/mics.py): ZeRO-3 partitioned over shard groups of consecutive
ranks and replicated across them.

Most of what changes is which ranks: the plan partitions every parameter over the shard group
(`plan.plan_of`), and a rank's ZeRO collectives span that group (`RankCore.ranks`: MiCS's
optimizer replaces ZeRO-3's `dp_process_group` with `param_shard_group`), as do its
all-gathers (`MiCS_Init`'s `all_gather_coalesced` over `param_shard_group`, straight into
each parameter's buffer: `params.PartitionedParams`). The hierarchical all-gather and the
replicas' all-reduce add work; this module holds the latter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import simpy

from zerosim.engine.rank import Gen, RankCore
from zerosim.vocabulary import Collective, OpKind

if TYPE_CHECKING:
    from zerosim.engine.gradients import BucketEntry


class ReplicaAllReduce:
    """`MiCS_Optimizer.partition_grads`: once ZeRO-3 has moved a bucket's reduced partitions
    into the gradient buffers, at the accumulation boundary (`allreduce_mics_shard_grads`)
    the host divides each buffer by the number of replicas (`scale_tensors`: one `div_` a
    tensor) and all-reduces them across the replicas (`all_reduce_coalesced` over
    `param_repli_group`: one NCCL group call, in place), both on the reduction stream after
    the moves. An `AfterPartition` part of the gradient path."""

    def __init__(self, core: RankCore):
        self.core = core
        self.replicas = core.ctx.groups.replicas[core.rank]

    def after_partition(self, bucket: list[BucketEntry], moved: simpy.Event, boundary: bool) -> Gen:
        if not boundary:
            return
        core = self.core
        nbytes = core.accum_bytes * sum(entry.param.partition_numel for entry in bucket)
        key = core.next_key(Collective.ALL_REDUCE + " replicas", self.replicas)
        stream = core.reduction_stream
        yield from core.host_time(len(bucket) * core.kernel_launch_s + core.collective_launch_s,
                                  OpKind.COLLECTIVE_LAUNCH)

        def body() -> Gen:
            yield from core.gpu_kernel(core.hbm_seconds(nbytes), stream)
            yield from core.machine.collective(core.rank, key, Collective.ALL_REDUCE, nbytes,
                                               self.replicas)

        stream.launch(f"all-reduce {len(bucket)} partitions over {len(self.replicas)} "
                      "replicas", body, kind=OpKind.ALL_REDUCE, nbytes=nbytes)
