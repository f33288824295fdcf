"""Real DeepSpeed ZeRO-3 offload runs on the project's lent H200 VM (data/h200_vm_ds_offload.yaml),
timed phase by phase by benchmarks/node_probe/ds_offload_probe.py.

Pure: the measured iterations and the scenarios that replay them; `zerosim.validation.validate`
simulates them. The scenarios name `h200-vm`, a profile built from the node probe's own
measurements of that VM; the hf-transformers stack's hook time is fitted on the one run that
times the host path alone (`fitted`), and the others are held out.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from zerosim.shipped import shipped_root
from zerosim.units import GiB
from zerosim.validation.reference import reference_data
from zerosim.vocabulary import Phase

DATA_FILE = "h200_vm_ds_offload.yaml"
MEASURED_PHASES = {Phase.FORWARD: "forward_s", Phase.BACKWARD: "backward_s",
                   Phase.UPDATE: "step_s"}
"""The record's key for each phase DeepSpeed's engine times (forward, backward, step)."""


@dataclass(frozen=True)
class VmRun:
    """One run: its scenario and what its timed iterations measured."""

    name: str
    scenario: Path
    phase_samples_s: dict[Phase, tuple[float, ...]]
    """The phases the run is judged on (a run whose optimizer zerosim does not replay leaves
    its step out)."""
    cpu_adam_samples_s: tuple[float, ...]
    """Empty where the optimizer is not DeepSpeedCPUAdam."""
    forward_peak_allocated_bytes: float
    backward_peak_allocated_bytes: float
    step_peak_allocated_bytes: float | None
    """Recorded for the runs with the optimizer on the GPU, whose state the step's peak shows."""
    node_host_used_bytes: float
    fitted: str
    """What zerosim fitted on the run, if anything ("": nothing)."""

    def phase_s(self, phase: Phase) -> float:
        """The phase's median over the timed iterations."""
        return statistics.median(self.phase_samples_s[phase])

    @property
    def cpu_adam_s(self) -> float | None:
        return statistics.median(self.cpu_adam_samples_s) if self.cpu_adam_samples_s else None


@dataclass(frozen=True)
class VmRuns:
    group: str
    source: str
    runs: tuple[VmRun, ...]


def load_vm_runs() -> VmRuns:
    data = reference_data(DATA_FILE)
    runs = tuple(
        VmRun(r["name"], shipped_root() / r["scenario"],
              {phase: tuple(r[key]) for phase, key in MEASURED_PHASES.items() if key in r},
              tuple(r.get("cpu_adam_s", ())), r["forward_peak_allocated_GiB"] * GiB,
              r["backward_peak_allocated_GiB"] * GiB,
              r["step_peak_allocated_GiB"] * GiB if "step_peak_allocated_GiB" in r else None,
              r["node_host_used_GiB"] * GiB,
              r.get("fitted", ""))
        for r in data["runs"])
    return VmRuns(data["group"], data["source"], runs)
