"""The detection power of the default case set: how many faults of the project's fault model its check kills.

The fault model (``tests/support/fault_model.py``, listed in docs/oracle/fault-model.md) is a
catalogue of generic faults of tiled kernels — tail loops, tile pointers, carried state,
masks, index slips, reductions, constants, missing gradient paths — each applied to a
correct tiled kernel. ``tools/fault_power.py`` runs the default check on every faulty kernel
in float32 and float64 and writes the counts to ``detection_power.json`` beside this module,
with a fingerprint of the case set they were measured on (every field of every case: sizes, regime,
ε, ε_σ, chunk, seed, dtype). :func:`detection_text` turns
that file into the words of a report's summary line, and says so when the cases a check
runs are not the set that was measured. The fault model itself is test material of the
project's and never on a candidate's import path: only its counts ship.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from functools import lru_cache
from importlib import resources
from typing import Any

from .sets import Case, default_cases

__all__ = ["DETECTION_FILE", "MEASURED_DTYPES", "case_set_fingerprint", "default_set_fingerprint",
           "measured_power", "detection_text"]

#: The file (in this package) that ``tools/fault_power.py`` writes.
DETECTION_FILE = "detection_power.json"
#: The dtypes whose default checks the fault model is run through.
MEASURED_DTYPES: tuple[str, ...] = ("float32", "float64")


def case_set_fingerprint(cases: Sequence[Case]) -> str:
    """SHA-256 (hex) of the sorted definitions of ``cases`` (the ``repr`` of each :class:`Case`, every field).

    The same cases in any order give the same fingerprint; a case more, or one field of one case
    changed (an ε, a size, a seed), gives another.
    """
    return hashlib.sha256("\n".join(sorted(repr(c) for c in cases)).encode()).hexdigest()


@lru_cache(maxsize=1)
def default_set_fingerprint() -> str:
    """The fingerprint of the default attention cases of every dtype of :data:`MEASURED_DTYPES`, together."""
    return case_set_fingerprint([c for d in MEASURED_DTYPES for c in default_cases(dtype=d, tiling=True)])


@lru_cache(maxsize=1)
def measured_power() -> dict[str, Any] | None:
    """The contents of :data:`DETECTION_FILE` (``faults``, ``case_set``, and per dtype ``{'killed': n}``), or
    ``None`` when the file is missing or unreadable (an install without package data)."""
    try:
        text = resources.files(__package__).joinpath(DETECTION_FILE).read_text(encoding="utf-8")
        data = json.loads(text)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "faults" in data else None


def detection_text(cases: Sequence[Case], dtype: str) -> str:
    """The summary line's words on detection power for a check of ``dtype`` over ``cases``.

    ``'detection power 131/133 faults of the fault model'`` when ``cases`` are the default
    attention cases of ``dtype`` and the figure was measured on the current default set;
    otherwise what is known instead (not measured for this dtype, for this case set, or for
    the current default set). ``''`` when no figure ships.
    """
    data = measured_power()
    if data is None:
        return ""
    if dtype not in MEASURED_DTYPES or dtype not in data:
        return f"detection power not measured in {dtype} (only {' and '.join(MEASURED_DTYPES)})"
    if data.get("case_set") != default_set_fingerprint():
        return "detection power not measured for the current default case set"
    if list(cases) != default_cases(dtype=dtype, tiling=True):
        return (f"detection power not measured for this case set (the default set kills "
                f"{data[dtype]['killed']}/{data['faults']} faults of the fault model)")
    return f"detection power {data[dtype]['killed']}/{data['faults']} faults of the fault model"
