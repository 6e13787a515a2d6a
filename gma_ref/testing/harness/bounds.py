"""How long a run may go on: it stops after a repeated hang or crash, or when its overall budget is spent.

:class:`RunBounds` is consulted by :func:`~gma_ref.testing.check` around every case and by the pytest plugin
around every item. Two consecutive cases that end in ``timeout``, or in the same crash (the same ``crashed``
detail: the same signal or exit status), stop the run: a kernel that hangs holding the GIL then costs two
per-case limits, not one per case. The cases after are listed as not run, with the reason, and the report is
otherwise complete. ``keep_going`` runs every case regardless; ``budget`` bounds the whole run's seconds (a
case gets at most what is left of it).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..core.report import CheckResult
from .options import require_flag, require_seconds

__all__ = ["RunBounds", "STOP_AFTER"]

#: Consecutive cases ending in ``timeout`` (or in the same crash) after which a run stops.
STOP_AFTER: int = 2


class RunBounds:
    """The stopping rule of one run.

    Parameters
    ----------
    keep_going : bool
        Never stop after repeated timeouts or crashes.
    budget : float, optional
        Seconds the whole run may take (``None``: no limit).
    hint : str
        How to ask for every case to be run, quoted in the reason (``'--gma-keep-going'`` in the pytest plugin).

    Raises
    ------
    TypeError
        ``keep_going`` is not a bool, or ``budget`` is not ``None`` or a number (a bool is not).
    ValueError
        ``budget`` is not a finite number of seconds > 0.
    """

    def __init__(self, keep_going: bool = False, budget: float | None = None,
                 hint: str = "--keep-going or RunOptions(keep_going=True)") -> None:
        require_flag("keep_going", keep_going)
        require_seconds("budget", budget, finite=True)
        self.keep_going, self.budget, self.hint = keep_going, budget, hint
        self.start = time.monotonic()
        self.streak: list[tuple[str, str]] = []  # (case id, how it ended) of the latest cases that hung or crashed
        #: Why the run stopped (``''`` while it goes on): the reason :meth:`before_case` or :meth:`after_case` gave.
        self.stopped = ""

    def left(self) -> float | None:
        """Seconds left of the budget (``None``: no budget)."""
        return None if self.budget is None else self.budget - (time.monotonic() - self.start)

    def case_timeout(self, timeout: float | None) -> float | None:
        """The limit of the next case: ``timeout``, or less when less of the budget is left."""
        left = self.left()
        if left is None:
            return timeout
        left = max(left, 0.001)
        return left if timeout is None else min(timeout, left)

    def before_case(self, done: int, total: int) -> str | None:
        """Why the next case is not run (the budget is spent), or ``None``."""
        left = self.left()
        if left is not None and left <= 0:
            self.stopped = f"the run's budget of {self.budget:g} s was spent after {done} of {total} cases"
            return self.stopped
        return None

    def after_case(self, case_id: str, results: Sequence[CheckResult]) -> str | None:
        """Record how ``case_id`` ended; why the run stops now (``None``: it goes on)."""
        ending = _ending(results)
        if ending is None:
            self.streak = []
            return None
        if self.streak and self.streak[-1][1] != ending:
            self.streak = []
        self.streak.append((case_id, ending))
        if self.keep_going or len(self.streak) < STOP_AFTER:
            return None
        ids = " and ".join(cid for cid, _ in self.streak[-STOP_AFTER:])
        what = "timeout" if ending == "timeout" else f"the same crash ({ending})"
        self.stopped = f"{STOP_AFTER} consecutive cases ended in {what}: {ids} ({self.hint} runs every case)"
        return self.stopped


def _ending(results: Sequence[CheckResult]) -> str | None:
    """``'timeout'``, the crash's detail, or ``None`` for a case that ran to the end."""
    for r in results:
        if r.check == "call" and r.tensor == "case" and r.metric == "timeout":
            return "timeout"
        if r.check == "call" and r.tensor == "case" and r.metric == "crashed":
            return r.detail.split(";")[0]
    return None
