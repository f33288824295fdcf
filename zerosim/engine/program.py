"""A rank's iteration, composed of parts: forward, bucketed backward, optimizer step.

The program only orders the work: which module runs when, with activation checkpointing's
recompute before each block's backward. What it takes to get a module's parameters, where
gradients go and how the optimizer steps are the parts `compose.py` picked for the scenario.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from zerosim.engine.gradients import GradientPath
from zerosim.engine.params import ParameterCoordinator
from zerosim.engine.rank import Gen, RankCore
from zerosim.engine.states import Holding
from zerosim.vocabulary import BufferKind, Category, DeviceKind, OpKind, Phase


class OptimizerStep(Protocol):
    def run(self) -> Gen: ...


class RankProgram:
    def __init__(self, core: RankCore, params: ParameterCoordinator, gradients: GradientPath,
                 optimizer: OptimizerStep, states: list[Holding], *,
                 background: tuple[Callable[[], None], ...] = ()):
        self.core = core
        self.params = params
        self.gradients = gradients
        self.optimizer = optimizer
        self.states = states
        self.background = background
        """What the iteration finds running as it starts (ZenFlow's optimizer process,
        stepping the previous window's gradients): each started with the iteration."""
        self.held: list[tuple[Holding, int]] = []
        self.recomputed_bytes = 0.0
        """The activations the last recomputed block saved: freed by its backward, they are
        back in the cache when the next block is recomputed."""
        runtime = core.ctx.scenario.runtime
        self.checkpoint_in_cpu = runtime.checkpoint_in_cpu
        self.synchronize_each_layer = runtime.synchronize_each_layer
        self.host_checkpoints: dict[int, int] = {}
        """Per block's first module, the host bytes holding the block's input
        (`checkpoint_in_cpu`), from its forward to its recompute."""

    def run(self) -> Gen:
        """The iteration's phases, with the engine's memory reports around each (none unless
        `memory_breakdown`); as the iteration is measured from one step's end to the next,
        the framework's per-step work and the report after the last step come first. Then
        what the step left running past its timer (the interleaved step's helper thread, which
        overlaps the next iteration's forward) finishes before the model states are let go."""
        self.hold_model_states()
        for start in self.background:
            start()
        steps = self.core.ds.gradient_accumulation_steps
        core = self.core
        managed = core.ds.managed_accumulation  # else step() is the boundary (`compose`)
        yield from core.host_time(core.step_s, OpKind.LOOP)
        yield from core.report_memory()
        for micro in range(steps):
            yield from core.host_time(core.micro_batch_s, OpKind.LOOP)
            yield from core.report_memory()
            yield from self.forward(micro)
            yield from core.report_memory(calls=2)
            yield from self.backward(micro, boundary=managed and micro == steps - 1)
            yield from core.report_memory()
        yield from core.report_memory()
        yield from self.params.release_all()
        yield from self.optimizer.run()
        yield from core.synchronize()
        self.release_model_states()

    def _pool(self, holding: Holding):
        return {DeviceKind.GPU: self.core.gpu, DeviceKind.HOST: self.core.host,
                DeviceKind.NVME: self.core.nvme}[holding.device]

    def hold_model_states(self) -> None:
        for holding in self.states:
            amount = self._pool(holding).allocate(holding.category, holding.nbytes,
                                                  holding.what, holding.buffer)
            self.held.append((holding, amount))

    def release_model_states(self) -> None:
        """Static buffers outlive the iteration; release them so the end-of-run check can
        verify that every transient allocation was freed."""
        for holding, amount in self.held:
            self._pool(holding).free(holding.category, amount, holding.buffer)
        self.held = []

    def _pre_hook(self, index: int, *, backward: bool, reverse: bool = False) -> Gen:
        """The hooks before module `index` runs (going forward, or `reverse`: its backward):
        for a module with parameters, host time and its fetch; for every module under ZeRO-3,
        a prefetch ahead (`backward`: in the backward's order) and the launches of the
        collectives just issued. A ZeRO-3 leaf's hooks fire once, before its first module
        going forward and its last going back, and fetch everything in it; no hook fires
        before its other modules (`Plan.forward_hooks`). A tiled MLP's parameters are fetched
        there too, each of its modules paying its own hooks and every slice calling them again
        (`Plan.tiled`), as a tiled loss's output layer's slices do. Returns the fetch's event,
        if any."""
        core = self.core
        plan = core.plan
        target = (plan.backward_hooks if reverse else plan.forward_hooks)[index]
        if target is None:
            return None
        ready = None
        if plan.modules[target].params:
            if self.params.module_hooks:
                repeats = (0 if target in plan.leaves
                           else plan.modules[target].repeated_hooks[reverse])
                yield from core.fetch_hooks(plan.leaves.get(target, 1),
                                            apart=plan.tiled.get(target, 1), repeats=repeats)
            ready = self.params.fetch(target)
            ready = yield from self.params.wait_ongoing(target, ready)
        if self.params.module_hooks:
            if waits := self.params.prefetch_after(target, backward):
                yield from waits
            yield from core.pay_launches()
        return ready

    def forward(self, micro: int) -> Gen:
        core = self.core
        core.begin(Phase.FORWARD, micro)
        self.params.reset_step(micro)
        yield from self.params.fetch_external()
        yield from core.pay_launches()
        released_after = self._released_after_forward()
        for index, module in enumerate(core.plan.modules):
            if module.checkpoint_bytes:
                yield from self._checkpoint_forward_starts(index)
            yield from self._forward_module(index, OpKind.FORWARD, module.saved_bytes,
                                            backward=False)
            for owner in released_after[index]:
                if not self.params.keep_after_forward(owner) and (
                        waits := self.params.release(owner, backward=False)):
                    yield from waits
            if self.synchronize_each_layer and self._last_of_block(index):
                yield from core.synchronize()
        yield from core.end(host_waits=False)

    def _checkpoint_forward_starts(self, index: int) -> Gen:
        """`deepspeed.checkpointing.checkpoint`'s forward before it runs the block: with
        `synchronize_each_layer` a device synchronize; with `checkpoint_in_cpu` the block's
        input copied to a new pageable host tensor (`.to('cpu')`, or the `.cpu()` of Arctic
        Long Sequence Training's CheckpointFunction: the host waits for the compute stream,
        which makes the input, then for the copy; the staging thread faults fresh pages in
        first)."""
        core = self.core
        if self.synchronize_each_layer:
            yield from core.synchronize()
        if not self.checkpoint_in_cpu:
            return
        module = core.plan.modules[index]
        nbytes = module.checkpoint_bytes
        if (pending := core.compute.idle_event()) is not None:
            yield pending
        self.host_checkpoints[index] = core.host.allocate(
            Category.ACTIVATIONS, nbytes, f"checkpoint {module.name}", BufferKind.PAGEABLE)
        if core.gets_fresh_pages(nbytes):
            yield from core.cpu_work(f"zero pages checkpoint {module.name}", OpKind.ZERO_PAGES,
                                     core.machine.zero_pages(core.rank, nbytes, threads=1),
                                     nbytes=nbytes)
        yield from core.dma("d2h", nbytes, pinned=False, op=f"checkpoint {module.name}",
                            kind=OpKind.CHECKPOINT_TO_HOST)

    def _released_after_forward(self) -> dict[int, tuple[int, ...]]:
        """The modules whose gathered params the host releases after each module's forward:
        its own, unless they stay gathered for the modules after it (`keeps_gathered_for`)."""
        after: dict[int, tuple[int, ...]] = {}
        for index, module in enumerate(self.core.plan.modules):
            last = index + module.keeps_gathered_for
            after[last] = (*after.get(last, ()), index)
            after.setdefault(index, ())
        return after

    def backward(self, micro: int, *, boundary: bool) -> Gen:
        core = self.core
        core.begin(Phase.BACKWARD, micro)
        self.recomputed_bytes = 0.0
        modules = core.plan.modules
        counting = core.behaviours.used_params_counted if core.ds.stage > 0 else "never"
        phase_starts = True
        for index in range(len(modules) - 1, -1, -1):
            module = modules[index]
            if core.ctx.scenario.activation_checkpointing and self._last_of_block(index):
                yield from self.recompute_block(module.layer)
                phase_starts = True
            if module.backward_host_syncs:
                yield from core.wait_for_stream(core.compute, module.backward_host_syncs)
            ready = yield from self._pre_hook(index, backward=True, reverse=True)
            yield from core.issue_kernels(core.ctx.costs.backward_launches[index])
            body = core.backward_body(index, core.ctx.costs.backward_s[index],
                                      on_end=lambda i=index: self.gradients.store.produce(i))
            done = yield from core.launch_with_exchanges(
                index, body, f"backward {module.name}", OpKind.BACKWARD, backward=True,
                after=(ready,))
            once = index in core.plan.leaves
            for k, param in enumerate(core.plan.params[index]):
                if ((counting == "every_hook" and not (once and k))
                        or (counting == "per_phase" and phase_starts)):
                    yield from core.host_time(core.count_used_params_s, OpKind.USED_PARAM_CHECK)
                    phase_starts = False
                yield from self.gradients.add(param, done, micro, boundary)
            if waits := self.params.release(index, backward=True):
                yield from waits
            if self.synchronize_each_layer and module.checkpoint_bytes:
                yield from core.synchronize()
        yield from self.gradients.epilogue(micro, boundary)
        yield from self.params.release_after_backward()
        yield from core.end()

    def _last_of_block(self, index: int) -> bool:
        modules = self.core.plan.modules
        layer = modules[index].layer
        is_last = index + 1 == len(modules) or modules[index + 1].layer != layer
        return layer is not None and is_last

    def recompute_block(self, layer: int) -> Gen:
        """Activation checkpointing: re-run the block's forward before its backward."""
        core = self.core
        core.release_device_memory(self.recomputed_bytes)
        self.recomputed_bytes = 0.0
        if self.synchronize_each_layer:
            yield from core.synchronize()
        for index, module in enumerate(core.plan.modules):
            if module.layer != layer:
                continue
            if index in self.host_checkpoints:
                yield from self._checkpoint_back_to_gpu(index)
            self.recomputed_bytes += module.recompute_bytes
            yield from self._forward_module(index, OpKind.RECOMPUTE, module.recompute_bytes,
                                            backward=True)

    def _checkpoint_back_to_gpu(self, index: int) -> Gen:
        """`checkpoint_in_cpu`: the block's input back to the GPU before its recompute
        (`move_to_device`: a blocking pageable H2D after what the compute stream holds), held
        there until its first module's backward, as the input kept on the GPU would be; the
        host tensor goes."""
        core = self.core
        module = core.plan.modules[index]
        nbytes = module.checkpoint_bytes
        if (pending := core.compute.idle_event()) is not None:
            yield pending
        held = core.gpu.allocate(Category.ACTIVATIONS, nbytes, module.name)
        core.activations[index] = core.activations.get(index, 0) + held
        yield from core.host_time(core.reserve_s(held), OpKind.CUDA_MALLOC)
        yield from core.dma("h2d", nbytes, pinned=False, op=f"checkpoint {module.name}",
                            kind=OpKind.CHECKPOINT_FROM_HOST)
        core.host.free(Category.ACTIVATIONS, self.host_checkpoints.pop(index),
                       BufferKind.PAGEABLE)

    def _forward_module(self, index: int, kind: OpKind, saved_bytes: float, *,
                        backward: bool) -> Gen:
        """A module's forward (or its recompute, which prefetches in the backward's order):
        hooks and fetch, then its kernels queued."""
        core = self.core
        module = core.plan.modules[index]
        if module.host_syncs:
            yield from core.wait_for_stream(core.compute, module.host_syncs)
        ready = yield from self._pre_hook(index, backward=backward)
        yield from core.issue_kernels(core.ctx.costs.forward_launches[index],
                                      saved_bytes + module.transient_bytes)
        core.release_device_memory(module.transient_bytes)
        label = "forward" if kind == OpKind.FORWARD else "recompute"
        body = core.forward_body(index, core.ctx.costs.forward_s[index], saved_bytes)
        yield from core.launch_with_exchanges(index, body, f"{label} {module.name}", kind,
                                              backward=False, after=(ready,))
