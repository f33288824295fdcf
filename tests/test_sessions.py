"""The Polaris runs measured on a slower GPU: which rows, their repeats, the fitted SM clock and
what it predicts (zerosim.validation.sessions)."""

from __future__ import annotations

import pytest

from zerosim.validation.polaris import configurations, load_runs
from zerosim.validation.sessions import (
    fit_session_clock,
    load_sessions,
    predict_rows,
    session_of,
    session_runs,
    twins,
)

RUNS = load_runs()
(SESSION,) = load_sessions()


def test_the_session_is_the_tables_first_four_rows_and_their_repeats_are_found():
    assert SESSION.rows == (1, 2, 3, 4)
    assert SESSION.sm_clock_fraction.basis == "fitted"
    assert [session_of(run) for run in RUNS[:5]] == [SESSION] * 4 + [None]
    pairs = twins(SESSION, configurations(RUNS))
    assert [(p.run.row, [o.row for o in p.others]) for p in pairs] == [
        (2, [7, 11]), (3, [12]), (4, [13])]
    assert pairs[1].measured_ratio("forward") == pytest.approx(1314.37 / 1125.13, rel=1e-12)
    assert pairs[0].measured_ratio("backward") == pytest.approx(
        11024.02 / ((10241.1 + 14065.66) / 2), rel=1e-12)


def test_the_shipped_clock_is_what_the_fit_gives():
    fit = fit_session_clock(SESSION, RUNS)
    assert fit.value == pytest.approx(SESSION.clock, abs=max(fit.std, 0.0005))
    assert SESSION.sm_clock_fraction.stderr == pytest.approx(fit.std / fit.value, abs=0.001)
    assert max(abs(e) for e in fit.errors) < 0.01


def test_the_clock_fitted_on_the_forwards_predicts_the_backwards_and_row_1():
    """Not fitted: row 1's forward (no repeat; -15.7% at the full clock) and the DP=2 and
    DP=4 runs' backward over their repeats' (1.061 and 1.075 measured)."""
    inside = session_runs(SESSION, RUNS)
    slow = predict_rows(inside, SESSION.clock)
    full = predict_rows(inside, 1.0)
    row1 = RUNS[0]
    assert full[1].predicted["forward"] / row1.seconds["forward"] - 1 < -0.15
    assert slow[1].predicted["forward"] / row1.seconds["forward"] - 1 == pytest.approx(0, abs=0.05)
    for pair in twins(SESSION, configurations(RUNS))[1:]:
        row = pair.run.row
        modelled = slow[row].predicted["backward"] / full[row].predicted["backward"]
        assert modelled == pytest.approx(pair.measured_ratio("backward"), abs=0.01)
        assert slow[row].predicted["update"] == pytest.approx(full[row].predicted["update"],
                                                              rel=1e-12)
