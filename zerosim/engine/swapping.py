"""The NVMe tier (ZeRO-Infinity, DeepSpeed 0.13.3; docs/nvme.md has the code it follows).

`OptimizerSwapper`: around each swapped sub-group's CPU step, read its fp32 master, Adam
states and gradient in (16 B/element) and write master and states back (12 B/element);
`pipeline_read` reads the next swapped sub-group while this one steps, `pipeline_write` leaves
the write in flight until the next swap-out. In the boundary backward each gradient partition
of a swapped sub-group goes to NVMe asynchronously (4 B/element), and the step waits for those
writes first. `InMemoryStates` is the same interface when nothing is swapped.
`PartitionsOnNvme`: a module's 16-bit partition still on NVMe is read into a pinned swap buffer
(2 B/element) before its H2D and all-gather; after the step it is cast and written back.
"""

from __future__ import annotations

import simpy

from zerosim.engine.conditions import AllDone
from zerosim.engine.plan import Param
from zerosim.engine.rank import Gen, RankCore
from zerosim.engine.sinks import fp32_d2h, free_fp32_cast, gpu_cast
from zerosim.hardware import costs, nvme
from zerosim.units import FP32_BYTES
from zerosim.vocabulary import OpKind, Stream


class InMemoryStates:
    """The optimizer state stays in host memory: nothing to swap."""

    def swaps(self, param: Param) -> bool:
        return False

    def before_step(self) -> Gen:
        return
        yield

    def swap_in(self, group: int) -> Gen:
        return
        yield

    def swap_out(self, group: int) -> Gen:
        return
        yield

    def flush_gradient(self, param: Param, name: str) -> Gen:
        return
        yield

    def swap_out_gradients(self) -> Gen:
        return
        yield


class OptimizerSwapper:
    def __init__(self, core: RankCore):
        self.core = core
        self.settings = core.ds.offload_optimizer
        self.swapped = sorted(core.plan.nvme_subgroups)
        self.reads: dict[int, simpy.Event] = {}
        self.write: simpy.Event | None = None
        self.gradient_writes: list[simpy.Event] = []
        self.gradient_buffers = nvme.GradientSwapBuffers(
            self.settings.buffer_count, core.plan.largest_swapped_subgroup,
            thread_count=core.ds.aio.thread_count)
        self.held_gradients: list[tuple[int, str, int]] = []
        """(elements, module name, GPU allocation) of the fp32 gradients the current bucket
        has cast so far (`flush_gradient`)."""

    def swaps(self, param: Param) -> bool:
        return self.core.plan.subgroup_of[(param.module, param.index)] in self.swapped

    def _io(self, direction: str, nbytes: float, op: str, kind: OpKind) -> simpy.Event:
        return self.core.env.process(self.core.nvme_io(direction, nbytes, op=op, kind=kind))

    def _read(self, group: int) -> simpy.Event:
        elements = self.core.plan.subgroups[group]
        return self._io("read", nvme.OPTIMIZER_SWAP_IN_BYTES_PER_ELEMENT * elements,
                        f"swap in sub-group {group}", OpKind.SWAP_IN)

    def _write(self, group: int) -> simpy.Event:
        elements = self.core.plan.subgroups[group]
        return self._io("write", nvme.OPTIMIZER_SWAP_OUT_BYTES_PER_ELEMENT * elements,
                        f"swap out sub-group {group}", OpKind.SWAP_OUT)

    def flush_gradient(self, param: Param, name: str) -> Gen:
        """`partition_grads`: the gradient of a swapped sub-group is cast to fp32 on the GPU
        (`grad_buffer.float()`) and kept, with the rest of its bucket's, until the bucket's
        last gradient (`swap_out_gradients`)."""
        elements = param.partition_numel
        temp = yield from gpu_cast(self.core, elements, name)
        self.held_gradients.append((elements, name, temp))

    def swap_out_gradients(self) -> Gen:
        """`swap_out_gradients` at the end of a bucket: each fp32 gradient it kept goes into
        a pinned swap buffer (a blocking D2H); a full buffer is written to NVMe
        asynchronously, and when every buffer is full or in flight the host waits for all the
        writes (`nvme.GradientSwapBuffers`). The GPU copies are freed when it returns."""
        held, self.held_gradients = self.held_gradients, []
        for elements, name, _ in held:
            submitted, wait = self.gradient_buffers.insert(elements)
            self._write_gradients(submitted, f"a full buffer, before {name}")
            if wait:
                yield from self._wait_for_gradient_writes()
            yield from fp32_d2h(self.core, elements, name, pinned=True)
        for _, _, temp in held:
            free_fp32_cast(self.core, temp)

    def _write_gradients(self, elements: int, what: str) -> None:
        if elements:
            self.gradient_writes.append(self._io("write", FP32_BYTES * elements,
                                                 f"swap out grads: {what}", OpKind.SWAP_OUT))

    def _wait_for_gradient_writes(self) -> Gen:
        pending = [e for e in self.gradient_writes if not e.processed]
        self.gradient_writes = []
        if pending:
            yield AllDone(self.core.env, pending)

    def before_step(self) -> Gen:
        """`_flush_gradient_swapper`: the last, partly filled buffer is written and every
        gradient write finishes before the first swap-in."""
        self._write_gradients(self.gradient_buffers.release(), "the last buffer")
        yield from self._wait_for_gradient_writes()

    def swap_in(self, group: int) -> Gen:
        if group not in self.swapped:
            return
        read = self.reads.pop(group, None) or self._read(group)
        yield read
        following = self.swapped.index(group) + 1
        if self.settings.pipeline_read and following < len(self.swapped):
            later = self.swapped[following]
            self.reads[later] = self._read(later)

    def swap_out(self, group: int) -> Gen:
        if group not in self.swapped:
            return
        if not self.settings.pipeline_write:
            yield self._write(group)
            return
        if self.write is not None:
            yield self.write
        self.write = self._write(group)
        if group == self.swapped[-1]:
            yield self.write


class PartitionsOnNvme:
    """`offload_param: nvme`: partitions beyond `max_in_cpu` are read from NVMe into a pinned
    swap buffer before the H2D that precedes their all-gather."""

    always_gathers = True

    def bring(self, core: RankCore, index: int, partition_numel: int) -> Gen:
        name = core.plan.modules[index].name
        on_nvme = core.plan.params_on_nvme(index)
        if on_nvme:
            yield from core.nvme_io("read", core.dtype_bytes * on_nvme, op=f"swap in {name}",
                                    kind=OpKind.SWAP_IN)
        pinned = core.ds.offload_param.pin_memory or on_nvme == partition_numel
        yield from core.dma("h2d", core.dtype_bytes * partition_numel, pinned=pinned,
                            op=f"fetch {name}", kind=OpKind.PARAM_FETCH)


def cast_into_host_or_swap_out(core: RankCore, group: int, elements: int,
                               track: Stream) -> Gen:
    """After a sub-group's step with parameters offloaded: the cast writes the 16-bit values
    into host memory; the part of the sub-group on NVMe goes through the pinned pool and is
    written synchronously (`_partitioned_params_swap_out`, 2 B/element)."""
    cast = costs.HostBytes(home=FP32_BYTES + core.dtype_bytes)
    yield from core.cpu_work(f"cast fp32→16-bit sub-group {group}", OpKind.CAST,
                             core.machine.elementwise(core.rank, elements, cast,
                                                      threads=core.profile.cast_threads),
                             track=track)
    on_nvme = core.plan.subgroup_params_on_nvme(group)
    if on_nvme:
        yield from core.nvme_io("write", core.dtype_bytes * on_nvme,
                                op=f"swap out params sub-group {group}", kind=OpKind.SWAP_OUT)
