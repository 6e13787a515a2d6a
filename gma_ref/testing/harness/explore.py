"""Search beyond the case set: hypothesis draws cases, a failure is shrunk and written as a case file and a test.

``check(impl, cases=CaseSet(explore=SECONDS))`` (``gma-ref check --explore SECONDS``, the plugin's
``--gma-explore SECONDS``) runs, after the cases, :func:`explore`: hypothesis draws attention
cases over

* the shapes B ≤ 3, H ≤ 4, N_q, N_k ≤ 300 (N_q ≠ N_k for cross), K ≤ 70, d_r, d_v ≤ 140 — each size
  drawn small (≤ 32), anywhere in its range, or as a multiple of a usual tile (8, 16, 32, 64) plus a
  remainder, so tails of every length come up; a case larger than :data:`VOLUME_MAX` gets one batch
  entry and one head, then fewer tokens, so that each stays quick;
* the regimes, the chunk size (1 to 64), the variants and the dtype checked;

each case mapped to the declared constraints, and calls the candidate through the same machinery as
the cases (one case at a time, in the worker when the check is isolated). The search is
deterministic under the check's seed (hypothesis with a fixed seed, no example database, no
deadline) and stops when ``SECONDS`` are spent; the number of cases it tries depends on the speed of
the machine. The first failure is shrunk by hypothesis to its smallest shape — shrinking may take up to
``SECONDS`` more after the failure is found, so a search takes at most twice its budget (and one
case) — and written into the reproducer directory as

* ``<case id>.npz`` — the case file (:func:`~gma_ref.testing.harness.repro.write_reproducer`), which
  ``check(impl, cases=CaseSet(file=...))`` and ``gma-ref check ... --case-file`` run;
* ``test_<case id>.py`` — a pytest test that checks the kernel on that case file and asserts it
  passes, ready to paste into the kernel's own tests (with the case file beside it).

hypothesis is a test extra of gma-ref: it is imported when a search runs, and a missing one is an
``ImportError`` that names it.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..cases.sets import Case, case_arrays, constrain_case
from ..core.report import CheckResult, rerun_command
from ..declaration import Declaration
from ..names import REGIMES
from .repro import write_reproducer

__all__ = ["DEFAULT_EXPLORE_DIR", "EXPLORE_LIMITS", "TILES", "VOLUME_MAX", "SMALL", "RunCase", "Explored", "explore",
           "case_strategy", "test_file_text"]

#: Where a failure found is written unless a reproducer directory is given (as ``gma-ref check``'s default).
DEFAULT_EXPLORE_DIR = "gma-ref-repro"
#: The largest sizes the search draws: they keep one case to a fraction of a second in NumPy.
EXPLORE_LIMITS: dict[str, int] = {"batch": 3, "heads": 4, "n": 300, "k": 70, "d": 140, "chunk": 64}
#: The tile sizes whose multiples (plus a remainder) the search favours.
TILES: tuple[int, ...] = (8, 16, 32, 64)
#: The largest B·H·max(N_q, N_k)·K·(d_r + d_v) of a case drawn (about a tenth of a second in NumPy, gradients
#: included): a larger draw gets B = H = 1, then fewer tokens.
VOLUME_MAX = 10**6
#: A third of the sizes drawn are at most this (small cases are quick: more of them fit in the time).
SMALL = 32

#: A case that runs the candidate's checks: its results, or ``None`` when the case is not checkable.
RunCase = Callable[[Case], "list[CheckResult] | None"]


@dataclass
class Explored:
    """What a search did: its budget and time, how many cases it tried, and the failure it found (if any).

    ``found`` is the first failing case drawn, ``failure`` the smallest it shrank to, ``failure_results``
    that case's failing checks; ``case_file`` and ``test_file`` the paths written (``None`` when writing
    failed; ``note`` says why).
    """

    budget_s: float
    seed: int
    dtypes: list[str]
    elapsed_s: float = 0.0
    tried: int = 0
    found_after: int = 0
    found: Case | None = None
    failure: Case | None = None
    failure_results: list[CheckResult] = field(default_factory=list)
    case_file: str | None = None
    test_file: str | None = None
    note: str = ""

    def summary(self) -> dict[str, Any]:
        """The report's :attr:`~gma_ref.testing.core.report.Report.explored`: plain values only."""
        out: dict[str, Any] = {"budget_s": self.budget_s, "elapsed_s": self.elapsed_s, "seed": self.seed,
                               "tried": self.tried, "dtypes": list(self.dtypes), "failure": None}
        if self.failure is not None and self.found is not None:
            out["failure"] = {"case_id": self.failure.case_id, "found_id": self.found.case_id,
                              "found_after": self.found_after,
                              "case_file": self.case_file, "test_file": self.test_file, "note": self.note}
        return out


class _Spent(BaseException):
    """Raised inside the hypothesis test when the time is spent (a BaseException: hypothesis does not shrink it)."""


def _size(st: Any, hi: int) -> Any:
    """A size in [1, ``hi``]: small (at most :data:`SMALL`), anywhere, or a multiple of a tile plus a remainder
    below the tile (at most ``hi``), each a third of the time."""
    def tiled(t: int) -> Any:
        return st.builds(lambda m, r: min(hi, t * m + r), st.integers(1, max(1, hi // t)), st.integers(0, t - 1))

    return st.one_of(st.integers(1, min(hi, SMALL)), st.integers(1, hi), st.sampled_from(TILES).flatmap(tiled))


def case_strategy(variants: Sequence[str], dtype: str) -> Any:
    """The hypothesis strategy of :func:`explore`'s cases (attention cases of ``variants`` in ``dtype``)."""
    from hypothesis import strategies as st

    lim = EXPLORE_LIMITS

    def build(variant: str, b: int, h: int, n_q: int, n_k: int, k: int, d_r: int, d_v: int, regime: str,
              chunk: int, seed: int) -> Case:
        width = k * (d_r + d_v)
        if b * h * max(n_q, n_k) * width > VOLUME_MAX:
            b = h = 1
        n_q, n_k = (max(1, min(n, VOLUME_MAX // (b * h * width))) for n in (n_q, n_k))
        if variant != "cross":
            n_k = n_q
        elif n_k == n_q:
            n_k = n_q + 1 if n_q < lim["n"] else n_q - 1
        return Case(variant=variant, batch=b, heads=h, n_q=n_q, n_k=n_k, n_components=k, d_r=d_r, d_v=d_v,
                    dtype=dtype, regime=regime, eps=1e-12 if regime == "tiny_eps" else 1e-6, chunk_size=chunk,
                    seed=seed)

    return st.builds(build, st.sampled_from(list(variants)), st.integers(1, lim["batch"]),
                     st.integers(1, lim["heads"]), _size(st, lim["n"]), _size(st, lim["n"]), _size(st, lim["k"]),
                     _size(st, lim["d"]), _size(st, lim["d"]), st.sampled_from(REGIMES),
                     st.integers(1, lim["chunk"]), st.integers(0, 1000))


def _admissible(case: Case, decl: Declaration) -> Case:
    """``case`` mapped to the sizes, ε and ε_σ that ``decl`` admits
    (:func:`~gma_ref.testing.cases.sets.constrain_case`)."""
    return constrain_case(case, eps=decl.eps, eps_sigma=decl.eps_sigma, n_multiple=decl.n_multiple,
                          n_max=decl.n_max, k_multiple=decl.k_multiple, k_max=decl.k_max, d_multiple=decl.d_multiple,
                          d_max=decl.d_max, chunked=decl.accepts_chunk_size)[0]


def explore(run: RunCase, decl: Declaration, *, variants: Sequence[str], dtype: str, seed: int, seconds: float,
            directory: str, name: str, grad: bool, target: str | None = None) -> Explored:
    """Search for ``seconds`` for a case that ``run`` fails; shrink the first found and write it to ``directory``.

    ``run(case)`` checks one case and returns its results (``None``: not checkable, not a failure).
    ``name`` is the implementation's name in the report, ``target`` the ``package.module:attribute``
    the written test checks (default: ``name`` when it is one). Deterministic under ``seed`` (the
    number of cases tried aside). The search stops when ``seconds`` are spent; the first failure is
    shrunk for at most ``seconds`` more. Returns an :class:`Explored`.

    Raises
    ------
    ImportError
        hypothesis is not installed (it is the ``test`` extra of gma-ref).
    ValueError
        ``seconds`` is not a finite number > 0, or ``variants`` is empty.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < float("inf"):
        raise ValueError(f"seconds must be a finite number > 0, got {seconds!r}")
    if not variants:
        raise ValueError("variants must name at least one variant to search, got none")
    try:
        import hypothesis
        from hypothesis import HealthCheck, Phase, Verbosity, given, settings
    except ImportError as exc:
        raise ImportError("explore needs hypothesis (pip install 'gma-ref[test]' or pip install hypothesis)") from exc
    out = Explored(budget_s=float(seconds), seed=seed, dtypes=[dtype])
    t0 = time.perf_counter()
    state: dict[str, Any] = {"deadline": t0 + seconds, "best": None}

    def probe(raw: Case) -> None:
        if time.perf_counter() > state["deadline"]:
            raise _Spent
        case = _admissible(raw, decl)
        out.tried += 1
        failed = [r for r in (run(case) or []) if not r.passed]
        if failed:
            if out.found is None:
                out.found, out.found_after = case, out.tried
                state["deadline"] = max(state["deadline"], time.perf_counter() + seconds)
            state["best"] = (case, failed)
            raise AssertionError(case.case_id)

    search = settings(database=None, deadline=None, max_examples=10**6, derandomize=False, print_blob=False,
                      verbosity=Verbosity.quiet, phases=(Phase.generate, Phase.shrink),
                      suppress_health_check=list(HealthCheck))(given(case_strategy(variants, dtype))(probe))
    try:
        hypothesis.seed(seed)(search)()
    except (_Spent, Exception):  # noqa: BLE001 - the time spent, the failure re-raised, or hypothesis giving up
        pass
    if state["best"] is not None:
        out.failure, out.failure_results = state["best"]
        _write(out, decl, directory, name, grad, target)
    out.elapsed_s = time.perf_counter() - t0
    return out


def _write(out: Explored, decl: Declaration, directory: str, name: str, grad: bool, target: str | None) -> None:
    """Write the shrunk failure's case file and its pytest test into ``directory`` (a failure to write is noted)."""
    case = out.failure
    assert case is not None
    lines = [r.format(full=True).strip() for r in out.failure_results]
    try:
        out.case_file = write_reproducer(directory, case, case_arrays(case), decl, name=name, grad=grad,
                                         failures=lines)
        path = os.path.join(directory, "test_" + _identifier(case.case_id) + ".py")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(test_file_text(case, out.case_file, name, target, lines))
        out.test_file = path
    except OSError as exc:
        out.note = f"not written: {type(exc).__name__}: {exc}"


def _identifier(text: str) -> str:
    """``text`` as a Python identifier (a case id's ``-`` and ``.`` become ``_``)."""
    return re.sub(r"\W", "_", text)


_TARGET = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def test_file_text(case: Case, case_file: str, name: str, target: str | None, failures: Sequence[str]) -> str:
    """The pytest module written beside a found failure's case file ``case_file``: it checks the kernel on that case
    (the file of that name beside the module).

    The kernel is ``target`` (``package.module:attribute``), else ``name`` when it is one; otherwise the
    module says to set ``IMPL`` to the kernel, and its test fails until it is set.
    """
    case_file_name = os.path.basename(case_file)
    impl = target or (name if _TARGET.fullmatch(name) else None)
    shown = "".join("#   " + line + "\n" for f in failures[:6] for line in f.splitlines())
    how = (f"IMPL = {impl!r}" if impl is not None else
           f"IMPL = None  # set it to the kernel {name!r}: a callable, or its 'package.module:attribute'")
    sizes = (f"{case.variant}, B={case.batch}, H={case.heads}, N_q={case.n_q}, N_k={case.n_k}, "
             f"K={case.n_components}, d_r={case.d_r}, d_v={case.d_v}, {case.dtype}, {case.regime}")
    return (f'"""The case {case.case_id}, found by gma-ref\'s search beyond the case set and shrunk:\n'
            f'{sizes}.\n\nKeep {case_file_name} beside this file.\n"""\n\n'
            f"# It failed with:\n{shown}# Re-run it alone: {rerun_command(name, case_file)}\n\n"
            "from pathlib import Path\n\nfrom gma_ref.testing import CaseSet, check\n\n"
            f"{how}\nCASE_FILE = Path(__file__).with_name({case_file_name!r})\n\n\n"
            f"def test_{_identifier(case.case_id)}() -> None:\n"
            f'    """The kernel passes the case {case.case_id}."""\n'
            '    assert IMPL is not None, "set IMPL to the kernel to check"\n'
            "    report = check(IMPL, cases=CaseSet(file=CASE_FILE))\n"
            "    assert report.passed, report.format()\n")
