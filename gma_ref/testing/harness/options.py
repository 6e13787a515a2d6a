"""The options of :func:`~gma_ref.testing.check` grouped: which cases (:class:`CaseSet`) and how the run goes
(:class:`RunOptions`).

Both are frozen dataclasses that validate every field when they are made, so a bad option is an error
naming the field, what it got and what was expected before anything runs:
``TypeError`` for a value of the wrong kind, ``ValueError`` for one of the right kind out of range.
The field checks (:func:`require_count`, :func:`require_seconds`, :func:`require_flag`) also serve
:class:`~gma_ref.testing.harness.bounds.RunBounds`. This module imports nothing of the package.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["CaseSet", "RunOptions", "SCALES", "require_count", "require_seconds", "require_flag"]

#: The case sets a :class:`CaseSet` can name: the short cases, the long-sequence cases, the complexity check.
SCALES: tuple[str, ...] = ("short", "long", "scaling")


def require_count(name: str, value: Any, least: int = 0) -> None:
    """Refuse ``value`` unless it is an int (not a bool) ``>= least``.

    Raises
    ------
    TypeError
        ``value`` is not an int, or is a bool.
    ValueError
        ``value < least``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int >= {least}, got {type(value).__name__} {value!r}")
    if value < least:
        raise ValueError(f"{name} must be an int >= {least}, got {value!r}")


def require_seconds(name: str, value: Any, finite: bool = False) -> None:
    """Refuse ``value`` unless it is ``None`` or a number of seconds > 0 (and finite when ``finite``).

    Raises
    ------
    TypeError
        ``value`` is neither ``None`` nor an int or float (a bool is not a number of seconds).
    ValueError
        ``value`` is not > 0 (NaN included), or is infinite when ``finite``.
    """
    if value is None:
        return
    expected = f"None or a {'finite ' if finite else ''}number of seconds > 0"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__} {value!r}")
    if not value > 0 or (finite and math.isinf(value)):  # `not value > 0` also refuses NaN
        raise ValueError(f"{name} must be {expected}, got {value!r}")


def require_flag(name: str, value: Any, none: bool = False) -> None:
    """Refuse ``value`` unless it is ``True`` or ``False`` (or ``None`` when ``none``).

    Raises
    ------
    TypeError
        ``value`` is anything else (``1`` and ``'yes'`` included).
    """
    if not (isinstance(value, bool) or (none and value is None)):
        expected = "True, False or None" if none else "True or False"
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__} {value!r}")


@dataclass(frozen=True)
class CaseSet:
    """Which cases :func:`~gma_ref.testing.check` runs when it is given no explicit list of cases.

    ``CaseSet()`` is the default: the default set of the mode (with the tiling cases in attention mode),
    seed 0, nothing generated, no search.

    Parameters
    ----------
    n_generated : int
        Seeded random cases added to the default set (:func:`~gma_ref.testing.generate_cases`, or
        :func:`~gma_ref.testing.generate_layer_cases` in layer mode; drawn with ``seed + 1``). Default 0.
    seed : int
        Seed of the default set's inputs, of the generated cases and of the search (``explore``). Default 0.
    tiling : bool
        Add the tiling cases to the default attention set (:func:`~gma_ref.testing.cases.sets.tiling_cases`:
        sizes straddling the usual tile sizes, up to 8 heads and 4 batch entries, ε_σ up to 0.3). On by
        default, as in ``gma-ref check`` and the pytest plugin (``--no-tiling``, ``--gma-no-tiling``);
        ``False`` checks the edge cases alone.
    scale : ``'short'``, ``'long'`` or ``'scaling'``
        ``'short'`` (default): the short cases. ``'long'``: the long-sequence cases of
        :func:`~gma_ref.testing.core.long.long_cases` (N up to ``n_max``, else the declared ``n_max``, else
        131072) against the O(N)-memory reference, with the sum-length term in ν (docs/oracle/long-sequences.md).
        ``'scaling'``: no accuracy check; the growth of peak memory and time with N (up to ``n_max``) and
        with the width K = d_v, each size in a child process, fitted and judged on memory
        (:mod:`~gma_ref.testing.harness.scaling`, docs/oracle/scaling.md); it runs one dtype.
    n_max : int, optional
        Largest N of the long cases or of the scaling sweep (default: the declared ``n_max``).
    explore : float, optional
        Seconds of search beyond the case set after the cases (:func:`~gma_ref.testing.harness.explore.explore`):
        shapes, regimes and the checked dtypes drawn by hypothesis (deterministic under ``seed``), each
        candidate run as the cases are (in the worker when isolated). A failure is shrunk and written as a
        case file and a pytest test into ``check``'s ``repro`` (default ``gma-ref-repro``); its checks join the
        report, which then fails, and :attr:`~gma_ref.testing.Report.explored` says what was searched. Needs
        hypothesis when the check runs (``ImportError`` naming it otherwise).
    file : str or os.PathLike, optional
        Run exactly the case of a reproducer file (``.npz`` written by ``check``'s ``repro``): its inputs,
        options and, unless ``check`` is given them, its dtype, variant and grad. The other fields are then
        unused. Stored as a ``str``.

    Raises
    ------
    TypeError
        A field of the wrong kind: ``n_generated``, ``seed`` or ``n_max`` not an int (a bool is not),
        ``tiling`` not a bool, ``scale`` not a str, ``explore`` not a number, ``file`` not a path.
    ValueError
        ``n_generated`` or ``seed`` < 0, ``n_max`` < 1, an unknown ``scale``, ``explore`` not a finite
        number of seconds > 0, or ``explore`` with ``scale='scaling'`` or a ``file`` (the search runs beside
        the short or long cases).
    """

    n_generated: int = 0
    seed: int = 0
    tiling: bool = True
    scale: str = "short"
    n_max: int | None = None
    explore: float | None = None
    file: str | os.PathLike[str] | None = None

    def __post_init__(self) -> None:
        require_count("CaseSet.n_generated", self.n_generated)
        require_count("CaseSet.seed", self.seed)
        require_flag("CaseSet.tiling", self.tiling)
        if not isinstance(self.scale, str):
            raise TypeError(f"CaseSet.scale must be one of {SCALES}, got {type(self.scale).__name__} "
                            f"{self.scale!r}")
        if self.scale not in SCALES:
            raise ValueError(f"CaseSet.scale must be one of {SCALES}, got {self.scale!r}")
        if self.n_max is not None:
            require_count("CaseSet.n_max", self.n_max, least=1)
        require_seconds("CaseSet.explore", self.explore, finite=True)
        if self.file is not None:
            if not isinstance(self.file, (str, os.PathLike)):
                raise TypeError(f"CaseSet.file must be None or the path of a case file (str or os.PathLike), got "
                                f"{type(self.file).__name__} {self.file!r}")
            object.__setattr__(self, "file", os.fspath(self.file))  # frozen: set once, as the path string
        if self.explore is not None and (self.scale == "scaling" or self.file is not None):
            what = "scale='scaling'" if self.scale == "scaling" else "a case file"
            raise ValueError(f"CaseSet.explore={self.explore!r} cannot be combined with {what}: the search runs "
                             "beside the short or long cases")


@dataclass(frozen=True)
class RunOptions:
    """Where :func:`~gma_ref.testing.check` runs the candidate, for how long, and what it says meanwhile.

    ``RunOptions()`` is the default: a worker process whenever the candidate can be loaded there, no time
    limit, a run that stops after two consecutive cases that hang or crash alike.

    Parameters
    ----------
    in_process : bool, optional
        ``True`` runs the implementation in this process (for debugging; a target is imported here);
        ``False`` insists on a worker (``check`` raises ``ValueError`` when it cannot load the callable);
        ``None`` (default): a worker whenever it can. A scaling check, and a callable with a separate
        ``vjp=``, always run here (a scaling check runs each size in a child process).
    timeout : float, optional
        Seconds one case (all its calls) may take. A case that takes longer fails ("timeout"). Isolated: the
        worker is killed and a fresh one runs the next case. In-process: the remaining cases are not run
        (listed as skipped), and the stuck call is abandoned in a daemon thread. Default: no limit.
    import_timeout : float, optional
        Seconds the worker may take to import the target (default
        :data:`~gma_ref.testing.calling.isolation.IMPORT_TIMEOUT_S`).
    budget : float, optional
        Seconds the whole run may take: a case gets at most what is left, and once it is spent the
        remaining cases are listed as not run. A run that stopped early has
        :attr:`~gma_ref.testing.Report.stopped` set and does not pass. Several dtypes share it equally.
    keep_going : bool
        Run every case even after two consecutive cases ended in ``timeout`` or in the same crash
        (default: the run stops there, and the cases after are listed as not run, with the reason;
        :class:`~gma_ref.testing.harness.bounds.RunBounds`).
    progress : callable, optional
        ``progress(done, total, case_id, elapsed_s)`` after every case.
    full_traceback : bool
        Report the whole traceback of a raising call (default: the exception and the deepest frame of the
        caller's own code).

    Raises
    ------
    TypeError
        A field of the wrong kind: ``in_process`` not ``None`` or a bool, ``keep_going`` or ``full_traceback``
        not a bool, a number of seconds that is not a number (a bool is not), ``progress`` not callable.
    ValueError
        ``timeout`` or ``import_timeout`` not > 0, or ``budget`` not a finite number of seconds > 0.
    """

    in_process: bool | None = None
    timeout: float | None = None
    import_timeout: float | None = None
    budget: float | None = None
    keep_going: bool = False
    progress: Callable[[int, int, str, float], None] | None = None
    full_traceback: bool = False

    def __post_init__(self) -> None:
        require_flag("RunOptions.in_process", self.in_process, none=True)
        require_seconds("RunOptions.timeout", self.timeout)
        require_seconds("RunOptions.import_timeout", self.import_timeout)
        require_seconds("RunOptions.budget", self.budget, finite=True)
        require_flag("RunOptions.keep_going", self.keep_going)
        if self.progress is not None and not callable(self.progress):
            raise TypeError(f"RunOptions.progress must be None or callable as progress(done, total, case_id, "
                            f"elapsed_s), got {type(self.progress).__name__} {self.progress!r}")
        require_flag("RunOptions.full_traceback", self.full_traceback)
