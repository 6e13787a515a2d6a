"""Calibration: the known-good kernels the tolerances were measured on, and the measurement.

Nothing a candidate's check runs imports this package. The kernels
(:mod:`~gma_ref.testing.calibration.emulated`, :mod:`~gma_ref.testing.calibration.emulated_layer`,
:mod:`~gma_ref.testing.calibration.emulated_long`, :mod:`~gma_ref.testing.calibration.rounding_family`)
import only the vocabulary and the declaration; :mod:`~gma_ref.testing.calibration.measure` runs them
over the cases with τ = 1.
"""

__all__: list[str] = []
