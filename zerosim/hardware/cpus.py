"""CPU models and families (`zerosim/hardware/cpus.yaml`): what a profile's host CPU can do per
thread, derived from its spec sheet instead of written by hand in every profile.

A profile names its CPU with `host.cpu_model`; the values a profile leaves out are then
derived (`cpu_values`): DeepSpeedCPUAdam's per-thread compute ceiling from the all-core clock
and the SIMD lanes DeepSpeed 0.13.3 builds for the CPU, and the per-thread elementwise and
page-zeroing rates from the family's testbed, a shipped profile of the same microarchitecture
where they were fitted. Pure: no SimPy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from typing import Any

from zerosim.errors import Described, ScenarioError
from zerosim.hardware.provenance import DERIVED, Provenance, parse_provenance
from zerosim.units import GHZ
from zerosim.yamlio import dotted_leaf, parse_yaml_text

CATALOG = "zerosim/hardware/cpus.yaml"
ADAM_KEY = "cpu.adam_params_per_s_per_thread"
CHECK_KEY = "cpu.fp16_check_elements_per_s_per_thread"
FAMILY_KEYS = ("cpu.elementwise_GBps_per_thread", "cpu.page_zeroing_GBps")
"""Per-thread rates a family inherits from its testbed: no spec sheet gives them."""
BF16_ADAM_KEYS = {"bf16_params": "cpu.adam_bf16_params_per_s_per_thread",
                  "bf16_states": "cpu.adam_bf16_states_params_per_s_per_thread"}
"""DeepSpeedCPUAdam's ceiling over bf16 params and gradients with fp32 moments, and over bf16
moments too (`bf16.bf16_master_weights_and_grads`, DeepSpeed 0.18.3+): a profile may write
them; else they are its fp32 ceiling over the catalog's relative cost
(`low_precision_adam_values`)."""
FP16_ADAM_KEYS = {"fp16_params": "cpu.adam_fp16_params_per_s_per_thread",
                  "fp16_states": "cpu.adam_fp16_states_params_per_s_per_thread"}
"""The same over fp16 params (`fp16.fp16_master_weights_and_grads`) and fp16 moments."""
LOW_PRECISION_ADAM_KEYS = {**BF16_ADAM_KEYS, **FP16_ADAM_KEYS}
"""Every 16-bit CPU Adam ceiling, by the catalog's dtype pair."""
LOW_PRECISION_SECTIONS = {"bf16_cpu_adam": BF16_ADAM_KEYS, "fp16_cpu_adam": FP16_ADAM_KEYS}
"""The catalog sections holding each dtype's costs against the fp32 loop."""
BOOST_KEY = "host.cpu_boost_GHz"
NAME_KEY = "host.cpu_name"
SUPPLIED_KEYS = (ADAM_KEY, CHECK_KEY, BOOST_KEY, *FAMILY_KEYS, *LOW_PRECISION_ADAM_KEYS.values())
"""Quantities a profile that names its CPU model may leave out."""


@dataclass(frozen=True)
class CpuAdamLoop:
    """DeepSpeed's CPU Adam loops: lanes per SIMD extension, the vector loop's issue rate per
    extension and the scalar loop's measured cycles per element."""

    lanes: Mapping[str, int]
    lanes_source: str
    vector_instructions: Provenance
    instructions_per_cycle: Mapping[str, Provenance]
    """Per SIMD extension with lanes: the loop's square root and divide hold the divider, which
    takes a wider vector in more cycles, so twice the lanes do not buy twice the rate."""
    scalar_cycles_per_element: Provenance

    def lanes_for(self, simd: str) -> int:
        """fp32 lanes of the loop DeepSpeed builds for a CPU with `simd` (1: the scalar loop)."""
        return self.lanes.get(simd, 1)

    def issue_rate(self, family: CpuFamily) -> Provenance:
        """The vector loop's instructions per cycle on `family`'s cores: the family's own
        where the catalog gives one (the divider differs between vendors' cores), else the
        rate measured for its SIMD extension."""
        return family.adam_instructions_per_cycle or self.instructions_per_cycle[family.simd]

    def params_per_lane_cycle(self, family: CpuFamily) -> float:
        return self.issue_rate(family).value / self.vector_instructions.value


@dataclass(frozen=True)
class CpuFamily:
    key: str
    description: str
    simd: str
    testbed: str | None
    adam_instructions_per_cycle: Provenance | None = None
    """`CpuAdamLoop.issue_rate` on these cores, where it was measured on them or on a
    nearer relative than the extension's own measurement."""


@dataclass(frozen=True)
class CpuModel:
    key: str
    name: str
    family: CpuFamily
    cores: int
    threads_per_core: int
    base_GHz: Provenance
    all_core_GHz: Provenance
    max_turbo_GHz: Provenance
    memory_GBps_per_socket: Provenance


@dataclass(frozen=True)
class CpuCatalog:
    adam: CpuAdamLoop
    check_cycles_per_element: Provenance
    """DeepSpeed's fp16 overflow check on the host, per element (`fp16_overflow_check`)."""
    check_clock_GHz: Provenance
    """The core clock those cycles were counted at."""
    models: Mapping[str, CpuModel]
    families: Mapping[str, CpuFamily]
    low_precision_adam_cost: Mapping[str, Mapping[str, Provenance]]
    """Per build ("avx512", "avx2", "scalar") and dtype pair ("bf16_params", "bf16_states",
    "fp16_params", "fp16_states"): cycles per parameter of DeepSpeedCPUAdam over 16-bit params
    (and moments) against its fp32 loop (`bf16_cpu_adam`, `fp16_cpu_adam`)."""

    def model(self, key: Any, *, source: str, key_path: str = "host.cpu_model") -> CpuModel:
        if not isinstance(key, str) or key not in self.models:
            raise ScenarioError(source, key_path, f"a CPU model of {CATALOG} "
                                f"({', '.join(sorted(self.models))})", key)
        return self.models[key]


def adam_params_per_s_per_thread(model: CpuModel, adam: CpuAdamLoop) -> float:
    """DeepSpeedCPUAdam's compute ceiling for one thread with a core to itself (the default
    pool has one thread per physical core): clock x lanes x params per lane-cycle for the
    vector loop, clock / cycles per element for the scalar one."""
    clock_Hz = model.all_core_GHz.value * GHZ
    lanes = adam.lanes_for(model.family.simd)
    if lanes == 1:
        return clock_Hz / adam.scalar_cycles_per_element.value
    return clock_Hz * lanes * adam.params_per_lane_cycle(model.family)


ASSUMED_BUILD = "avx512"
"""The build taken for a profile that names no CPU model (`ASSUMED_BUILD_WHY`)."""
ASSUMED_BUILD_WHY = ("what DeepSpeed builds on Intel Xeons since Skylake-SP and AMD EPYC since "
                     "Zen 4")


def adam_build(simd: str, adam: CpuAdamLoop) -> str:
    """The CPU Adam build DeepSpeed's op builder makes for a CPU with `simd`: its vector loop
    where it has lanes for it, else the scalar one."""
    return simd if adam.lanes_for(simd) > 1 else "scalar"


def low_precision_adam_values(flat: Mapping[str, Any], model: CpuModel | None
                              ) -> dict[str, Any]:
    """The 16-bit CPU Adam ceilings (`LOW_PRECISION_ADAM_KEYS`) a profile (`flat`, its CPU
    model's values merged) leaves out: its fp32 ceiling over the relative cost of its CPU's
    build (with no CPU model named, the AVX-512 build's, assumed). Nothing while the fp32
    ceiling is missing or malformed: the profile's own check reports that."""
    fp32 = flat.get(ADAM_KEY)
    rate = fp32.get("value") if isinstance(fp32, Mapping) else None
    if isinstance(rate, bool) or not isinstance(rate, int | float) or rate <= 0:
        return {}
    catalog = load_catalog()
    build = adam_build(model.family.simd, catalog.adam) if model else ASSUMED_BUILD
    cpu = (f"{model.name}, {model.family.key} cores: the {build} build" if model else
           f"no host.cpu_model: the {ASSUMED_BUILD} build assumed, "
           f"{ASSUMED_BUILD_WHY}")
    values = {}
    for pair, key in LOW_PRECISION_ADAM_KEYS.items():
        if key in flat:
            continue
        cost = catalog.low_precision_adam_cost[build][pair]
        dtype = pair.split("_")[0]
        values[key] = {
            "value": rate / cost.value, "basis": DERIVED if model else "assumed",
            "source": (f"{ADAM_KEY} {rate:.4g} / {cost.value:g}, the cost of {dtype} over fp32 "
                       f"per parameter ({cpu}; {cost.basis}): {cost.source}; fp32 ceiling "
                       f"({fp32.get('basis')}): {fp32.get('source')}")}
    return values


def check_elements_per_s_per_thread(model: CpuModel, cycles: Provenance) -> float:
    """The fp16 overflow check's elements per second on one thread: all-core clock over its
    measured cycles per element."""
    return model.all_core_GHz.value * GHZ / cycles.value


def measured_core_check_rate() -> float:
    """The fp16 overflow check's elements per second on one thread of the core its cycles
    were counted on: what a profile that names no CPU model takes."""
    catalog = load_catalog()
    return catalog.check_clock_GHz.value * GHZ / catalog.check_cycles_per_element.value


def _adam_source(model: CpuModel, adam: CpuAdamLoop, rate: float) -> str:
    lanes = adam.lanes_for(model.family.simd)
    clock = model.all_core_GHz
    if lanes == 1:
        cycles = adam.scalar_cycles_per_element
        return (f"all-core clock {clock.value:g} GHz / {cycles.value:g} cycles per element "
                f"of the scalar loop on {model.family.simd} = {rate:.4g} params/s per thread "
                f"({model.name}); clock ({clock.basis}): {clock.source}; lanes: "
                f"{adam.lanes_source}; cycles per element ({cycles.basis}): {cycles.source}")
    per_cycle = adam.issue_rate(model.family)
    return (f"all-core clock {clock.value:g} GHz x {lanes} fp32 lanes x "
            f"{per_cycle.value:g}/{adam.vector_instructions.value:g} params per "
            f"lane-cycle = {rate:.4g} params/s per thread ({model.name}); "
            f"clock ({clock.basis}): {clock.source}; lanes: {adam.lanes_source}; "
            f"{adam.vector_instructions.value:g} vector instructions per vector "
            f"({adam.vector_instructions.basis}): {adam.vector_instructions.source}; "
            f"{per_cycle.value:g} per cycle with {model.family.simd}{_on_family(model.family)} "
            f"({per_cycle.basis}): {per_cycle.source}")


def _on_family(family: CpuFamily) -> str:
    return f" on {family.key} cores" if family.adam_instructions_per_cycle else ""


def _testbed_cpu(tree: Mapping[str, Any], testbed: str) -> str:
    model = load_catalog().models.get(dotted_leaf(tree, "host.cpu_model"))
    return model.name if model else dotted_leaf(tree, NAME_KEY) or testbed


def _inherited(model: CpuModel, key: str, testbed_tree: Mapping[str, Any], source: str
               ) -> dict[str, Any]:
    """The family testbed's value of `key`, assumed to carry over to `model`."""
    testbed = model.family.testbed
    raw = dotted_leaf(testbed_tree, key)
    if not isinstance(raw, Mapping) or "value" not in raw:
        raise ScenarioError(source, key, f"a value: {model.name}'s family testbed {testbed} "
                            "does not give one to inherit", raw)
    why = (f"{testbed}'s value ({_testbed_cpu(testbed_tree, testbed)}, the same "
           f"{model.family.key} cores), assumed to carry over to {model.name}; there "
           f"{raw.get('basis')}: {raw.get('source')}")
    return {"value": raw["value"], "basis": "assumed", "source": why}


def cpu_values(flat: Mapping[str, Any], model: CpuModel, source: str,
               profile_tree: Callable[[str], Mapping[str, Any]]) -> dict[str, Any]:
    """What `model` supplies for the keys a profile (`flat`) leaves out: the Adam ceiling
    (basis `derived`), the clock of the single-threaded host path (the model's max turbo),
    the family testbed's per-thread rates and the CPU's name; `profile_tree(name)` reads a
    shipped profile's tree."""
    values: dict[str, Any] = {}
    if ADAM_KEY not in flat:
        adam = load_catalog().adam
        rate = adam_params_per_s_per_thread(model, adam)
        values[ADAM_KEY] = {"value": rate, "basis": DERIVED,
                            "source": _adam_source(model, adam, rate)}
    if CHECK_KEY not in flat:
        cycles = load_catalog().check_cycles_per_element
        rate = check_elements_per_s_per_thread(model, cycles)
        clock = model.all_core_GHz
        values[CHECK_KEY] = {
            "value": rate, "basis": DERIVED,
            "source": (f"all-core clock {clock.value:g} GHz / {cycles.value:g} cycles per "
                       f"element = {rate:.4g} elements/s per thread ({model.name}); clock "
                       f"({clock.basis}): {clock.source}; cycles per element ({cycles.basis}): "
                       f"{cycles.source}")}
    if BOOST_KEY not in flat:
        turbo = model.max_turbo_GHz
        values[BOOST_KEY] = {"value": turbo.value, "basis": turbo.basis,
                             "source": f"{model.name}'s max turbo ({CATALOG}): {turbo.source}"}
    missing = [key for key in FAMILY_KEYS if key not in flat]
    if missing and not model.family.testbed:
        raise ScenarioError(source, missing[0], f"a value: the {model.family.key} family of "
                            f"{model.name} has no testbed in {CATALOG} to inherit it from",
                            Described("nothing"))
    if missing:
        testbed_tree = profile_tree(model.family.testbed)
        values.update({key: _inherited(model, key, testbed_tree, source) for key in missing})
    if NAME_KEY not in flat:
        values[NAME_KEY] = model.name
    return values


def check_host(flat: Mapping[str, Any], model: CpuModel, source: str) -> None:
    """Refuse a topology the named CPU cannot have."""
    for key, most in (("host.cores_per_socket", model.cores),
                      ("host.threads_per_core", model.threads_per_core)):
        value = flat.get(key)
        if isinstance(value, int) and value > most:
            raise ScenarioError(source, key, f"at most {most}, what a {model.name} has", value)


def check_memory(value_GBps: float, sockets: int, domains: int, model: CpuModel,
                 source: str) -> None:
    """A NUMA domain cannot sustain more than its share of the sockets' peak DRAM bandwidth."""
    peak = model.memory_GBps_per_socket.value * sockets / domains
    if value_GBps > peak * (1 + 1e-9):
        raise ScenarioError(source, "host.memory_GBps_per_domain.value",
                            f"at most {peak:g} GB/s, the peak of {model.name}'s memory "
                            f"({model.memory_GBps_per_socket.source}) over {domains} NUMA "
                            f"domain(s) of {sockets} socket(s)", value_GBps)


# ---------------------------------------------------------------- the catalog file


def _quoted(raw: Any, key_path: str) -> Provenance:
    """A catalog number with its provenance, in the unit of its key: a positive float."""
    prov = parse_provenance(raw, CATALOG, key_path)
    value = prov.value
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ScenarioError(CATALOG, f"{key_path}.value", "a positive number", value)
    return replace(prov, value=float(value))


def _mapping(raw: Any, key_path: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise ScenarioError(CATALOG, key_path, "a mapping", raw)
    return raw


def _text(raw: Mapping[str, Any], key: str, key_path: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value:
        raise ScenarioError(CATALOG, f"{key_path}.{key}", "a text", value)
    return value


def _int(raw: Mapping[str, Any], key: str, key_path: str) -> int:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ScenarioError(CATALOG, f"{key_path}.{key}", "a positive integer", value)
    return value


def _adam(raw: Any) -> CpuAdamLoop:
    raw = _mapping(raw, "cpu_adam")
    lanes = _mapping(raw.get("lanes"), "cpu_adam.lanes")
    for simd in lanes:
        _int(lanes, simd, "cpu_adam.lanes")
    rates = _mapping(raw.get("instructions_per_cycle"), "cpu_adam.instructions_per_cycle")
    if set(rates) != set(lanes):
        raise ScenarioError(CATALOG, "cpu_adam.instructions_per_cycle",
                            f"one rate for each extension of cpu_adam.lanes ({', '.join(lanes)})",
                            ", ".join(rates) or "none")
    return CpuAdamLoop(dict(lanes), _text(raw, "lanes_source", "cpu_adam"),
                       _quoted(raw.get("vector_instructions"), "cpu_adam.vector_instructions"),
                       {simd: _quoted(rate, f"cpu_adam.instructions_per_cycle.{simd}")
                        for simd, rate in rates.items()},
                       _quoted(raw.get("scalar_cycles_per_element"),
                               "cpu_adam.scalar_cycles_per_element"))


def _family(key: str, raw: Any, lanes: Mapping[str, int]) -> CpuFamily:
    path = f"families.{key}"
    raw = _mapping(raw, path)
    testbed = raw.get("testbed")
    if testbed is not None and not isinstance(testbed, str):
        raise ScenarioError(CATALOG, f"{path}.testbed", "a shipped profile's name", testbed)
    simd = _text(raw, "simd", path)
    rate = raw.get("adam_instructions_per_cycle")
    if rate is not None and simd not in lanes:
        raise ScenarioError(CATALOG, f"{path}.adam_instructions_per_cycle",
                            f"none: DeepSpeed builds its scalar loop for {simd}, which "
                            "cpu_adam.scalar_cycles_per_element prices", Described("a rate"))
    return CpuFamily(key, _text(raw, "description", path), simd, testbed,
                     None if rate is None else _quoted(rate, f"{path}.adam_instructions_per_cycle"))


def _model(key: str, raw: Any, families: Mapping[str, CpuFamily]) -> CpuModel:
    path = f"models.{key}"
    raw = _mapping(raw, path)
    family = raw.get("family")
    if family not in families:
        raise ScenarioError(CATALOG, f"{path}.family",
                            f"a family of the catalog ({', '.join(sorted(families))})", family)
    clocks = {name: _quoted(raw.get(name), f"{path}.{name}")
              for name in ("base_GHz", "all_core_GHz", "max_turbo_GHz")}
    return CpuModel(key, _text(raw, "name", path), families[family], _int(raw, "cores", path),
                    _int(raw, "threads_per_core", path), **clocks,
                    memory_GBps_per_socket=_quoted(raw.get("memory_GBps_per_socket"),
                                                   f"{path}.memory_GBps_per_socket"))


LOW_PRECISION_BUILDS = ("avx512", "avx2", "scalar")


def _low_precision_adam_cost(tree: Mapping[str, Any]) -> dict[str, dict[str, Provenance]]:
    """Per build, every dtype pair of `LOW_PRECISION_SECTIONS`, each section's own."""
    costs: dict[str, dict[str, Provenance]] = {build: {} for build in LOW_PRECISION_BUILDS}
    for section, keys in LOW_PRECISION_SECTIONS.items():
        raw = _mapping(tree.get(section), section)
        for build in LOW_PRECISION_BUILDS:
            pairs = _mapping(raw.get(build), f"{section}.{build}")
            costs[build].update({pair: _quoted(pairs.get(pair), f"{section}.{build}.{pair}")
                                 for pair in keys})
    return costs


def parse_catalog(tree: Any) -> CpuCatalog:
    tree = _mapping(tree, "<root>")
    adam = _adam(tree.get("cpu_adam"))
    families = {key: _family(key, raw, adam.lanes)
                for key, raw in _mapping(tree.get("families"), "families").items()}
    models = {key: _model(key, raw, families)
              for key, raw in _mapping(tree.get("models"), "models").items()}
    check = _mapping(tree.get("fp16_overflow_check"), "fp16_overflow_check")
    return CpuCatalog(adam, _quoted(check.get("cycles_per_element"),
                                    "fp16_overflow_check.cycles_per_element"),
                      _quoted(check.get("clock_GHz"), "fp16_overflow_check.clock_GHz"),
                      models, families, _low_precision_adam_cost(tree))


@cache
def load_catalog() -> CpuCatalog:
    text = (resources.files("zerosim.hardware") / "cpus.yaml").read_text(encoding="utf-8")
    return parse_catalog(parse_yaml_text(text, CATALOG))
