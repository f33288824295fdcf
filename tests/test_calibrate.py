"""`zerosim calibrate`: recovers known profile values from measurements made with them."""

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from conftest import toy_tree

import zerosim
from zerosim.cli import main
from zerosim.errors import ScenarioError
from zerosim.hardware import load_profile
from zerosim.validation.calibrate import calibrate, read_measurements

TRUE_VALUES = {"gpu.gemm_efficiency": 0.4, "cpu.page_zeroing_GBps": 0.25}
PHASES = ("forward", "backward_non_boundary", "backward_boundary", "update")


def _write_case(folder: Path, gpus: int, hardware) -> Path:
    tree = toy_tree(gpus)
    tree["hardware"] = hardware
    tree["deepspeed"]["gradient_accumulation_steps"] = 2
    path = folder / f"toy_dp{gpus}.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Path:
    """Scenarios on the toy profile (file node.yaml), and a CSV of what the 'real' node (the
    toy with TRUE_VALUES) measured on them."""
    folder = tmp_path_factory.mktemp("calibration")
    profile = toy_tree(2)["hardware"]
    (folder / "node.yaml").write_text(yaml.safe_dump(profile))
    lines = ["scenario,overrides,phase,seconds"]
    truth = [f"hardware.{k}={v}" for k, v in TRUE_VALUES.items()]
    for gpus in (1, 2):
        path = _write_case(folder, gpus, {"file": "node.yaml"})
        summary = zerosim.simulate(path, truth).summary
        lines += [f"{path.name},,{phase},{summary['phases_s'][phase]!r}" for phase in PHASES]
    (folder / "measured.csv").write_text("\n".join(lines) + "\n")
    return folder / "measured.csv"


def test_fit_recovers_the_values_that_produced_the_measurements(measured):
    fit, bases = calibrate(measured, ["gpu.gemm_efficiency=0.1:1",
                                      "cpu.page_zeroing_GBps=0.05:10"])
    assert list(bases.profiles) == ["toy"]
    assert fit.values["gpu.gemm_efficiency"] == pytest.approx(0.4, rel=0.02)
    assert fit.values["cpu.page_zeroing_GBps"] == pytest.approx(0.25, rel=0.02)
    assert fit.rms(fit.train) < 0.01
    assert fit.identifiability is not None
    assert fit.identifiability.identified("gpu.gemm_efficiency")
    assert len(fit.identifiability.singular_values) == 2


def test_a_value_the_data_cannot_move_is_reported_as_not_identified(measured):
    """The toy node is one node: the network bandwidth has a zero Jacobian column."""
    fit, _ = calibrate(measured, ["gpu.gemm_efficiency=0.1:1", "cpu.page_zeroing_GBps=0.05:10",
                                  "network.nic_GBps=1:100"])
    ident = fit.identifiability
    assert ident is not None
    assert not ident.identified("network.nic_GBps")
    assert ident.rel_std["network.nic_GBps"] == pytest.approx(99)  # capped at 100x
    assert ident.singular_values[-1] == 0.0
    assert ident.identified("gpu.gemm_efficiency")
    assert ident.identified("cpu.page_zeroing_GBps")


def test_holdout_rows_are_predicted_not_fitted(measured):
    fit, _ = calibrate(measured, ["gpu.gemm_efficiency=0.1:1",
                                  "cpu.page_zeroing_GBps=0.05:10"], holdout="dp2")
    assert {m.scenario.name for m in fit.holdout} == {"toy_dp2.yaml"}
    assert {m.scenario.name for m in fit.train} == {"toy_dp1.yaml"}
    assert fit.rms(fit.holdout) < 0.02


def test_cli_writes_a_loadable_fitted_profile_and_residuals(measured, tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(main, [
        "calibrate", str(measured), "--param", "gpu.gemm_efficiency=0.1:1",
        "--param", "cpu.page_zeroing_GBps=0.05:10", "--out", str(out), "--workers", "1",
        "--suffix", "-mine"])
    assert result.exit_code == 0, result.output
    profile = load_profile(out / "toy-mine.yaml")
    assert profile.gemm_efficiency == pytest.approx(0.4, rel=0.02)
    assert profile.provenance["gpu.gemm_efficiency"].basis == "fitted"
    assert "fitted by zerosim calibrate on measured.csv" in (
        profile.provenance["gpu.gemm_efficiency"].source)
    assert "identifiability.md" in {p.name for p in out.iterdir()}
    stderr = profile.provenance["gpu.gemm_efficiency"].stderr
    assert stderr is not None and 0 < stderr < 0.5  # identified: its standard error written
    assert f"standard error {stderr:.0%}" in profile.provenance["gpu.gemm_efficiency"].source
    assert profile.provenance["pcie.h2d_pinned_GBps"].basis == "assumed"
    residuals = (out / "residuals.csv").read_text().splitlines()
    assert residuals[0] == "line,split,case,measured_s,simulated_s,rel_error"
    assert len(residuals) == 1 + 2 * len(PHASES)


def test_bad_calibration_input_is_a_clear_error(tmp_path, measured):
    bad = tmp_path / "bad.csv"
    bad.write_text("scenario,overrides,phase,seconds\nx.yaml,,warmup,1\n")
    with pytest.raises(ScenarioError, match=r"line 2\.phase"):
        read_measurements(bad)
    with pytest.raises(ScenarioError, match=r"gpu\.nonsense"):
        calibrate(measured, ["gpu.nonsense"])
    with pytest.raises(ScenarioError, match="at least one value to fit"):
        calibrate(measured, [])
    with pytest.raises(ScenarioError, match="a profile of the data"):
        calibrate(measured, ["other-node:gpu.gemm_efficiency"])


@pytest.mark.parametrize(("row", "place", "message"), [
    ("nan", "line 3.seconds", "expected a finite time > 0, got nan"),
    ("inf", "line 3.seconds", "expected a finite time > 0, got inf"),
    ("-1", "line 3.seconds", "expected a finite time > 0, got -1.0"),
    ("0", "line 3.seconds", "expected a finite time > 0, got 0.0"),
    (None, "line 3", "expected 4 fields separated by ',', one per column of the header, got 3 "
                     "fields"),
])
def test_a_measurement_that_is_not_a_time_is_refused_before_the_fit(tmp_path, row, place,
                                                                   message):
    """NaN and infinity would reach the fit's log residuals, a short row's missing seconds
    float(None): each is refused as a negative time is, naming the line and the column."""
    data, out = tmp_path / "bad.csv", tmp_path / "out"
    rows = ["x.yaml,,forward,1.0", f"x.yaml,,forward,{row}"] if row else [
        "x.yaml,,forward,1.0", "x.yaml,,forward"]
    data.write_text("\n".join(["scenario,overrides,phase,seconds", *rows]) + "\n")
    result = CliRunner().invoke(main, ["calibrate", str(data), "--param",
                                       "gpu.gemm_efficiency=0.1:1", "--workers", "1", "--out",
                                       str(out)])
    assert result.exit_code == 2
    assert result.stderr == f"error: {data}: {place}: {message}\n"
    assert not out.exists()


def test_values_per_testbed_and_shared_stack_values_are_recovered_together(tmp_path):
    """Two testbeds (the toy and a copy with half the HBM bandwidth): a per-testbed value
    patches only its own scenarios, a stack value patches both."""
    profiles = {"fast": toy_tree(2)["hardware"], "slow": toy_tree(2)["hardware"]}
    profiles["slow"]["gpu"]["hbm_GBps"]["value"] = 500
    truth = {"fast": 0.4, "slow": 0.7}
    lines = ["scenario,overrides,phase,seconds"]
    for name, profile in profiles.items():
        profile["name"] = name
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(profile))
        for gpus in (1, 2):
            path = _write_case(tmp_path, gpus, {"file": f"{name}.yaml"})
            path = path.rename(tmp_path / f"{name}_dp{gpus}.yaml")
            summary = zerosim.simulate(path, [f"hardware.gpu.gemm_efficiency={truth[name]}",
                                              "stack.host.fetch_hook_us=50"]).summary
            lines += [f"{path.name},,{phase},{summary['phases_s'][phase]!r}"
                      for phase in PHASES]
    (tmp_path / "two.csv").write_text("\n".join(lines) + "\n")
    fit, bases = calibrate(tmp_path / "two.csv", ["fast:gpu.gemm_efficiency=0.1:1",
                                                  "slow:gpu.gemm_efficiency=0.1:1",
                                                  "stack.host.fetch_hook_us=5:500"])
    assert sorted(bases.profiles) == ["fast", "slow"]
    assert fit.values["fast:gpu.gemm_efficiency"] == pytest.approx(0.4, rel=0.02)
    assert fit.values["slow:gpu.gemm_efficiency"] == pytest.approx(0.7, rel=0.02)
    assert fit.values["stack.host.fetch_hook_us"] == pytest.approx(50, rel=0.05)


def test_only_fits_the_rows_that_match_every_text(measured):
    fit, _ = calibrate(measured, ["gpu.gemm_efficiency=0.1:1"], only=["dp2", "forward"])
    assert [(m.scenario.name, m.phase) for m in fit.train] == [("toy_dp2.yaml", "forward")]
    assert fit.values["gpu.gemm_efficiency"] == pytest.approx(0.4, rel=0.02)


def test_only_with_no_matching_row_is_a_clear_error(measured):
    with pytest.raises(ScenarioError, match="--only"):
        calibrate(measured, ["gpu.gemm_efficiency=0.1:1"], only=["dp2", "no-such-phase"])


def test_cli_only_names_the_rows_in_the_fitted_values_source(measured, tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(main, [
        "calibrate", str(measured), "--param", "gpu.gemm_efficiency=0.1:1", "--only", "dp1",
        "--only", "forward", "--out", str(out), "--workers", "1"])
    assert result.exit_code == 0, result.output
    residuals = (out / "residuals.csv").read_text().splitlines()
    assert len(residuals) == 2 and "toy_dp1.yaml forward" in residuals[1]
    source = load_profile(out / "toy-fitted.yaml").provenance["gpu.gemm_efficiency"].source
    assert "measured.csv (the rows with dp1, forward)" in source


def test_holdout_takes_several_texts_and_holds_out_a_row_matching_any(measured):
    fit, _ = calibrate(measured, ["gpu.gemm_efficiency=0.1:1"], holdout=["dp2", "update"])
    held = {(m.scenario.name, m.phase) for m in fit.holdout}
    assert ("toy_dp1.yaml", "update") in held and ("toy_dp2.yaml", "forward") in held
    assert all(m.scenario.name == "toy_dp1.yaml" and m.phase != "update" for m in fit.train)


def test_a_holdout_text_joined_by_ampersand_holds_out_the_rows_matching_every_part(measured):
    fit, _ = calibrate(measured, ["gpu.gemm_efficiency=0.1:1"], holdout=["dp2&update"])
    assert {(m.scenario.name, m.phase) for m in fit.holdout} == {("toy_dp2.yaml", "update")}
    assert ("toy_dp2.yaml", "forward") in {(m.scenario.name, m.phase) for m in fit.train}


def test_a_holdout_text_that_matches_no_row_is_named_in_the_error(measured):
    with pytest.raises(ScenarioError, match="no-such-run"):
        calibrate(measured, ["gpu.gemm_efficiency=0.1:1"], holdout=["dp2", "no-such-run"])


def test_a_scenario_that_only_overrides_the_stack_calibrates_the_default_stack(tmp_path):
    """`runtime.framework: {overrides: ...}` without `stack:` or `file:` names the default
    stack, for `calibrate` as for `run`."""
    from zerosim.stacks import DEFAULT_STACK
    from zerosim.validation.calibrate import _raw_stack

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(
        {"runtime": {"framework": {"overrides": {"host": {"fetch_hook_us": 500}}}}}))
    assert _raw_stack(path)["name"] == DEFAULT_STACK


@pytest.mark.parametrize("key", ["gpu.hbm_GiB", "host.memory_GiB"])
def test_a_capacity_is_not_fitted_to_times(tmp_path, key):
    """No phase time moves with a capacity (it decides whether a run fits), so a fit of one
    to times would only wander."""
    table = Path(__file__).resolve().parent.parent / "scenarios/calibration/study_table2.csv"
    result = CliRunner().invoke(main, ["calibrate", str(table), "--param", key, "--workers",
                                       "1", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: --param: {key}: expected a numeric profile key "
                                    "that times depend on (gpu.hbm_GBps, ")
    assert key not in result.stderr.partition("expected")[2].rpartition("got")[0]
    assert not (tmp_path / "out").exists()
