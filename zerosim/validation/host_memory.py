"""What a node's host memory holds besides what training allocates, read off the Polaris runs.

The runs measure the node's memory in use (psutil's total - available, every process and the
OS). zerosim counts what DeepSpeed and the framework allocate and the pages the data loader's
forked workers keep; the rest is the OS and its services, once per node
(`host.os_resident_GiB` of the profile), and each rank's processes besides their tensors (the
interpreter, the framework's and CUDA's host state, the workers: `processes.rank_resident_GiB`
of the stack). `fit_resident` predicts the runs with both at 0 and fits the gap as
node + ranks x rank by least squares with a soft-L1 loss, so a run far from its repeats (the
11.20B micro-batch-1 run, 50 GiB above the same model's micro-batch-4 ones) weighs little.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from zerosim.units import GiB
from zerosim.vocabulary import Status

RESIDENT_OFF = {"hardware.host.os_resident_GiB": 0, "stack.processes.rank_resident_GiB": 0}
"""Overrides that leave out what `fit_resident` fits."""
LOSS_SCALE_GIB = 4.0
"""Where the soft-L1 loss turns from quadratic to linear: about the spread of one
configuration's repeats."""


@dataclass(frozen=True)
class ResidentFit:
    node_GiB: float
    node_stderr_GiB: float
    rank_GiB: float
    rank_stderr_GiB: float
    rms_GiB: float
    """Of the residuals, every configuration counted."""
    configurations: int


def host_gaps(workers: int | None = 1) -> tuple[np.ndarray, np.ndarray]:
    """Per Polaris configuration with a host measurement: (ranks on the node, measured minus
    zerosim's peak host memory in GiB), zerosim run without the resident memory."""
    from zerosim.runs import PEAK_HOST, predict
    from zerosim.validation.polaris import NAME_PREFIX, PROFILE, load_runs

    outcome = predict(load_runs(), PROFILE, overrides=RESIDENT_OFF, workers=workers,
                      source="Polaris CSV", name_prefix=NAME_PREFIX)
    rows = [(p.configuration.first.gpus,
             (p.configuration.peak_host_bytes - p.predicted[PEAK_HOST]) / GiB)
            for p in outcome.predictions
            if p.status == Status.OK and p.configuration.peak_host_bytes is not None]
    ranks, gaps = (np.array(column, dtype=float) for column in zip(*rows, strict=True))
    return ranks, gaps


def fit_resident(workers: int | None = 1) -> ResidentFit:
    from scipy.optimize import least_squares

    ranks, gaps = host_gaps(workers)
    design = np.column_stack([np.ones_like(ranks), ranks])
    solution = least_squares(lambda x: design @ x - gaps, x0=np.zeros(2), loss="soft_l1",
                             f_scale=LOSS_SCALE_GIB)
    residuals = design @ solution.x - gaps
    jac = solution.jac
    variance = 2 * solution.cost / max(len(gaps) - 2, 1)
    stderr = np.sqrt(np.diag(np.linalg.inv(jac.T @ jac)) * variance)
    return ResidentFit(node_GiB=float(solution.x[0]), node_stderr_GiB=float(stderr[0]),
                       rank_GiB=float(solution.x[1]), rank_stderr_GiB=float(stderr[1]),
                       rms_GiB=math.sqrt(float(residuals @ residuals) / len(gaps)),
                       configurations=len(gaps))
