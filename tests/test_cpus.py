"""CPU models (zerosim/hardware/cpus.yaml): the rates a profile leaves out are derived from its
CPU model, a value the profile writes wins, and a bad model is a clear error."""

import copy
import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from zerosim.cli import main
from zerosim.errors import ScenarioError
from zerosim.hardware.cpus import adam_params_per_s_per_thread, load_catalog, parse_catalog
from zerosim.hardware.profile import builtin_profile_tree, load_profile, parse_profile
from zerosim.validation.calibrate import Bases, parse_parameter

ROOT = Path(__file__).resolve().parent.parent
ADAM = "cpu.adam_params_per_s_per_thread"


def adam_rate(profile_name: str) -> float:
    return load_profile(profile_name).adam_params_per_s_per_thread


@pytest.mark.parametrize(("profile", "rate"), [
    # all-core clock x fp32 lanes x instructions per cycle (measured per extension on one
    # Intel core: 0.76 with AVX-512; AMD's Zen 2 and 3 take AVX2's on a Zen 4 core, 1.81)
    # / 17 instructions per vector
    ("dgx-h100", 3.0e9 * 16 * 0.76 / 17),      # Xeon 8480C, AVX-512: 2.1459e9
    ("p4d-24xlarge", 3.6e9 * 16 * 0.76 / 17),  # Xeon 8275CL, AVX-512: 2.5751e9
    ("polaris-a100", 2.8e9 * 8 * 1.81 / 17),   # EPYC 7543P, AVX2: 2.3849e9
    ("dgx-a100", 2.25e9 * 8 * 1.81 / 17),      # EPYC 7742, AVX2: 1.9165e9
])
def test_adam_ceiling_is_clock_times_lanes_over_the_loops_instructions(profile, rate):
    p = load_profile(profile)
    assert p.adam_params_per_s_per_thread == pytest.approx(rate, rel=1e-12)
    prov = p.provenance[ADAM]
    assert prov.basis == "derived"
    assert "params per lane-cycle" in prov.source and "Step_AVX" in prov.source


def test_the_scalar_loop_runs_at_the_clock_over_its_measured_cycles_per_element():
    """Grace builds DeepSpeed's scalar Step_1: 3.1 GHz / 21.7 cycles = 1.4286e8 per thread,
    what SuperOffload's DeepSpeedCPUAdam rows give (15e9 elements in 1.458 s on 72 cores)."""
    p = load_profile("gh200")
    assert p.adam_params_per_s_per_thread == pytest.approx(3.1e9 / 21.7, rel=1e-12)
    assert 72 * p.adam_params_per_s_per_thread == pytest.approx(15e9 / 1.458, rel=0.005)
    prov = p.provenance[ADAM]
    assert prov.basis == "derived"
    assert "21.7 cycles per element of the scalar loop on sve2" in prov.source
    assert "(measured)" in prov.source and "GraceAdam" in prov.source
    assert load_catalog().adam.scalar_cycles_per_element.basis == "measured"


def test_the_numbers_of_the_formula():
    adam = load_catalog().adam
    assert adam.lanes_for("avx512") == 16 and adam.lanes_for("avx2") == 8
    assert adam.lanes_for("sve2") == 1
    families = load_catalog().families
    assert adam.params_per_lane_cycle(families["sapphire-rapids"]) == pytest.approx(0.76 / 17)
    assert adam.params_per_lane_cycle(families["zen3"]) == pytest.approx(1.81 / 17)
    assert adam.instructions_per_cycle["avx2"].value == 1.12
    model = load_catalog().models["xeon-8468"]
    assert adam_params_per_s_per_thread(model, adam) == pytest.approx(3.1e9 * 16 * 0.76 / 17)


def _catalog_with(simd: dict[str, str]) -> dict:
    """Two models alike in all but their family's SIMD extension."""
    quoted = {"value": 3.0, "basis": "assumed", "source": "test"}
    shipped = yaml.safe_load((ROOT / "zerosim/hardware/cpus.yaml").read_text())
    tree = {"cpu_adam": shipped["cpu_adam"], "bf16_cpu_adam": shipped["bf16_cpu_adam"],
            "fp16_cpu_adam": shipped["fp16_cpu_adam"],
            "fp16_overflow_check": shipped["fp16_overflow_check"], "families": {}, "models": {}}
    for key, ext in simd.items():
        tree["families"][key] = {"description": key, "simd": ext}
        tree["models"][key] = {"name": key, "family": key, "cores": 8, "threads_per_core": 2,
                               "base_GHz": quoted, "all_core_GHz": quoted,
                               "max_turbo_GHz": quoted,
                               "memory_GBps_per_socket": {**quoted, "value": 100}}
    return tree


def test_half_the_lanes_step_at_0_74_of_the_rate_at_the_same_clock():
    """DeepSpeed's own loop on one Raptor Cove core (benchmarks/node_probe, 2026-12-04): 1.40
    cycles a parameter with AVX-512, 1.89 with AVX2 (the divider, which the square root and the
    divide hold, takes a 512-bit operation in two halves): not the half that lanes alone say."""
    catalog = parse_catalog(_catalog_with({"wide": "avx512", "narrow": "avx2"}))
    wide, narrow = (adam_params_per_s_per_thread(catalog.models[k], catalog.adam)
                    for k in ("wide", "narrow"))
    assert narrow / wide == pytest.approx(8 * 1.12 / (16 * 0.76))
    assert round(narrow / wide, 2) == 0.74


def test_the_issue_rates_are_what_deepspeeds_loop_measured():
    """17 instructions a vector over (lanes x cycles per parameter): the probe's one-thread,
    in-L2 rates over the clock read beside them, the mean of its two runs."""
    adam = load_catalog().adam
    for simd, build, lanes in (("avx512", "AVX512", 16), ("avx2", "AVX256", 8)):
        cycles = _loop_cycles("cpu_adam_emr_2026-12-04", build)
        assert len(cycles) == 2
        rate = 17 / (lanes * sum(cycles) / len(cycles))
        assert round(rate, 2) == adam.instructions_per_cycle[simd].value
        assert adam.instructions_per_cycle[simd].basis == "measured"


def test_a_catalog_without_a_rate_for_each_extension_names_the_key():
    tree = _catalog_with({"x": "avx512"})
    del tree["cpu_adam"]["instructions_per_cycle"]["avx2"]
    with pytest.raises(ScenarioError, match=r"zerosim/hardware/cpus\.yaml: "
                       r"cpu_adam\.instructions_per_cycle: expected one rate for each extension "
                       r"of cpu_adam\.lanes \(avx512, avx2\), got 'avx512'"):
        parse_catalog(tree)


def test_a_value_the_profile_writes_wins_with_its_provenance():
    """h100-jlse writes its fitted page zeroing and leaves CPU Adam to its Xeon 8468: 3.1 GHz
    all-core x 16 AVX-512 lanes x the loop's params per lane-cycle."""
    p = load_profile("h100-jlse")
    assert p.cpu_model == "xeon-8468"
    assert p.provenance["cpu.page_zeroing_GBps"].basis == "fitted"
    assert p.provenance[ADAM].basis == "derived"
    adam = load_catalog().adam
    assert p.adam_params_per_s_per_thread == pytest.approx(
        3.1e9 * 16 * adam.params_per_lane_cycle(load_catalog().families["sapphire-rapids"]),
        rel=1e-12)
    assert p.adam_params_per_s_per_thread == pytest.approx(2.2174e9, rel=1e-4)


def test_an_override_replaces_a_derived_value():
    p = load_profile("dgx-h100", {ADAM: 1e8})
    assert p.adam_params_per_s_per_thread == 1e8
    assert p.provenance[ADAM].basis == "override"


def test_a_family_inherits_its_testbeds_per_thread_rates():
    jlse, dgx = load_profile("h100-jlse"), load_profile("dgx-h100")
    for key in ("cpu.page_zeroing_GBps", "cpu.elementwise_GBps_per_thread"):
        prov = dgx.provenance[key]
        assert prov.value == jlse.provenance[key].value
        assert prov.basis == "assumed"
        assert "h100-jlse's value (Intel Xeon Platinum 8468" in prov.source
    assert dgx.page_zeroing_Bps == jlse.page_zeroing_Bps


def test_the_model_names_the_cpu_and_gives_its_boost_clock():
    p = load_profile("dgx-a100")
    assert p.cpu_name == "AMD EPYC 7742"
    assert p.cpu_boost_Hz == 3.4e9 and p.provenance["host.cpu_boost_GHz"].basis == "spec"
    assert load_profile("p4d-24xlarge").cpu_boost_Hz == 3.6e9  # the profile's own value wins


def test_an_unknown_cpu_model_names_file_key_expected_and_got(tmp_path):
    tree = builtin_profile_tree("dgx-h100")
    tree["host"]["cpu_model"] = "xeon-9999"
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(tree))
    with pytest.raises(ScenarioError) as err:
        load_profile(path)
    message = str(err.value)
    assert message.startswith(f"{path}: host.cpu_model: expected a CPU model of "
                              "zerosim/hardware/cpus.yaml (epyc-7543p, epyc-7742, grace, ")
    assert message.endswith("got 'xeon-9999'")


def test_a_family_without_a_testbed_needs_the_profiles_own_rates():
    tree = builtin_profile_tree("dgx-a100")
    del tree["cpu"]["elementwise_GBps_per_thread"]
    with pytest.raises(ScenarioError, match=r"cpu\.elementwise_GBps_per_thread: expected a "
                       "value: the zen2 family of AMD EPYC 7742 has no testbed in "
                       r"zerosim/hardware/cpus\.yaml to inherit it from, got nothing"):
        parse_profile(tree, "dgx-a100")


def test_no_file_may_claim_a_derived_basis():
    tree = builtin_profile_tree("dgx-a100")
    tree["cpu"]["page_zeroing_GBps"]["basis"] = "derived"
    with pytest.raises(ScenarioError, match=r"cpu\.page_zeroing_GBps\.basis: expected one of "
                       "spec, measured, fitted, assumed, override, got 'derived'"):
        parse_profile(tree, "dgx-a100")


def test_memory_beyond_the_cpus_peak_is_refused():
    with pytest.raises(ScenarioError, match=r"host\.memory_GBps_per_domain\.value: expected at "
                       r"most 307\.2 GB/s, the peak of Intel Xeon Platinum 8468's memory"):
        load_profile("h100-jlse", {"host.memory_GBps_per_domain": 400})


def test_more_cores_than_the_cpu_has_are_refused():
    with pytest.raises(ScenarioError, match=r"host\.cores_per_socket: expected at most 48, "
                       "what a Intel Xeon Platinum 8468 has, got 64"):
        load_profile("h100-jlse", {"host.cores_per_socket": 64})


def test_a_bad_catalog_entry_names_the_catalog_and_key():
    tree = _catalog_with({"x": "avx512"})
    tree["models"]["x"]["family"] = "nope"
    with pytest.raises(ScenarioError, match=r"zerosim/hardware/cpus\.yaml: models\.x\.family: "
                       "expected a family of the catalog"):
        parse_catalog(tree)


def test_the_fp16_overflow_check_runs_at_the_clock_over_its_measured_cycles():
    """17.3 cycles an element (benchmarks/node_probe/overflow_check_probe.py: 2.24e8 elements
    a second at 3.868 GHz on one thread): the Xeon 8468's 3.1 GHz all-core clock gives
    1.79e8 a thread, derived; a profile without a CPU model takes the measured core's rate."""
    probe = json.loads((ROOT / "benchmarks" / "node_probe"
                        / "overflow_check_devbox_2026-12-05.json").read_text())
    assert round(probe["cycles_per_element_one_thread"], 1) == 17.3
    h100 = load_profile("h100-jlse")
    assert h100.fp16_check_elements_per_s_per_thread == pytest.approx(3.1e9 / 17.3)
    assert h100.provenance["cpu.fp16_check_elements_per_s_per_thread"].basis == "derived"
    vm = load_profile("h200-vm")
    assert vm.fp16_check_elements_per_s_per_thread == 3.868e9 / 17.3
    assert vm.provenance["cpu.fp16_check_elements_per_s_per_thread"].basis == "assumed"


@pytest.mark.parametrize(("simd", "section", "key"), [
    ("avx512", "fp16_overflow_check", "cycles_per_element"),
    ("sve2", "cpu_adam", "scalar_cycles_per_element"),
])
def test_a_catalog_without_a_measured_cycle_count_names_the_key(simd, section, key):
    tree = _catalog_with({"x": simd})
    del tree[section][key]
    with pytest.raises(ScenarioError, match=rf"zerosim/hardware/cpus\.yaml: {section}\.{key}"):
        parse_catalog(tree)


def test_check_shows_the_derived_value_and_its_formula():
    scenario = (ROOT / "scenarios" / "calibration" / "polaris"
                / "polaris-11.20b-dp1-mb1-ga1-sg1e08.yaml")
    result = CliRunner().invoke(main, ["check", str(scenario), "--json"],
                                catch_exceptions=False)
    values = json.loads(result.output)["hardware"]["values"]
    assert values[ADAM]["basis"] == "derived"
    assert values[ADAM]["value"] == pytest.approx(2.8e9 * 8 * 1.81 / 17)
    assert "all-core clock 2.8 GHz x 8 fp32 lanes x 1.81/17" in values[ADAM]["source"]
    assert "1.81 per cycle with avx2 on zen3 cores (assumed)" in values[ADAM]["source"]
    assert "Zen 4" in values[ADAM]["source"]


def test_calibration_starts_a_derived_value_from_the_formula():
    bases = Bases({"polaris-a100": copy.deepcopy(builtin_profile_tree("polaris-a100"))},
                  "megatron-deepspeed", {}, {})
    parameter = parse_parameter(f"polaris-a100:{ADAM}=5e6:5e9", bases)
    assert parameter.start == pytest.approx(2.8e9 * 8 * 1.81 / 17)


def test_the_overflow_checks_second_measurement_is_within_the_catalogs_error():
    """PyTorch 2.2.2 (the study's release generation) and 2.13.0 side by side on one VM: the
    release moves the check by less than 5%; the session's mean sits within two of the
    catalog's standard errors of 17.3."""
    probe = json.loads((ROOT / "benchmarks" / "node_probe"
                        / "overflow_check_devbox_2026-12-05_torch222_vs_213.json").read_text())
    cycles: dict[str, list[float]] = {}
    for run in probe["runs"]:
        cycles.setdefault(run["versions"]["torch"][:6], []).append(
            run["cycles_per_element_one_thread"])
    old, new = (sum(cycles[v]) / len(cycles[v]) for v in ("2.2.2+", "2.13.0"))
    assert abs(old / new - 1) < 0.05
    stated = load_catalog().check_cycles_per_element
    mean = (old + new) / 2
    assert abs(mean / stated.value - 1) < 2 * stated.stderr


def _loop_cycles(record: str, build: str) -> list[float]:
    """Cycles a parameter of DeepSpeed's loop per run of a probe record (`record`_run1 and
    _run2.jsonl of benchmarks/node_probe), one thread with its arrays in L2."""
    probe = ROOT / "benchmarks" / "node_probe"
    runs = [json.loads(line) for run in ("run1", "run2")
            for line in (probe / f"{record}_{run}.jsonl").read_text().splitlines()]
    return [r["run"]["scalar_clock_GHz"] * 1e9 / r["run"]["params_per_s"] for r in runs
            if r["simd"] == build and r["case"] == "cached" and r["run"]["threads"] == 1]


def test_amd_families_take_the_rates_measured_on_an_amd_core():
    """DeepSpeed's loop on a Zen 4 core (benchmarks/node_probe, 2026-12-06): 1.22 cycles a
    parameter with AVX-512 (0.87 a cycle, Zen 4's own build), 1.17 with AVX2 (1.81, taken for
    Zen 2 and 3, which build it): the 16-lane build is no faster there. Intel families keep
    the rate of their extension."""
    catalog = load_catalog()
    for build, lanes, family, basis in (("AVX512", 16, "zen4", "measured"),
                                        ("AVX256", 8, "zen3", "assumed"),
                                        ("AVX256", 8, "zen2", "assumed")):
        cycles = _loop_cycles("cpu_adam_zen4_2026-12-06", build)
        assert len(cycles) == 2
        quoted = catalog.families[family].adam_instructions_per_cycle
        assert round(17 / (lanes * sum(cycles) / len(cycles)), 2) == quoted.value
        assert quoted.basis == basis
    assert sum(_loop_cycles("cpu_adam_zen4_2026-12-06", "AVX256")) < sum(
        _loop_cycles("cpu_adam_zen4_2026-12-06", "AVX512"))
    for intel in ("sapphire-rapids", "cascade-lake"):
        assert catalog.adam.issue_rate(catalog.families[intel]) is (
            catalog.adam.instructions_per_cycle["avx512"])


def test_a_family_rate_for_the_scalar_loop_is_refused():
    tree = _catalog_with({"x": "sve2"})
    tree["families"]["x"]["adam_instructions_per_cycle"] = {"value": 1.0, "basis": "assumed",
                                                           "source": "test"}
    with pytest.raises(ScenarioError, match=r"zerosim/hardware/cpus\.yaml: "
                       r"families\.x\.adam_instructions_per_cycle: expected none: DeepSpeed "
                       r"builds its scalar loop for sve2"):
        parse_catalog(tree)


def test_the_overflow_check_on_an_amd_core_is_within_the_catalogs_error():
    """A Zen 4 core takes 15.3 cycles an element (three runs, 2026-12-06): the count carries
    across vendors within two of the catalog's standard errors of 17.3."""
    probe = json.loads((ROOT / "benchmarks" / "node_probe"
                        / "overflow_check_zen4_2026-12-06.json").read_text())
    cycles = [run["cycles_per_element_one_thread"] for run in probe["runs"]]
    assert len(cycles) == 3 and max(cycles) - min(cycles) < 0.5
    assert "AMD" in probe["what"] and all(r["cpu_capability"] == "AVX512" for r in probe["runs"])
    stated = load_catalog().check_cycles_per_element
    assert abs(sum(cycles) / 3 / stated.value - 1) < 2 * stated.stderr
