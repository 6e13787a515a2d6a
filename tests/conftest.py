"""Shared fixtures: array namespaces under test and hypothesis profiles.

Profiles: ``ci`` (default; derandomised, few examples, fits the CI budget) and
``thorough`` (many random examples, for local runs)::

    pytest --hypothesis-profile=thorough
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=20,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile(
    "thorough",
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.load_profile("ci")


def _cupy_reason() -> str | None:
    """``None`` if CuPy with a usable CUDA device is present, else why not."""
    try:
        cupy = importlib.import_module("cupy")
    except Exception as exc:  # ImportError, or a broken CUDA install
        return f"CuPy is not importable ({type(exc).__name__}: {exc})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return f"CuPy found no CUDA device ({type(exc).__name__}: {exc})"
    if n < 1:
        return "CuPy found no CUDA device"
    return None


CUPY_SKIP_REASON = _cupy_reason()


def _torch_reason() -> str | None:
    """``None`` if PyTorch is importable (its CPU tensors are enough), else why not."""
    try:
        importlib.import_module("torch")
    except Exception as exc:  # ImportError, or a broken install
        return f"PyTorch is not importable ({type(exc).__name__}: {exc})"
    return None


TORCH_SKIP_REASON = _torch_reason()

NAMESPACES = [
    "numpy",
    "array_api_strict",
    "torch",
    pytest.param("cupy", marks=[pytest.mark.cupy]),
]


def load_namespace(name: str):
    """Import the array namespace ``name`` (skipping with the reason for PyTorch and CuPy)."""
    if name == "numpy":
        import array_api_compat.numpy as xp

        return xp
    if name == "array_api_strict":
        import array_api_strict as xp

        return xp
    if name == "torch":
        if TORCH_SKIP_REASON is not None:
            pytest.skip(f"PyTorch tests skipped: {TORCH_SKIP_REASON}")
        import array_api_compat.torch as xp

        return xp
    if name == "cupy":
        if CUPY_SKIP_REASON is not None:
            pytest.skip(f"CuPy tests skipped: {CUPY_SKIP_REASON}")
        import array_api_compat.cupy as xp

        return xp
    raise ValueError(name)


@pytest.fixture(params=NAMESPACES)
def xp(request):
    """Every array namespace the forward tests run under."""
    return load_namespace(request.param)


def pytest_report_header(config):
    if CUPY_SKIP_REASON is None:
        return "gma-ref: CuPy tests enabled (CUDA device found)"
    return f"gma-ref: CuPy tests will skip: {CUPY_SKIP_REASON}"


@pytest.fixture
def rng():
    return np.random.default_rng(20260611)


def pytest_runtest_logreport(report):
    """With ``GMA_REF_SKIPPED_FILE`` set, append the node id of every skipped test to that file.

    ``.ci/run`` uses it to run again, once the optional frameworks are installed, exactly the tests
    that the README's command skipped in a fresh environment.
    """
    import os

    path = os.environ.get("GMA_REF_SKIPPED_FILE")
    if path and report.skipped and report.when in ("setup", "call"):
        with open(path, "a", encoding="utf-8") as f:
            f.write(report.nodeid + "\n")
