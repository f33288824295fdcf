"""Load a scenario YAML: apply `--set` overrides, validate, resolve model/hardware/ds_config."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from zerosim.behaviours import (
    Behaviours,
    empties_cache_each_phase,
    fork_build,
    fork_settings,
    resolve_behaviours,
    unknown_build_text,
)
from zerosim.errors import ScenarioError, ScenarioWarning
from zerosim.hardware.alternatives import OVERRIDE_KEY, Alternative, find_alternative
from zerosim.hardware.costs import (
    CpuPools,
    cpu_pools,
    superoffload_worker_threads,
    zenflow_worker_threads,
)
from zerosim.hardware.placement import CoreOrder
from zerosim.hardware.profile import (
    HardwareProfile,
    apply_overrides,
    builtin_profile_tree,
    flatten_overrides,
    parse_profile,
    profile_alternatives,
    profile_tree_from_file,
)
from zerosim.inputs import check_plausible, check_section, referenced_path
from zerosim.models import ModelSpec, fields_of, spec_from_hf_fields, spec_from_hf_file
from zerosim.models.catalog import require_catalog_model
from zerosim.scenario.deepspeed import DeepSpeedConfig, ForkBuildWarning, resolve_deepspeed
from zerosim.scenario.dsfile import read_ds_config
from zerosim.scenario.hf_trainer import AutoFill, Precision, TrainerArgs, TrainerContext
from zerosim.scenario.support import check_supported, warn_inert
from zerosim.scenario.validation import validate_section
from zerosim.scenario.version import Version, format_version, parse_version, version_label
from zerosim.stacks import DEFAULT_STACK, SoftwareStack, load_stack, resolve_stack
from zerosim.units import MS
from zerosim.yamlio import copy_tree, parse_scalar, read_yaml_file

DEFAULT_DEEPSPEED_VERSION = "0.13.3"
HARDWARE_REFERENCE_KEYS = {"profile", "file", "overrides", "alternative"}
DOCUMENT_SECTIONS = ("model", "hardware", "deepspeed")
"""Scenario keys holding another document, whose values are checked where it is resolved."""


class UnmodelledKeysWarning(ScenarioWarning):
    """ds_config keys that zerosim does not model: reported once per load, then ignored."""


class FrameworkOverriddenWarning(ScenarioWarning):
    """ds_config sections the replayed frameworks do not read (`FRAMEWORK_OVERRIDDEN_KEYS`)."""


class LegacyKeyWarning(ScenarioWarning):
    """A deprecated ds_config key, mapped as DeepSpeed maps it (`zerosim.scenario.legacy`)."""


class AutoDefaultWarning(ScenarioWarning):
    """An "auto" filled from a Hugging Face Trainer default the scenario did not state."""


# Hugging Face `attn_implementation` names and the attention path zerosim replays for each
# (`models.breakdown.Attention`): PyTorch's SDPA picks the flash or memory-efficient kernel for
# 16-bit causal attention, and neither stores the softmax probabilities; the stack says what
# each path copies around its kernel.
ATTENTION_NAMES = {"eager": "eager", "flash": "flash", "sdpa": "sdpa",
                   "flash_attention_2": "flash"}


class _Runtime(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    deepspeed_version: str = DEFAULT_DEEPSPEED_VERSION
    cpu_threads_per_rank: int | None = Field(None, ge=1)
    bind_cores_to_rank: StrictBool = False
    bind_core_list: CoreOrder = "by_gpu"
    empty_cache_each_phase: StrictBool | None = None
    framework: Any = None
    checkpoint_in_cpu: StrictBool = False
    synchronize_each_layer: StrictBool = False
    tiled_mlp_shards: Annotated[StrictInt, Field(ge=1)] | Literal["auto"] | None = None
    tiled_loss_shards: Annotated[StrictInt, Field(ge=1)] | Literal["auto"] | None = None
    liger_kernel: StrictBool = False


class WhatIf(BaseModel):
    """The study's proposed optimisations (section 4), off by default: see the README."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    overlap_copy_back: StrictBool = False
    buffer_boundary_grads: StrictBool = False
    gpu_update_every: int = Field(0, ge=0)


class _ScenarioRaw(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    name: str | None = None
    description: str = ""
    model: Any
    sequence_length: int = Field(ge=1)
    document_length: StrictInt | None = Field(None, ge=1)
    activation_checkpointing: StrictBool = False
    attention: Literal["eager", "flash", "sdpa", "flash_attention_2"] = "eager"
    hardware: Any
    data_parallel: int | None = Field(None, ge=1)
    deepspeed: Any = None
    precision: Precision | None = None
    trainer: TrainerArgs | None = None
    runtime: _Runtime = _Runtime()
    what_if: WhatIf = WhatIf()


@dataclass(frozen=True)
class Runtime:
    deepspeed_version: Version
    cpu_threads_per_rank: int | None
    build_label: str = ""
    """A source build's local label (`4570a955` of `0.13.3+4570a955`), or ""."""
    bind_cores_to_rank: bool = False
    """The launcher binds each rank's threads and memory to its part of the node, its GPU's
    NUMA domain where each GPU has one (DeepSpeed's `--bind_cores_to_rank` with a
    `--bind_core_list` in GPU order, or without one: `bind_core_list`;
    `hardware.placement.bound_domains`)."""
    empty_cache_each_phase: bool = False
    """`torch.cuda.empty_cache()` at the start of every forward, backward and step, as the
    Deep Optimizer States fork's engine does (`behaviours.EMPTY_CACHE_EACH_PHASE`): each phase
    then reserves its device memory anew through `cudaMalloc`."""
    bind_core_list: CoreOrder = "by_gpu"
    """The core list a bound launch cuts into the ranks' parts (`hardware.placement.CoreOrder`):
    by GPU, or none given (the cores in their numbering)."""
    checkpoint_in_cpu: bool = False
    """Megatron-DeepSpeed's `--checkpoint-in-cpu` (`deepspeed.checkpointing.checkpoint`), or
    under `torch.utils.checkpoint` Arctic Long Sequence Training's
    `activation_checkpoint_cpu_offload`: each block's input kept in host memory (a blocking
    D2H as the block's forward starts, an H2D before its recompute)."""
    synchronize_each_layer: bool = False
    """Megatron-DeepSpeed's `--synchronize-each-layer`: the checkpoint synchronizes the device
    at the start and end of each block's forward and of its backward."""
    tiled_mlp_shards: int | Literal["auto"] | None = None
    """DeepSpeed's TiledMLP around each block's gated MLP, as Arctic Long Sequence Training
    patches it: over this many slices of the rank's sequence, or `auto`, ceil(the rank's
    sequence / the hidden size) counted on every call and agreed over the ranks (None: not
    tiled)."""
    tiled_loss_shards: int | Literal["auto"] | None = None
    """DeepSpeed's TiledFusedLogitsLoss around the output layer and the loss, as Arctic Long
    Sequence Training's trainer calls it: over this many slices of the rank's tokens, or
    `auto`, about 1 GiB of fp32 logits a slice (None: transformers' own head and loss)."""
    liger_kernel: bool = False
    """transformers' `use_liger_kernel`: Liger-Kernel's Triton RMSNorm, rotary embedding and
    SwiGLU (GeGLU) in the model, and its fused linear cross entropy for the output layer and
    the loss (the stack's `liger_kernel` section prices them: `SoftwareStack.with_liger_kernel`)."""

    @property
    def version_text(self) -> str:
        """The version as given: the release, and the build's label if any."""
        release = format_version(self.deepspeed_version)
        return f"{release}+{self.build_label}" if self.build_label else release


@dataclass(frozen=True)
class Scenario:
    """A fully resolved scenario: what the engine replays."""

    name: str
    description: str
    model: ModelSpec
    sequence_length: int
    activation_checkpointing: bool
    attention: str
    hardware: HardwareProfile
    data_parallel: int
    deepspeed: DeepSpeedConfig
    runtime: Runtime
    what_if: WhatIf
    source: str
    unmodelled_keys: tuple[str, ...] = field(default=())
    auto_filled: tuple[AutoFill, ...] = field(default=())
    """Each Hugging Face "auto" in the ds_config and what it became."""
    behaviours: Behaviours = field(default_factory=lambda: resolve_behaviours((0, 13, 3)))
    """The DeepSpeed behaviours of `runtime.deepspeed_version` (`zerosim.behaviours`)."""
    stack: SoftwareStack = field(default_factory=lambda: load_stack(DEFAULT_STACK))
    """The software stack of `runtime.framework` (`zerosim.stacks`)."""
    document_length: int | None = None
    """Each sequence packs documents of this many tokens (their position ids restart at each);
    None: one document, the whole sequence."""

    @property
    def tokens_per_iteration(self) -> int:
        """Tokens the whole run trains on in one iteration: every micro-batch of every
        data-parallel group (a sequence-parallel group shares its sequences)."""
        ds = self.deepspeed
        return (ds.train_micro_batch_size_per_gpu * ds.gradient_accumulation_steps
                * ds.sequence_groups(self.data_parallel) * self.sequence_length)

    @property
    def ranks_on_fullest_node(self) -> int:
        """Ranks on the fullest node: the data-parallel ranks fill nodes of `gpus_per_node`."""
        return min(self.data_parallel, self.hardware.gpus_per_node)

    def cpu_pools(self) -> CpuPools:
        """The OpenMP pools of the ranks on the fullest node: how far they oversubscribe its
        hardware threads and what each parallel region then waits (`costs.cpu_pools`)."""
        return cpu_pools(self.hardware, self.ranks_on_fullest_node,
                         self.runtime.cpu_threads_per_rank,
                         bound=self.runtime.bind_cores_to_rank)

    def zenflow_worker_threads(self) -> int | None:
        """Threads of ZenFlow's optimizer process on a rank of the fullest node (its cores,
        `costs.zenflow_worker_threads`, at most the rank's pool); None without its
        overlapped step."""
        zenflow = self.deepspeed.zenflow
        if zenflow is None or not zenflow.overlap_step:
            return None
        return min(self.cpu_pools().threads_per_rank, zenflow_worker_threads(
            self.hardware, self.data_parallel, self.ranks_on_fullest_node,
            bound=self.runtime.bind_cores_to_rank,
            reserved_share=zenflow.pt_reserved_cores_perc,
            split=self.behaviours.zenflow_worker_affinity_split))

    def superoffload_worker_threads(self) -> int | None:
        """Threads of SuperOffload's optimizer process on a rank of the fullest node (its
        CPUs, `costs.superoffload_worker_threads`, at most the rank's pool); None without
        SuperOffload."""
        o = self.deepspeed.offload_optimizer
        if not o.super_offload:
            return None
        return min(self.cpu_pools().threads_per_rank, superoffload_worker_threads(
            self.hardware, self.ranks_on_fullest_node, bound=self.runtime.bind_cores_to_rank,
            cores_perc=o.cpuadam_cores_perc))

    def to_dict(self) -> dict[str, Any]:
        """The resolved scenario with every default filled in (what `zerosim check` prints)."""
        from dataclasses import asdict

        model = asdict(self.model)
        hardware = {key: p.as_dict() for key, p in self.hardware.provenance.items()}
        return {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "model": model,
            "sequence_length": self.sequence_length,
            **({"document_length": self.document_length}
               if self.document_length is not None else {}),
            "activation_checkpointing": self.activation_checkpointing,
            "attention": self.attention,
            "hardware": {"name": self.hardware.name, "nodes": self.hardware.nodes,
                         "gpus_per_node": self.hardware.gpus_per_node, "values": hardware,
                         **({"alternative": self.hardware.alternative}
                            if self.hardware.alternative is not None else {}),
                         "alternatives": {a.name: {"sets": dict(a.values), "source": a.source,
                                                   **({"carried_from": a.carried_from}
                                                      if a.carried_from else {})}
                                          for a in self.hardware.alternatives}},
            "data_parallel": self.data_parallel,
            "deepspeed": self.deepspeed.to_dict(),
            "runtime": {"deepspeed_version": self.runtime.version_text,
                        "cpu_threads_per_rank": self.runtime.cpu_threads_per_rank,
                        **({"bind_cores_to_rank": True,
                            "bind_core_list": self.runtime.bind_core_list}
                           if self.runtime.bind_cores_to_rank else {}),
                        **({"empty_cache_each_phase": True}
                           if self.runtime.empty_cache_each_phase else {}),
                        **({"checkpoint_in_cpu": True}
                           if self.runtime.checkpoint_in_cpu else {}),
                        **({"synchronize_each_layer": True}
                           if self.runtime.synchronize_each_layer else {}),
                        **{key: value for key in ("tiled_mlp_shards", "tiled_loss_shards")
                           if (value := getattr(self.runtime, key)) is not None},
                        **({"liger_kernel": True} if self.runtime.liger_kernel else {}),
                        "cpu_pools": _pools_dict(self.cpu_pools()),
                        "framework": {"name": self.stack.name, "layout": self.stack.layout(),
                                      "values": {
                            key: p.as_dict() for key, p in self.stack.provenance.items()}}},
            "what_if": self.what_if.model_dump(),
            "unmodelled_keys": list(self.unmodelled_keys),
            "auto_filled": [fill.describe() for fill in self.auto_filled],
            "deepspeed_behaviours": self.behaviours.describe(),
        }


def _pools_dict(pools: CpuPools) -> dict[str, Any]:
    return {"ranks_on_node": pools.ranks_on_node, "threads_per_rank": pools.threads_per_rank,
            "hardware_threads": pools.hardware_threads,
            "oversubscription": pools.oversubscription,
            "capacity_threads": pools.capacity_threads,
            "region_wait_ms": pools.region_wait_s / MS}


# ---------------------------------------------------------------- overrides


OVERRIDE_PATH_EXPECTED = ("a dotted key path like deepspeed.zero_optimization.stage (names "
                          "between single dots, none empty; no space or '=')")


def check_override_path(path: Any, *, source: str, key_path: str | None = None) -> str:
    """`path` if it is a dotted key path of non-empty names, else a ScenarioError at `key_path`
    (default: the path itself).

    The one rule for every override path: `--set`, `load_scenario`'s overrides and a sweep's
    `set`, axes and variants. An empty segment must be refused here, as nothing after would:
    `deepspeed..stage` would set a ds_config key named '' (ignored with a warning) and
    `model..num_hidden_layers` a model field named '', both dropping the override.
    """
    if (not isinstance(path, str) or "" in path.split(".")
            or any(char.isspace() or char == "=" for char in path)):
        raise ScenarioError(source, key_path or str(path), OVERRIDE_PATH_EXPECTED, path)
    return path


def parse_overrides(items: Iterable[str] | Mapping[str, Any] | None) -> dict[str, Any]:
    """`["a.b=1", ...]` or `{"a.b": 1}` -> `{"a.b": 1}` with YAML-typed values; every path
    passes `check_override_path`."""
    if items is None:
        return {}
    if isinstance(items, Mapping):
        return {check_override_path(key, source="--set"): value for key, value in items.items()}
    parsed: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ScenarioError("--set", item, "KEY=VALUE with a dotted KEY", item)
        parsed[check_override_path(key.strip(), source="--set")] = parse_scalar(value)
    return parsed


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any, source: str) -> None:
    parts = dotted.split(".")
    node = tree
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            where = ".".join(parts[: depth + 1])
            raise ScenarioError(source, dotted, f"{where} to be a mapping to set {dotted}",
                                child)
        node = child
    node[parts[-1]] = value


STACK_OVERRIDES_PATH = "runtime.framework.overrides."


def _route_override(dotted: str) -> str:
    """Map convenience paths onto the scenario's structure.

    `hardware.pcie.h2d_pageable_GBps=12` patches the profile (-> hardware.overrides), and
    `model.num_hidden_layers=20` on a catalog model starts from that catalog entry, and
    `stack.host.fetch_hook_us=500` patches the software stack (-> runtime.framework.overrides;
    `runtime.framework.overrides.host.fetch_hook_us=500` is the same patch).
    """
    head, _, rest = dotted.partition(".")
    if head == "hardware" and rest and rest.split(".")[0] not in HARDWARE_REFERENCE_KEYS:
        return f"hardware.overrides.{rest}"
    if dotted.startswith(STACK_OVERRIDES_PATH):
        return "stack." + dotted.removeprefix(STACK_OVERRIDES_PATH)
    return dotted


def override_behind(key_path: str, paths: Iterable[str]) -> str | None:
    """The override of `paths` that an error at `key_path` comes from (the longest of those at
    it, beneath it or above it, as `_route_override` lands them), None where none is: an
    error can then name the `--set`, the sweep axis or the table column behind it."""
    def related(path: str) -> bool:
        routed = _route_override(path)
        return (key_path == routed or key_path.startswith(routed + ".")
                or routed.startswith(key_path + "."))

    matches = [p for p in paths if related(p)]
    return max(matches, key=len) if matches else None


def with_override_origin(err: ScenarioError, overrides: Mapping[str, Any]) -> ScenarioError:
    """`err`, its source naming the `--set` behind its key where one is (the file alone would
    send the reader looking for a key the file does not have)."""
    behind = override_behind(err.key_path, overrides)
    if behind is None:
        return err
    return type(err)(f"{err.source} with --set {behind}={overrides[behind]}", err.key_path,
                     err.expected, err.got)


def _override_depth(dotted: str) -> int:
    """How deep in the scenario an override lands (a stack patch lands under
    runtime.framework), so that overrides apply shallowest first and stably."""
    routed = _route_override(dotted)
    if routed.startswith("stack."):
        routed = STACK_OVERRIDES_PATH + routed.removeprefix("stack.")
    return routed.count(".")


def _override_stack(tree: dict[str, Any], key: str, value: Any, source: str) -> None:
    """`stack.host.fetch_hook_us=500` patches the scenario's software stack (-> the overrides
    of `runtime.framework`, or the value of an inline stack)."""
    runtime = tree.setdefault("runtime", {})
    if not isinstance(runtime, dict):
        raise ScenarioError(source, "runtime", "a mapping", runtime)
    framework = runtime.get("framework")
    if framework is None or isinstance(framework, str):
        framework = runtime["framework"] = {"stack": framework or DEFAULT_STACK}
    if not isinstance(framework, dict):
        raise ScenarioError(source, "runtime.framework", "a stack name or a mapping", framework)
    if "name" in framework:
        _set_dotted(framework, f"{key}.value", value, source)
        return
    overrides = framework.setdefault("overrides", {})
    if not isinstance(overrides, dict):
        raise ScenarioError(source, "runtime.framework.overrides", "a mapping", overrides)
    overrides[key] = value


def apply_scenario_overrides(tree: dict[str, Any], overrides: Mapping[str, Any],
                             source: str) -> dict[str, Any]:
    """Apply `--set`/sweep overrides to a scenario tree.

    A choice applies before the patches beneath it, whatever order they came in:
    `hardware=h100-jlse` then `hardware.pcie.h2d_pinned_GBps=110` and the reverse both patch
    h100-jlse (the same for `model=` with `model.<field>=`, `runtime.framework=` with `stack.`).
    """
    patched = copy_tree(tree)
    for dotted, value in sorted(overrides.items(), key=lambda item: _override_depth(item[0])):
        routed = _route_override(dotted)
        if routed.startswith("hardware.") and isinstance(patched.get("hardware"), str):
            patched["hardware"] = {"profile": patched["hardware"]}
        if routed.startswith("hardware.overrides."):
            hardware = patched.setdefault("hardware", {})
            if not isinstance(hardware, dict):
                raise ScenarioError(source, dotted, "hardware to be a profile", hardware)
            hardware.setdefault("overrides", {})[routed.removeprefix("hardware.overrides.")] = value
            continue
        if routed.startswith("stack."):
            _override_stack(patched, routed.removeprefix("stack."), value, source)
            continue
        if routed.startswith("model.") and isinstance(patched.get("model"), str):
            patched["model"] = {"base": patched["model"]}
        _set_dotted(patched, routed, value, source)
    return patched


# ---------------------------------------------------------------- sections


def _resolve_model(value: Any, source: str, base_dir: Path) -> ModelSpec:
    if isinstance(value, str):
        return require_catalog_model(
            value, source=source, key_path="model",
            alternatives=", a mapping of Hugging Face config.json fields, or {hf_config: path}")
    if not isinstance(value, Mapping):
        raise ScenarioError(source, "model", "a catalog name or a mapping", value)
    if "hf_config" in value:
        patch = {key: item for key, item in value.items() if key != "hf_config"}
        path = referenced_path(base_dir, value["hf_config"], source=source,
                               key_path="model.hf_config", what="a Hugging Face config.json")
        return spec_from_hf_file(path, source=source, key_path="model.hf_config", patch=patch)
    fields = dict(value)
    base = fields.pop("base", None)
    if base is not None:
        spec = require_catalog_model(base, source=source, key_path="model.base")
        merged = fields_of(spec)
        merged.update(fields)
        fields = merged
    name = fields.pop("name", base or "custom")
    check_plausible("model.name", name, source=source, key_path="model.name")
    name = str(name)
    return spec_from_hf_fields(fields, name=name, source=source, key_path="model")


def _resolve_hardware(value: Any, source: str, base_dir: Path) -> HardwareProfile:
    if isinstance(value, str):
        value = {"profile": value}
    if not isinstance(value, Mapping):
        raise ScenarioError(source, "hardware", "a profile name or a mapping", value)
    overrides = value.get("overrides") or {}
    if not isinstance(overrides, Mapping):
        raise ScenarioError(source, "hardware.overrides", "a mapping of profile keys to values",
                            overrides)
    overrides = flatten_overrides(overrides)
    if "profile" in value or "file" in value:
        extra = set(value) - HARDWARE_REFERENCE_KEYS
        if extra:
            raise ScenarioError(source, f"hardware.{sorted(extra)[0]}",
                                "profile or file, plus optional overrides and alternative",
                                sorted(extra)[0])
        if "profile" in value and "file" in value:
            raise ScenarioError(source, "hardware.file",
                                "either a catalog profile or a profile file, not both "
                                f"(hardware.profile is {value['profile']!r})", value["file"])
        if "profile" in value:
            tree = builtin_profile_tree(value["profile"], source=source,
                                        key_path="hardware.profile")
            profile_source = f"profile {value['profile']}"
        else:
            path = referenced_path(base_dir, value["file"], source=source,
                                   key_path="hardware.file", what="a hardware profile")
            tree = profile_tree_from_file(path, source=source, key_path="hardware.file")
            profile_source = str(path)
    else:
        tree = {k: v for k, v in value.items() if k not in ("overrides", "alternative")}
        profile_source = f"{source} (hardware)"
    chosen = _chosen_alternative(value.get("alternative"), tree, profile_source, source)
    patch = {**(chosen.overrides(str(tree.get("name", profile_source))) if chosen else {}),
             **overrides}
    if patch:
        tree = apply_overrides(tree, patch, source=source)
    try:
        profile = parse_profile(tree, profile_source)
    except ScenarioError as err:
        key = _overridden_key(err.key_path, overrides)
        if key is not None:
            raise ScenarioError(source, f"hardware.overrides.{key}", err.expected,
                                err.got) from None
        if chosen is not None and _overridden_key(err.key_path, chosen.values) is not None:
            raise ScenarioError(source, OVERRIDE_KEY, "an alternative whose values "
                                f"{profile_source} takes ({err.key_path}: {err.expected}, "
                                f"got {err.got!r})", chosen.name) from None
        if overrides:
            patched_by = (f"{profile_source} as patched by {source} "
                          f"(hardware.overrides: {', '.join(sorted(overrides))})")
            raise ScenarioError(patched_by, err.key_path, err.expected, err.got) from None
        raise
    return profile if chosen is None else replace(profile, alternative=chosen.name)


def _alternative_stack_values(hardware: HardwareProfile
                              ) -> tuple[str, dict[str, Any]] | None:
    """The stack values of the alternative the profile runs with, if it sets any."""
    chosen = [a for a in hardware.alternatives if a.name == hardware.alternative]
    values = chosen[0].stack_overrides(hardware.name) if chosen else {}
    return (f"hardware.alternative ({hardware.alternative}), stack", values) if values else None


def _chosen_alternative(name: Any, tree: Mapping[str, Any], profile_source: str,
                        source: str) -> Alternative | None:
    """The profile's alternative `hardware.alternative` names (None: the shipped values)."""
    if name is None:
        return None
    check_plausible(OVERRIDE_KEY, name, source=source, key_path=OVERRIDE_KEY)
    return find_alternative(profile_alternatives(tree, profile_source), name,
                            profile=str(tree.get("name", profile_source)), source=source,
                            key_path=OVERRIDE_KEY)


def _overridden_key(key_path: str, overrides: Mapping[str, Any]) -> str | None:
    """The override an error in the patched profile is about, as the scenario names it:
    `gpu.hbm_GiB.value` -> `gpu.hbm_GiB`; `gpu.hbm_GiB.source` of a provenance override stays."""
    if key_path.removesuffix(".value") in overrides:
        return key_path.removesuffix(".value")
    if any(key_path.startswith(f"{key}.") for key in overrides):
        return key_path
    return None


def deep_merge(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `patch` merged in: mappings merge key by key, anything else replaces."""
    merged = copy.deepcopy(dict(base))
    for key, value in patch.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def resolve_deepspeed_data(value: Any, source: str, base_dir: Path, behaviours: Behaviours
                            ) -> tuple[Any, str]:
    """`{file: ds.json}` is read as DeepSpeed reads it; keys beside `file:` (and
    `--set deepspeed.X` overrides, which land there) patch the file's content, merged key by
    key, before it is validated."""
    if not (isinstance(value, Mapping) and "file" in value):
        return value, source
    path = referenced_path(base_dir, value["file"], source=source, key_path="deepspeed.file",
                           what="a ds_config")
    content = read_ds_config(path, behaviours=behaviours, referenced_from=source,
                             key_path="deepspeed.file")
    if not isinstance(content, Mapping):
        raise ScenarioError(str(path), "<root>", "a ds_config mapping (JSON object)",
                            type(content).__name__)
    patch = {key: item for key, item in value.items() if key != "file"}
    if not patch:
        return content, str(path)
    return deep_merge(content, patch), f"{path} (patched by {source})"


def _warn_resolution(resolution: Any, ds_source: str) -> None:
    if resolution.unmodelled:
        warnings.warn(f"{ds_source}: zerosim does not model these keys and ignores them: "
                      f"{', '.join(resolution.unmodelled)}", UnmodelledKeysWarning, stacklevel=4)
    if resolution.overridden:
        warnings.warn(f"{ds_source}: {', '.join(resolution.overridden)} changes nothing here: "
                      "Megatron-DeepSpeed gives deepspeed.checkpointing.configure its own flags "
                      "(--partition-activations, --checkpoint-in-cpu, ...), which override the "
                      "section, and the Hugging Face Trainer checkpoints with "
                      "torch.utils.checkpoint; the scenario's activation_checkpointing switch "
                      "is what checkpoints each block", FrameworkOverriddenWarning, stacklevel=4)
    for line in resolution.legacy:
        warnings.warn(f"{ds_source}: {line}", LegacyKeyWarning, stacklevel=4)
    defaulted = [f"deepspeed.{fill.key} = {fill.value}" for fill in resolution.auto
                 if fill.defaulted]
    if defaulted:
        warnings.warn(f"{ds_source}: 'auto' filled from the Hugging Face Trainer's defaults "
                      f"(set trainer: and precision: in the scenario to choose): "
                      f"{', '.join(defaulted)}", AutoDefaultWarning, stacklevel=4)


def _warn_unknown_build(label: str, empty_cache: bool | None, ds: DeepSpeedConfig,
                        source: str) -> None:
    """A source build that is not a commit of the Deep Optimizer States fork zerosim knows, run
    without the fork's options: what it is replayed as, unless the scenario says whether the
    CUDA cache is emptied at every phase (with the options, `_check_fork_options` tells)."""
    if (not label or fork_build(label) is not None or empty_cache is not None
            or any(fork_settings(ds.offload_optimizer).values())):
        return
    warnings.warn(f"{source}: runtime.deepspeed_version: {unknown_build_text(label)}: "
                  "replayed as the fork, its CUDA cache emptied at every phase "
                  "(runtime.empty_cache_each_phase: false says otherwise; "
                  "docs/deep_optimizer_states.md)", ForkBuildWarning, stacklevel=4)


def _warn_unstated_launch(label: str, runtime: _Runtime, hardware: HardwareProfile,
                          source: str) -> None:
    """A build whose measured runs were launched with cores bound to each rank
    (`ForkBuild.binds_cores`, what `zerosim predict` replays its rows with), in a scenario
    that does not say how its ranks were launched, on a node with several NUMA domains: its
    ranks run unbound, which can change the update by half."""
    build = fork_build(label) if label else None
    if (build is None or not build.binds_cores or hardware.numa_domains < 2
            or "bind_cores_to_rank" in runtime.model_fields_set):
        return
    warnings.warn(f"{source}: runtime.deepspeed_version: the Deep Optimizer States study "
                  f"launched the runs of build {build.commit} with --bind_cores_to_rank and a "
                  "core list in GPU order (zerosim predict replays its rows so); this scenario "
                  "runs its ranks unbound: set runtime.bind_cores_to_rank to say how yours ran",
                  ForkBuildWarning, stacklevel=4)


def build_scenario(tree: Any, *, source: str, base_dir: Path) -> Scenario:
    if not isinstance(tree, Mapping):
        raise ScenarioError(source, "<root>", "a mapping with model, hardware, deepspeed, ...",
                            type(tree).__name__)
    raw: _ScenarioRaw = validate_section(_ScenarioRaw, dict(tree), source=source, prefix="")
    check_section({k: v for k, v in tree.items() if k not in DOCUMENT_SECTIONS}, prefix="",
                  source=source)
    version = parse_version(raw.runtime.deepspeed_version, source=source)
    model = _resolve_model(raw.model, source, base_dir)
    hardware = _resolve_hardware(raw.hardware, source, base_dir)
    stack = resolve_stack(raw.runtime.framework, source=source, base_dir=base_dir,
                          first=_alternative_stack_values(hardware))
    if raw.runtime.liger_kernel:
        stack = stack.with_liger_kernel()
    data_parallel = raw.data_parallel or hardware.total_gpus
    if data_parallel > hardware.total_gpus:
        raise ScenarioError(source, "data_parallel",
                            f"at most the {hardware.total_gpus} GPUs of {hardware.name} "
                            f"({hardware.nodes} node(s) x {hardware.gpus_per_node}; "
                            f"hardware.nodes adds nodes)", data_parallel)
    label = version_label(raw.runtime.deepspeed_version)
    behaviours = resolve_behaviours(version, label)
    ds_data, ds_source = resolve_deepspeed_data(raw.deepspeed, source, base_dir, behaviours)
    trainer = raw.trainer or TrainerArgs()
    context = TrainerContext(trainer, frozenset(trainer.model_fields_set), raw.precision,
                             data_parallel, model.hidden_size)
    resolution = resolve_deepspeed(ds_data, behaviours=behaviours, source=ds_source,
                                   trainer=context, build_label=label)
    _warn_resolution(resolution, ds_source)
    _warn_unknown_build(label, raw.runtime.empty_cache_each_phase, resolution.config, source)
    _warn_unstated_launch(label, raw.runtime, hardware, source)
    name = raw.name or Path(source).stem
    scenario = Scenario(
        name=name, description=raw.description, model=model,
        sequence_length=raw.sequence_length,
        activation_checkpointing=raw.activation_checkpointing,
        attention=ATTENTION_NAMES[raw.attention],
        hardware=hardware, data_parallel=data_parallel, deepspeed=resolution.config,
        runtime=Runtime(version, raw.runtime.cpu_threads_per_rank, label,
                        raw.runtime.bind_cores_to_rank,
                        empties_cache_each_phase(raw.runtime.empty_cache_each_phase, label),
                        raw.runtime.bind_core_list,
                        *_checkpoint_flags(raw.runtime, stack, source),
                        raw.runtime.tiled_mlp_shards, raw.runtime.tiled_loss_shards,
                        raw.runtime.liger_kernel),
        what_if=raw.what_if,
        source=source, unmodelled_keys=resolution.unmodelled, auto_filled=resolution.auto,
        behaviours=behaviours, stack=stack, document_length=raw.document_length)
    check_supported(scenario)
    warn_inert(scenario)
    return scenario


def _checkpoint_flags(runtime: _Runtime, stack: SoftwareStack, source: str
                      ) -> tuple[bool, bool]:
    """`runtime.checkpoint_in_cpu` and `synchronize_each_layer`, Megatron-DeepSpeed's flags
    for `deepspeed.checkpointing`. Where `torch.utils.checkpoint` checkpoints the blocks,
    `checkpoint_in_cpu` is Arctic Long Sequence Training's `activation_checkpoint_cpu_offload`
    (its CheckpointFunction moves the block's input to host memory the same way), and
    `synchronize_each_layer` is refused (torch's checkpoint has no such option)."""
    if runtime.synchronize_each_layer and not stack.recipe.deepspeed_checkpointing:
        raise ScenarioError(source, "runtime.synchronize_each_layer", "false with a stack "
                            "whose blocks torch.utils.checkpoint checkpoints, which has no "
                            f"such option (the {stack.name} stack's "
                            "modules.checkpoint_function is torch)", True)
    return runtime.checkpoint_in_cpu, runtime.synchronize_each_layer


def load_scenario(path: str | Path, overrides: Iterable[str] | Mapping[str, Any] | None = None
                  ) -> Scenario:
    """Read, override, validate and resolve a scenario file.

    `overrides` are dotted paths, as on the CLI's `--set`:
    `{"deepspeed.zero_optimization.reduce_bucket_size": 2e8}` or `["data_parallel=2"]`.
    """
    path = Path(path)
    source = str(path)
    tree = read_yaml_file(path)
    parsed = parse_overrides(overrides)
    if parsed:
        if not isinstance(tree, dict):
            raise ScenarioError(source, "<root>", "a mapping", type(tree).__name__)
        tree = apply_scenario_overrides(tree, parsed, source)
    return build_scenario(tree, source=source, base_dir=path.parent)


def scenario_from_dict(tree: Mapping[str, Any], *, source: str = "<inline>",
                       base_dir: str | Path = ".",
                       overrides: Iterable[str] | Mapping[str, Any] | None = None) -> Scenario:
    """Like `load_scenario` for a mapping already in memory (notebooks, sweeps)."""
    parsed = parse_overrides(overrides)
    tree = apply_scenario_overrides(dict(tree), parsed, source) if parsed else dict(tree)
    return build_scenario(tree, source=source, base_dir=Path(base_dir))
