"""Polaris runs measured while the node's GPUs ran slower than in the table's other runs.

Rows 1-4 of `polaris_zero3_offload_runs.csv` (the 11.20B model: micro-batch 1 at DP=1,
micro-batch 4 at DP=1, 2 and 4) ran their forwards 16.1-16.9% slower than later repeats of
the same configurations (rows 7 and 11, 12, 13), their backwards 6-8% slower, and their
updates, on the CPU, within 2% of the repeats. That is what a lower SM clock does (a power
cap, heat): the tensor cores and the SM-bound strided and softmax kernels slow, contiguous
HBM streams and the host do not. The clock
(`gpu.sm_clock_fraction`) is fitted on the three forwards that have repeats, as their ratio
to the repeats' mean so that the model's own error for each configuration cancels; the
backwards, the iterations and row 1, which has no repeat, are then predictions.

The sessions, their rows and the fitted clock are data (`data/polaris_sessions.yaml`);
`fit_session_clock` refits the clock (`python -m zerosim.validation.sessions`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from zerosim.hardware.provenance import Provenance, parse_provenance
from zerosim.runs import Configuration, MeasuredRun, Prediction
from zerosim.validation.leastsq import StreamingFit, fit_rate
from zerosim.validation.reference import reference_data

DATA_FILE = "polaris_sessions.yaml"
CLOCK_KEY = "hardware.gpu.sm_clock_fraction"
"""The scenario key a session's clock is replayed through (`--set`)."""
FITTED_QUANTITY = "forward"
"""What the clock is fitted on: the forwards, the phase the tensor cores bound most."""


@dataclass(frozen=True)
class Session:
    """Runs of the table measured together on a GPU that sustained `sm_clock_fraction` of the
    SM clock of the table's other runs."""

    name: str
    rows: tuple[int, ...]
    """CSV rows, 1 the first data row."""
    sm_clock_fraction: Provenance

    @property
    def clock(self) -> float:
        return float(self.sm_clock_fraction.value)

    @property
    def overrides(self) -> dict[str, float]:
        return {CLOCK_KEY: self.clock}


@dataclass(frozen=True)
class Twin:
    """A run of a session and the same configuration's runs outside it."""

    run: MeasuredRun
    others: tuple[MeasuredRun, ...]

    def measured_ratio(self, quantity: str) -> float:
        """The session run's `quantity` over the mean of the others'."""
        return self.run.seconds[quantity] / statistics.fmean(
            other.seconds[quantity] for other in self.others)


def load_sessions() -> tuple[Session, ...]:
    data = reference_data(DATA_FILE)
    source = f"zerosim/validation/data/{DATA_FILE}"
    return tuple(Session(entry["name"], tuple(int(r) for r in entry["rows"]),
                         parse_provenance(entry["sm_clock_fraction"], source,
                                          f"sessions.{entry['name']}.sm_clock_fraction"))
                 for entry in data["sessions"])


def session_of(run: MeasuredRun, sessions: Sequence[Session] | None = None) -> Session | None:
    """The session `run` was measured in, None for the table's ordinary runs."""
    for session in load_sessions() if sessions is None else sessions:
        if run.row in session.rows:
            return session
    return None


def twins(session: Session, configurations: Sequence[Configuration]) -> list[Twin]:
    """Each run of the session whose configuration was also measured outside it."""
    found = []
    for configuration in configurations:
        inside = [r for r in configuration.runs if r.row in session.rows]
        outside = tuple(r for r in configuration.runs if r.row not in session.rows)
        found += [Twin(run, outside) for run in inside if outside]
    return found


def session_runs(session: Session, runs: Sequence[MeasuredRun]) -> list[MeasuredRun]:
    return [run for run in runs if run.row in session.rows]


def predict_rows(runs: Sequence[MeasuredRun], clock: float) -> dict[int, Prediction]:
    """Each run's configuration predicted on `polaris-a100` at SM clock `clock`, by row."""
    from zerosim.runs import predict
    from zerosim.validation.polaris import NAME_PREFIX, PROFILE

    outcome = predict(runs, PROFILE, overrides={CLOCK_KEY: clock}, workers=1,
                      source="Polaris CSV", name_prefix=NAME_PREFIX)
    return {run.row: p for p in outcome.predictions for run in p.configuration.runs}


def fit_session_clock(session: Session, runs: Sequence[MeasuredRun] | None = None
                      ) -> StreamingFit:
    """The SM clock that makes the model's forward of each twinned run of the session, over
    its forward at the full clock, meet the measured ratio to the repeats; its standard error
    from the Jacobian. `errors`: modelled / measured ratio - 1 per twin."""
    from zerosim.validation.polaris import configurations, load_runs

    runs = list(runs) if runs is not None else load_runs()
    pairs = twins(session, configurations(runs))
    if not pairs:
        raise ValueError(f"session {session.name}: no run of it has a repeat outside it")
    fitted = [pair.run for pair in pairs]
    full = predict_rows(fitted, 1.0)

    def modelled(clock: float) -> list[float]:
        slow = predict_rows(fitted, clock)
        return [slow[r.row].predicted[FITTED_QUANTITY] / full[r.row].predicted[FITTED_QUANTITY]
                for r in fitted]

    return fit_rate([pair.measured_ratio(FITTED_QUANTITY) for pair in pairs], modelled,
                    session.clock)


def main() -> None:
    for session in load_sessions():
        fit = fit_session_clock(session)
        errors = ", ".join(f"{e:+.1%}" for e in fit.errors)
        print(f"session {session.name}: sm_clock_fraction {fit.value:.3f} "
              f"(standard error {fit.std / fit.value:.1%}; shipped {session.clock:.3f}); "
              f"forward ratios modelled/measured - 1: {errors}")


if __name__ == "__main__":
    main()
