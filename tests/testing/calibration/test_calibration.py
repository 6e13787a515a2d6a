"""Calibration (gma_ref.testing.calibration.measure): errors of a correct kernel in units of the unit scale ν."""

from __future__ import annotations

from gma_ref.testing.calibration.emulated import NumpyKernel
from gma_ref.testing.calibration.measure import calibrate
from gma_ref.testing.core.compare import TOLERANCES


def test_calibration_reports_errors_in_units_of_nu():
    """calibrate returns normalised figures well below the calibrated tau for a correct kernel."""
    cal = calibrate(NumpyKernel("float32"), "float32", n_cases=6)
    assert not cal.failures
    assert 0 < cal.max_norm() < TOLERANCES["float32"].norm
    assert "d_prior_logits" in cal.summary()
