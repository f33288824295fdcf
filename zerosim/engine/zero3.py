"""ZeRO-3 with the optimizer offloaded to the CPU: one rank's iteration, as DeepSpeed runs it.

Follows deepspeed/runtime/zero/stage3.py and partitioned_param_coordinator.py (0.13.3, with
the boundary-flush changes of later versions): per-module all-gather with prefetch, release
after use unless the module comes back within `stage3_max_reuse_distance`, IPG buckets
reduce-scattered on their own stream, `partition_grads` moving each parameter's gradient
partition to the host accumulation buffer, and a sub-group by sub-group CPU optimizer step.
"""

from __future__ import annotations

from collections import deque

import simpy

from zerosim.engine.plan import Param
from zerosim.engine.rank import Gen, RankProgram, RunContext
from zerosim.engine.software import DEVICE_SCALAR_BYTES, MAX_PARAM_REDUCE_EVENTS
from zerosim.hardware import costs
from zerosim.scenario.version import Version

FP32_BYTES = 4
BOUNDARY_CAST_ON_GPU_FROM: Version = (0, 15, 4)
"""After 0.15.3 the boundary flush casts to fp32 on the GPU before a blocking D2H."""
BOUNDARY_NONBLOCKING_FROM: Version = (0, 19, 5)
"""From 0.19.5 that D2H is non-blocking and overlaps the backward."""


class Zero3Rank(RankProgram):
    def __init__(self, ctx: RunContext, rank: int):
        super().__init__(ctx, rank)
        n = len(self.plan.modules)
        self.gathered: list[simpy.Event | None] = [None] * n
        self.gathered_bytes = [0] * n
        self.is_gathered = [False] * n
        self.live_numel = 0
        self.trace = [i for i in range(n) if self.plan.gathered_numel[i] > 0]
        self.trace_position = {m: pos for pos, m in enumerate(self.trace)}
        self.bucket: list[tuple[Param, int, bool]] = []
        self.bucket_numel = 0
        self.grads: dict[tuple[int, int], int] = {}
        self.reduce_events: deque[simpy.Event] = deque()
        self.version = ctx.scenario.runtime.deepspeed_version
        self.offload_param = self.ds.offload_param.enabled
        self.checkpointing = ctx.scenario.activation_checkpointing
        self.reduce_kind = "reduce_scatter" if self.ds.reduce_scatter else "all_reduce"
        self.what_if = ctx.scenario.what_if
        self.buffering = False

    # ------------------------------------------------------------------ iteration

    def run(self) -> Gen:
        self.allocate_model_states()
        steps = self.ds.gradient_accumulation_steps
        for micro in range(steps):
            yield from self.forward(micro)
            yield from self.backward(micro, boundary=micro == steps - 1)
        yield from self.step()
        self.free_model_states()

    def allocate_model_states(self) -> None:
        plan, gpu, host = self.plan, self.gpu, self.host
        part = plan.partition_numel
        gpu.allocate("runtime context", self.profile.runtime_context_bytes, "CUDA context")
        if self.offload_param:
            kind = "pinned" if self.ds.offload_param.pin_memory else "pageable"
            host.allocate(f"params 16-bit ({kind})", self.dtype_bytes * part, "fp16 partition")
        else:
            gpu.allocate("params 16-bit", self.dtype_bytes * part, "fp16 partition")
        gpu.allocate("params persistent", self.dtype_bytes * plan.persistent_numel,
                     "persistent params")
        if self.ds.contiguous_gradients:
            gpu.allocate("ipg bucket", self.comm_bytes * self.ds.reduce_bucket_size,
                         "IPG bucket buffer")
        kind = "pinned" if self.pinned else "pageable"
        on_cpu, on_gpu = plan.numel_on("cpu"), plan.numel_on("gpu")
        host.allocate("fp32 master params", FP32_BYTES * on_cpu, "fp32 partition")
        host.allocate("optimizer states", 2 * FP32_BYTES * on_cpu, "exp_avg, exp_avg_sq")
        host.allocate(f"fp32 grads ({kind})", FP32_BYTES * on_cpu, "fp32 gradients")
        host.allocate(f"grad accumulation ({kind})", self.accum_bytes * part,
                      "host gradient accumulation buffer")
        gpu.allocate("fp32 master params (GPU)", FP32_BYTES * on_gpu, "Twin-Flow fp32 partition")
        gpu.allocate("optimizer states (GPU)", 2 * FP32_BYTES * on_gpu, "Twin-Flow Adam states")
        gpu.allocate("fp32 grads (GPU)", FP32_BYTES * on_gpu, "Twin-Flow fp32 gradients")

    def free_model_states(self) -> None:
        """Static buffers outlive the iteration; release them so the end-of-run check can
        verify that every transient allocation was freed."""
        for pool in (self.gpu, self.host):
            for category in list(pool.levels):
                if category in STATIC_CATEGORIES or category.split(" (")[0] in STATIC_CATEGORIES:
                    pool.free(category, pool.levels[category])

    # ------------------------------------------------------------------ parameters

    def fetch(self, index: int) -> simpy.Event | None:
        """All-gather a module's params unless they are gathered or on their way."""
        if self.is_gathered[index] or self.plan.gathered_numel[index] == 0:
            return self.gathered[index]
        numel = self.plan.gathered_numel[index]
        self.is_gathered[index] = True
        self.live_numel += numel
        if len(self.ranks) == 1 and not self.offload_param:
            self.gathered[index] = None
            return None
        module = self.plan.modules[index]
        key = self.next_key("all_gather")
        self.launches += len(self.ranks) > 1
        partition = sum(p.partition_numel for p in self.plan.params[index] if not p.persistent)

        def body() -> Gen:
            self.gathered_bytes[index] = self.gpu.allocate(
                "params gathered", self.dtype_bytes * numel, module.name)
            if self.offload_param:
                yield from self.dma("h2d", self.dtype_bytes * partition,
                                    pinned=self.ds.offload_param.pin_memory,
                                    op=f"fetch {module.name}")
            yield from self.machine.collective(self.rank, key, "all_gather",
                                               self.dtype_bytes * numel, self.ranks)

        event = self.allgather.launch(f"all-gather {module.name}", body,
                                      nbytes=self.dtype_bytes * numel)
        self.gathered[index] = event
        return event

    def prefetch(self, position: int, order: list[int]) -> None:
        """Fetch ahead in trace order up to `stage3_prefetch_bucket_size` numel, within
        `stage3_max_live_parameters`."""
        budget = min(self.ds.stage3_prefetch_bucket_size,
                     self.ds.stage3_max_live_parameters - self.live_numel)
        issued = 0
        for index in order[position:]:
            if issued >= budget:
                return
            if self.is_gathered[index]:
                continue
            numel = self.plan.gathered_numel[index]
            if self.live_numel + numel > self.ds.stage3_max_live_parameters:
                return
            self.fetch(index)
            issued += numel

    def release(self, index: int, after: simpy.Event | None) -> None:
        if not self.is_gathered[index]:
            return
        self.is_gathered[index] = False
        self.live_numel -= self.plan.gathered_numel[index]
        gathered = self.gathered[index]
        self.gathered[index] = None

        def free() -> None:
            self.gpu.free("params gathered", self.gathered_bytes[index])
            self.gathered_bytes[index] = 0

        self.when_done(after if after is not None else gathered, free)

    def release_all(self) -> None:
        for index in self.trace:
            self.release(index, self.gathered[index])

    # ------------------------------------------------------------------ forward

    def forward(self, micro: int) -> Gen:
        self.begin("forward", micro)
        forward_order = self.trace
        for index, module in enumerate(self.plan.modules):
            ready = None
            if module.params:
                yield from self.host_overhead()
                ready = self.fetch(index)
                if index in self.trace_position:
                    self.prefetch(self.trace_position[index] + 1, forward_order)
                yield from self.pay_launches()
            done = self.compute.launch(
                f"forward {module.name}",
                self.forward_body(index, self.module_seconds(index, 1.0), module.saved_bytes),
                after=(ready,))
            if not self.plan.keep_after_forward[index]:
                self.release(index, done)
        yield from self.end()

    # ------------------------------------------------------------------ backward

    def backward(self, micro: int, *, boundary: bool) -> Gen:
        self.begin("backward", micro)
        backward_order = self.trace[::-1]
        position = {m: pos for pos, m in enumerate(backward_order)}
        modules = self.plan.modules
        for index in range(len(modules) - 1, -1, -1):
            module = modules[index]
            if self.checkpointing and self._last_of_block(index):
                yield from self.recompute_block(module.layer)
            ready = None
            if module.params:
                yield from self.host_overhead()
                ready = self.fetch(index)
                if index in position:
                    self.prefetch(position[index] + 1, backward_order)
                yield from self.pay_launches()
            done = self.compute.launch(
                f"backward {module.name}",
                self.backward_body(index, self.module_seconds(index, costs.BACKWARD_FLOPS_FACTOR),
                                   on_end=lambda i=index: self.produce_grads(i)),
                after=(ready,))
            for param in self.plan.params[index]:
                yield from self.add_grad_to_bucket(param, done, micro, boundary)
            self.release(index, done)
        yield from self.epilogue(micro, boundary)
        yield from self.end()

    def _last_of_block(self, index: int) -> bool:
        modules = self.plan.modules
        layer = modules[index].layer
        is_last = index + 1 == len(modules) or modules[index + 1].layer != layer
        return layer is not None and is_last

    def recompute_block(self, layer: int) -> Gen:
        """Activation checkpointing: re-run the block's forward before its backward."""
        for index, module in enumerate(self.plan.modules):
            if module.layer != layer:
                continue
            ready = None
            if module.params:
                yield from self.host_overhead()
                ready = self.fetch(index)
            self.compute.launch(
                f"recompute {module.name}",
                self.forward_body(index, self.module_seconds(index, 1.0),
                                  module.recompute_bytes),
                after=(ready,))

    def produce_grads(self, index: int) -> None:
        for param in self.plan.params[index]:
            self.grads[(index, param.index)] = self.gpu.allocate(
                "grads", self.dtype_bytes * param.numel, self.plan.modules[index].name)

    def free_grad(self, param: Param) -> None:
        self.gpu.free("grads", self.grads.pop((param.module, param.index)))

    def add_grad_to_bucket(self, param: Param, produced: simpy.Event, micro: int,
                           boundary: bool) -> Gen:
        """`reduce_independent_p_g_buckets_and_remove_grads` + `__add_grad_to_ipg_bucket`."""
        size = self.ds.reduce_bucket_size
        if self.bucket and self.bucket_numel + param.numel > size:
            yield from self.reduce_bucket(micro, boundary)
        fits = self.ds.contiguous_gradients and self.bucket_numel + param.numel <= size
        nbytes = self.comm_bytes * param.numel
        if fits:
            copy = self.hbm_op(self.reduce, f"copy grad {self.plan.modules[param.module].name}",
                               nbytes, after=(produced,))
            self.when_done(copy, lambda: self.free_grad(param))
        else:
            self.reduce.launch("wait grad", self.gpu_time(0.0), after=(produced,))
        self.bucket.append((param, param.partition_numel, fits))
        self.bucket_numel += param.numel

    # ------------------------------------------------------------------ reduction

    def reduce_bucket(self, micro: int, boundary: bool) -> Gen:
        """`__reduce_and_partition_ipg_grads`: reduce-scatter, then `partition_grads`."""
        while self.reduce_events and self.reduce_events[0].processed:
            self.reduce_events.popleft()
        if len(self.reduce_events) > MAX_PARAM_REDUCE_EVENTS:
            yield self.reduce_events.popleft()
        bucket, numel = self.bucket, self.bucket_numel
        self.bucket, self.bucket_numel = [], 0
        key = self.next_key(self.reduce_kind)
        self.launches += len(self.ranks) > 1
        yield from self.pay_launches()
        out_bytes = self.comm_bytes * sum(part for _, part, _ in bucket)
        holder: dict[str, int] = {}

        def scatter() -> Gen:
            holder["out"] = self.gpu.allocate("grad partitions", out_bytes, "reduce-scatter out")
            if len(self.ranks) > 1:
                yield from self.machine.collective(self.rank, key, self.reduce_kind,
                                                   self.comm_bytes * numel, self.ranks)
            else:
                yield self.env.timeout(costs.hbm_copy_s(self.comm_bytes * numel, self.profile))
            for param, _, fits in bucket:
                if not fits:
                    self.free_grad(param)

        self.reduce.launch(f"{self.reduce_kind.replace('_', '-')} {numel / 1e6:.0f}M", scatter,
                           nbytes=self.comm_bytes * numel)
        moved = self.accum_bytes * sum(part for _, part, _ in bucket)
        self._decide_buffering(bucket, boundary)
        done = self.reduce.launch(f"partition grads {len(bucket)} params",
                                  self._partition_bucket(bucket, micro, boundary), nbytes=moved)
        self.when_done(done, lambda: self.gpu.free("grad partitions", holder["out"]))
        self.reduce_events.append(done)
        if self._host_blocks(boundary):
            yield done

    def _host_blocks(self, boundary: bool) -> bool:
        """Whether `partition_grads` holds the host thread until its copies are done: any copy
        to or from pageable memory, and the boundary flush of DeepSpeed < 0.19.5 (unless the
        bucket's gradients are buffered on the GPU, the what-if)."""
        if not self.pinned:
            return True
        return boundary and self.version < BOUNDARY_NONBLOCKING_FROM and not self.buffering

    def _decide_buffering(self, bucket: list[tuple[Param, int, bool]], boundary: bool) -> None:
        """Buffer a boundary bucket on the GPU only if its gradients fit in free HBM now."""
        need = self.accum_bytes * sum(part for _, part, _ in bucket)
        self.buffering = (boundary and self.what_if.buffer_boundary_grads
                          and self.gpu.used + need <= self.gpu.capacity)

    def _partition_bucket(self, bucket: list[tuple[Param, int, bool]], micro: int,
                          boundary: bool):
        """`partition_grads`: per parameter, in order on the reduce stream, move (first
        micro-batch) or accumulate (later ones) its partition through the host buffer, and at
        the boundary send the fp32 gradient to the host. The host thread issues these copies
        one by one; when one blocks, it waits for everything before it on the stream, so the
        whole bucket is one in-order op that the host may wait for."""
        def body() -> Gen:
            for param, _, _ in bucket:
                yield from self._partition_param(param, micro, boundary)
        return body

    def _partition_param(self, param: Param, micro: int, boundary: bool) -> Gen:
        name = self.plan.modules[param.module].name
        acc = self.accum_bytes * param.partition_numel
        if micro == 0:
            yield from self.dma("d2h", acc, pinned=self.pinned, op=f"grad → accum {name}")
            buffer = self.gpu.allocate("grad partitions", acc, f"grad buffer {name}")
            yield from self.dma("h2d", acc, pinned=self.pinned, op=f"accum → GPU {name}")
        else:
            buffer = self.gpu.allocate("grad partitions", acc, f"grad buffer {name}")
            yield from self.dma("h2d", acc, pinned=self.pinned, op=f"accum → GPU {name}")
            yield self.env.timeout(costs.hbm_copy_s(acc, self.profile, passes=3.0))
            yield from self.dma("d2h", acc, pinned=self.pinned, op=f"accum → host {name}")
        if boundary:
            yield self.env.timeout(costs.hbm_copy_s(acc, self.profile, passes=1.0))
            yield from self.flush_fp32_grad(param, name)
        self.gpu.free("grad partitions", buffer)

    def flush_fp32_grad(self, param: Param, name: str) -> Gen:
        """The boundary's fp32 gradient to the host, as each DeepSpeed version does it. With
        fp32 accumulation the buffer already holds fp32: a plain D2H, no cast."""
        elements = param.partition_numel
        fp32 = FP32_BYTES * elements
        if self.plan.on_gpu(param):
            yield self.env.timeout(costs.hbm_copy_s(
                (self.accum_bytes + FP32_BYTES) * elements, self.profile, passes=1.0))
            return
        if self.buffering:
            yield from self._buffer_and_flush_async(elements, name)
            return
        if self.ds.grad_accum_dtype == "fp32":
            yield from self.dma("d2h", fp32, pinned=self.pinned, op=f"fp32 flush {name}")
            return
        if self.version < BOUNDARY_CAST_ON_GPU_FROM:
            yield from self._flush_via_cpu_cast(elements, name)
            return
        temp = self.gpu.allocate("grad partitions", fp32, f"fp32 cast {name}")
        yield self.env.timeout(costs.hbm_copy_s(fp32, self.profile, passes=1.5))
        yield from self.dma("d2h", fp32, pinned=self.pinned, op=f"fp32 grad {name}")
        self.gpu.free("grad partitions", temp)

    def _buffer_and_flush_async(self, elements: int, name: str) -> Gen:
        """What-if (study section 4): keep the boundary gradient in GPU memory freed by the
        activations and flush it in the background: a D2H on its own stream, then the cast
        into the fp32 buffer by a host helper thread. Nothing waits for it until the step."""
        nbytes = self.accum_bytes * elements
        buffered = self.gpu.allocate("boundary grad buffer", nbytes, f"buffered grad {name}")
        yield self.env.timeout(costs.hbm_copy_s(nbytes, self.profile))

        def flush() -> Gen:
            yield from self.dma("d2h", nbytes, pinned=self.pinned, op=f"async flush {name}")
            self.gpu.free("boundary grad buffer", buffered)
            if self.accum_bytes != FP32_BYTES:
                yield from self.cpu_work(
                    f"cast fp16→fp32 {name}",
                    self.machine.elementwise(self.rank, elements,
                                             costs.HostBytes(home=self.accum_bytes + FP32_BYTES),
                                             threads=self.profile.cast_threads),
                    nbytes=nbytes, track="cpu.flush")

        self.streams["flush"].launch(f"async flush {name}", flush, nbytes=nbytes)

    def _flush_via_cpu_cast(self, elements: int, name: str) -> Gen:
        """PyTorch's blocking cross-dtype D2H: a D2H into a fresh pageable 16-bit temporary,
        then a cast into the fp32 buffer on the CPU."""
        temp_bytes = self.dtype_bytes * elements
        temp = self.host.allocate("pageable temporaries", temp_bytes, f"fp16 temp {name}")
        yield from self.cpu_work(f"zero pages {name}", self.machine.zero_pages(
            self.rank, temp_bytes, threads=1, label=f"zero pages {name}"), nbytes=temp_bytes)
        yield from self.dma("d2h", temp_bytes, pinned=False, op=f"fp32 flush {name}")
        yield from self.cpu_work(
            f"cast fp16→fp32 {name}",
            self.machine.elementwise(self.rank, elements,
                                     costs.HostBytes(home=self.dtype_bytes + FP32_BYTES),
                                     threads=self.profile.cast_threads),
            nbytes=temp_bytes)
        self.host.free("pageable temporaries", temp)

    def epilogue(self, micro: int, boundary: bool) -> Gen:
        """`independent_gradient_partition_epilogue`: the last bucket, then synchronize."""
        if self.bucket:
            yield from self.reduce_bucket(micro, boundary)
        yield from self.synchronize()
        self.release_all()

    # ------------------------------------------------------------------ optimizer step

    def step(self) -> Gen:
        self.begin("update", self.ds.gradient_accumulation_steps - 1)
        part = self.plan.partition_numel
        if self.ds.dtype == "fp16":
            yield from self.cpu_work("overflow check", self.machine.elementwise(
                self.rank, part, costs.OVERFLOW_CHECK_HOST_BYTES))
            yield from self.machine.collective(self.rank, self.next_key("all_reduce"),
                                               "all_reduce", DEVICE_SCALAR_BYTES, self.ranks)
        yield from self.machine.collective(self.rank, self.next_key("all_reduce"), "all_reduce",
                                           DEVICE_SCALAR_BYTES, self.ranks)
        for group, elements in enumerate(self.optimizer_groups()):
            if group in self.plan.gpu_subgroups:
                self.step_resident_on_gpu(group, elements)
            elif self.steps_on_gpu(group):
                self.step_prefetched_on_gpu(group, elements)
            else:
                yield from self.update_subgroup(group, elements)
        self.after_step()
        yield from self.end()

    def optimizer_groups(self) -> tuple[int, ...]:
        """ZeRO-3 steps sub-group by sub-group (`sub_group_size`)."""
        return self.plan.subgroups

    def after_step(self) -> None:
        """`_post_step`: persistent parameters are re-gathered."""
        if self.plan.persistent_numel and len(self.ranks) > 1:
            self.gather_all("all-gather persistent params",
                            self.dtype_bytes * self.plan.persistent_numel)

    def gather_all(self, op: str, nbytes: float) -> simpy.Event:
        key = self.next_key("all_gather")

        def body() -> Gen:
            yield from self.machine.collective(self.rank, key, "all_gather", nbytes, self.ranks)

        return self.allgather.launch(op, body, nbytes=nbytes)

    def steps_on_gpu(self, group: int) -> bool:
        """What-if: every k-th sub-group is updated on the GPU (`what_if.gpu_update_every`)."""
        every = self.what_if.gpu_update_every
        return every > 0 and (group + 1) % every == 0

    def step_resident_on_gpu(self, group: int, elements: int) -> None:
        """Twin-Flow: the sub-group's fp32 state lives in HBM; unscale, Adam and the cast to
        16 bits are GPU kernels the host launches without waiting."""
        seconds = costs.hbm_copy_s(costs.GPU_STEP_BYTES_PER_ELEMENT * elements, self.profile,
                                   passes=1.0)
        self.compute.launch(f"gpu adam sub-group {group}", self.gpu_time(seconds),
                            nbytes=costs.GPU_STEP_BYTES_PER_ELEMENT * elements)

    def step_prefetched_on_gpu(self, group: int, elements: int) -> None:
        """What-if (study section 4): bring the sub-group's fp32 state and gradient to the GPU
        on a stream of its own while the CPU steps the other sub-groups, update it there, send
        the state back; the 16-bit params are written on the GPU."""
        state = costs.GPU_STATE_BYTES_PER_ELEMENT * elements
        back = costs.GPU_STATE_WRITEBACK_BYTES_PER_ELEMENT * elements

        def body() -> Gen:
            held = self.gpu.allocate("prefetched optimizer state", state, f"sub-group {group}")
            yield from self.dma("h2d", state, pinned=self.pinned, op=f"state sub-group {group}")
            yield self.env.timeout(costs.hbm_copy_s(
                costs.GPU_STEP_BYTES_PER_ELEMENT * elements, self.profile, passes=1.0))
            yield from self.dma("d2h", back, pinned=self.pinned, op=f"state sub-group {group}")
            self.gpu.free("prefetched optimizer state", held)

        self.streams["optimizer.gpu"].launch(f"gpu adam sub-group {group}", body, nbytes=state)

    def update_subgroup(self, group: int, elements: int) -> Gen:
        m = self.machine
        yield from self.cpu_work(f"unscale sub-group {group}", m.elementwise(
            self.rank, elements, costs.UNSCALE_HOST_BYTES))
        yield from self.cpu_work(f"cpu adam sub-group {group}", m.cpu_kernel(
            self.rank, elements, host=costs.ADAM_HOST_BYTES,
            elements_per_s_per_thread=self.profile.adam_params_per_s_per_thread))
        if self.what_if.overlap_copy_back:
            self.streams["copy-back"].launch(
                f"copy-back sub-group {group}",
                lambda: self.copy_back(group, elements, "cpu.copy-back"))
        else:
            yield from self.copy_back(group, elements)

    def copy_back(self, group: int, elements: int, track: str = "cpu") -> Gen:
        """fp16_partition.copy_(fp32_partition): a CPU cast into a fresh pageable temporary,
        then a blocking H2D (or, with offload_param, the cast straight into the host copy).
        The what-if `overlap_copy_back` runs it on a helper thread (`track`)."""
        m = self.machine
        threads = self.profile.cast_threads
        if self.offload_param:
            cast = costs.HostBytes(home=FP32_BYTES + self.dtype_bytes)
            yield from self.cpu_work(f"cast fp32→16-bit sub-group {group}", m.elementwise(
                self.rank, elements, cast, threads=threads), track=track)
            return
        temp_bytes = self.dtype_bytes * elements
        temp = self.host.allocate("pageable temporaries", temp_bytes, f"sub-group {group} cast")
        yield from self.cpu_work(f"cast fp32→16-bit sub-group {group}",
                                 self._zero_then_cast(elements, temp_bytes, threads),
                                 track=track)

        def upload() -> Gen:
            yield from self.dma("h2d", temp_bytes, pinned=False, buffer=costs.SPREAD_PAGES,
                                op=f"params sub-group {group}")

        yield self.compute.launch(f"H2D params sub-group {group}", upload, nbytes=temp_bytes)
        self.host.free("pageable temporaries", temp)

    def _zero_then_cast(self, elements: int, temp_bytes: int, threads: float) -> Gen:
        """`fp32.to(16-bit)` on the CPU: the pool's threads fault in (zero) the fresh
        temporary's pages, so they spread like it, then read the fp32 master (home)."""
        yield from self.machine.zero_pages(self.rank, temp_bytes, threads=threads,
                                           where=costs.SPREAD_PAGES)
        yield from self.machine.elementwise(
            self.rank, elements, costs.HostBytes(home=FP32_BYTES, spread=self.dtype_bytes),
            threads=threads)


STATIC_CATEGORIES = {
    "runtime context", "params 16-bit", "params persistent", "ipg bucket", "fp32 master params",
    "optimizer states", "fp32 grads", "grad accumulation",
}
