"""What zerosim replays, decided in one place when a scenario is resolved, so `zerosim check`,
the sweep pre-check and `zerosim run` refuse exactly the same configurations."""

from __future__ import annotations

from typing import Any

from zerosim.errors import UnsupportedConfigError

ZERO = "deepspeed.zero_optimization"


def check_supported(scenario: Any) -> None:
    """Raise `UnsupportedConfigError` for a configuration the engine does not replay."""
    for rule in (_offload_needs_zero, _param_offload_needs_stage3, _nvme_not_yet,
                 _param_offload_needs_optimizer_offload, _twin_flow_needs_offload,
                 _what_ifs_need_offloaded_stage3):
        rule(scenario)


def _refuse(scenario: Any, key: str, expected: str, got: Any) -> None:
    raise UnsupportedConfigError(scenario.source, key, expected, got)


def _offload_needs_zero(scenario: Any) -> None:
    ds = scenario.deepspeed
    if ds.stage == 0 and ds.offload_optimizer.enabled:
        _refuse(scenario, f"{ZERO}.offload_optimizer.device",
                "'none' at stage 0 (DeepSpeed offloads the optimizer only under ZeRO 1-3)",
                ds.offload_optimizer.device)


def _param_offload_needs_stage3(scenario: Any) -> None:
    ds = scenario.deepspeed
    if ds.stage < 3 and ds.offload_param.enabled:
        _refuse(scenario, f"{ZERO}.offload_param.device",
                f"'none' below stage 3 (parameter offload is a ZeRO-3 feature; stage is "
                f"{ds.stage})", ds.offload_param.device)


def _nvme_not_yet(scenario: Any) -> None:
    ds = scenario.deepspeed
    for name, settings in (("offload_optimizer", ds.offload_optimizer),
                           ("offload_param", ds.offload_param)):
        if settings.device == "nvme":
            _refuse(scenario, f"{ZERO}.{name}.device",
                    "'cpu' or 'none' (the NVMe tier is not modelled yet)", settings.device)


def _param_offload_needs_optimizer_offload(scenario: Any) -> None:
    ds = scenario.deepspeed
    if ds.offload_param.enabled and not ds.offload_optimizer.enabled:
        _refuse(scenario, f"{ZERO}.offload_optimizer.device",
                "the optimizer offloaded too when parameters are (zerosim does not model "
                "parameter offload with the optimizer on the GPU)", ds.offload_optimizer.device)


def _twin_flow_needs_offload(scenario: Any) -> None:
    ds = scenario.deepspeed
    if ds.offload_optimizer.ratio < 1 and not ds.offload_optimizer.enabled:
        _refuse(scenario, f"{ZERO}.offload_optimizer.ratio",
                "1.0 unless the optimizer is offloaded (Twin-Flow splits offloaded state)",
                ds.offload_optimizer.ratio)


def _what_ifs_need_offloaded_stage3(scenario: Any) -> None:
    ds, what_if = scenario.deepspeed, scenario.what_if
    for name in ("overlap_copy_back", "buffer_boundary_grads", "gpu_update_every"):
        if getattr(what_if, name) and (ds.stage < 3 or not ds.offload_optimizer.enabled):
            _refuse(scenario, f"what_if.{name}",
                    "off unless ZeRO stage 3 offloads the optimizer (the study's what-ifs "
                    f"change that replay; stage {ds.stage}, offload_optimizer "
                    f"{ds.offload_optimizer.device})", getattr(what_if, name))
