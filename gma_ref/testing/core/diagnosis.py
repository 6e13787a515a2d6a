"""Likely causes of a failing report: failure patterns a kernel author can act on.

:func:`diagnose` reads a finished :class:`~gma_ref.testing.core.report.Report` — which cases failed
(their variant and regime, from the case id), which checks and tensors, the worst elements —
and names the likely cause when the pattern is a known one:

* every case raised the same way — the calling convention or the array kind;
* NaN/Inf in the whole output of every failing case — an output never written, or a 0/0;
* every failing tensor the reference times one constant — a stray scale factor;
* only the ``tiny_eps`` cases — ε missing, hard-coded or in the wrong place;
* only the far/floor/tiny regimes at bfloat16/float16 — accumulation in the storage precision;
* only gradients, only the non-contiguous layout, only determinism;
* the smallest conjunction of case attributes (:func:`separating_conjunction`: variant, B > 1,
  H > 1, more than one chunk, K, d_r, d_v past a tile of 8, 16, 32 or 64 and the remainder, N past
  a tile, regime, dtype, N_q ≠ N_k) that holds for every failing case and no passing one, with the
  counts — "every failing case has d_r > 16 with d_r mod 16 ≠ 0 (9 of 9 failing, 0 of 64 passing)";
  when it is the causal or the cross variant alone and the failures are wrong numbers, what to look
  at there. Cases that crashed or timed out are said to have crashed, and nothing is inferred about
  their arithmetic. Nothing is said when no case passed or no conjunction of up to
  :data:`MAX_CONJUNCTION` attributes separates the failing cases from the passing ones.

A passing report gets no hint; a pattern that fits none of these gets none either.
:func:`requested_but_skipped` says, for the top of the report, what was asked for and not checked.
Both are pure functions of the report (no array, no framework).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ..names import REGIMES, VARIANTS


class ReportLike(Protocol):
    """What the rules read of a :class:`~gma_ref.testing.core.report.Report` (this module sits below it)."""

    dtype: str
    case_ids: list[str]
    skipped: Sequence[Any]

    @property
    def failures(self) -> list[Any]: ...

    def failed_cases(self) -> list[str]: ...

__all__ = ["diagnose", "requested_but_skipped", "case_regime", "case_variant", "case_attributes",
           "separating_conjunction", "MAX_CONJUNCTION", "ReportLike"]

#: Regimes that stress precision and range (the default set's edge regimes).
_HARD_REGIMES: tuple[str, ...] = tuple(r for r in REGIMES if r != "normal")
#: Relative spread within which worst-element ratios count as "one constant".
_FACTOR_SPREAD = 1e-3

_SIZES = re.compile(r"-B(\d+)-H(\d+)-N(\d+)(?:x\d+)?-K\d+-(?:dm\d+-)?dr\d+-dv(\d+)-")


def case_regime(case_id: str) -> str:
    """The regime named in a case id (``'normal'`` when none is)."""
    parts = case_id.split("-")
    return next((p for p in parts if p in _HARD_REGIMES), "normal")


def case_variant(case_id: str) -> str | None:
    """The variant named in a case id (``None`` when none is)."""
    return next((p for p in case_id.split("-") if p in VARIANTS), None)


def _output_size(case_id: str) -> int | None:
    """B·H·N_q·d_v of an attention case id (``None`` for other ids)."""
    m = _SIZES.search("-" + case_id + "-")
    if m is None or case_id.startswith("layer-"):
        return None
    b, h, n, dv = (int(g) for g in m.groups())
    return b * h * n * dv


class _Facts:
    """What the rules look at: the failing results by case, the cases that passed."""

    def __init__(self, report: ReportLike) -> None:
        self.report = report
        # a declared property found false (check 'declaration') says so itself; the rules read the cases
        self.failures: list[Any] = [r for r in report.failures if r.check != "declaration"]
        ids = {r.case_id for r in self.failures}
        self.failed = [c for c in report.failed_cases() if c in ids]
        self.passed = [c for c in dict.fromkeys(report.case_ids) if c not in set(self.failed)]
        self.low_precision = report.dtype in ("bfloat16", "float16")


def _raised_everywhere(f: _Facts) -> str | None:
    if f.passed or any(r.metric != "raised" for r in f.failures):
        return None
    first = f.failures[0].detail.split("\n", 1)[0][:200]
    return (f"every case raised ({first}): the implementation could not run on the oracle's inputs at all; "
            "check the calling convention and the declared namespace and dtype "
            "(docs/oracle/calling-convention.md)")


def _nonfinite_everywhere(f: _Facts) -> str | None:
    for cid in f.failed:
        counts = [r.value for r in f.failures if r.case_id == cid and r.metric == "finite" and r.tensor == "out"]
        size = _output_size(cid)
        if not counts or (size is not None and counts[0] != size):
            return None
    return ("the output is NaN/Inf in every element of every failing case: an output buffer never written, "
            "or a NaN that spreads through a reduction (a 0/0, a log of 0, an uninitialised accumulator)")


def _constant_factor(f: _Facts) -> str | None:
    by_tensor: dict[tuple[str, str], float] = {}  # (case, tensor) -> ratio; the layout check repeats the forward's
    for r in f.failures:
        if r.metric == "elem" and r.check != "layout" and r.worst_actual is not None and r.worst_expected:
            by_tensor[(r.case_id, r.tensor)] = r.worst_actual / r.worst_expected
    if len(by_tensor) < 2 or {c for c, _ in by_tensor} != set(f.failed):
        return None
    ratios = sorted(by_tensor.values())
    mid = ratios[len(ratios) // 2]
    if mid == 0 or not all(abs(x - mid) <= _FACTOR_SPREAD * abs(mid) for x in ratios) \
            or abs(mid - 1.0) <= _FACTOR_SPREAD:
        return None
    return (f"every failing tensor is the reference times {mid:.6g} at its worst element: a stray constant "
            "factor (a scale, a normalisation, a factor 2 or a sign) applied to the result")


def _only_tiny_eps(f: _Facts) -> str | None:
    if not all(case_regime(c) == "tiny_eps" for c in f.failed) or not f.passed:
        return None
    return ("only the tiny_eps cases fail: the read stabiliser eps is probably missing, hard-coded or in the "
            "wrong place. These cases make the routed mass u_i = sum_k Gamma^Q_ik Z_k comparable to eps, where "
            "out = (Gamma^Q V~) / (u + eps) depends on it: add the caller's eps, to the denominator only")


def _storage_precision(f: _Facts) -> str | None:
    regimes = sorted({case_regime(c) for c in f.failed} - {"normal"})
    normal_failed = sum(case_regime(c) == "normal" for c in f.failed)
    normal_passed = sum(case_regime(c) == "normal" for c in f.passed)
    if not f.low_precision or not regimes or normal_failed >= normal_passed:
        return None
    also = f" (and {normal_failed} normal case{'s' if normal_failed > 1 else ''})" if normal_failed else ""
    return (f"the {'/'.join(regimes)} cases fail at {f.report.dtype}{also} while most normal cases pass: likely "
            f"computation in {f.report.dtype} itself. The oracle expects a mixed-precision kernel: inputs, "
            f"outputs and stored intermediates in {f.report.dtype}, but scores, exponentials, sums and the "
            "read's division accumulated in float32 (cast up before the reductions, round once when storing)")


def _only_check(check: str, cause: str) -> Callable[[_Facts], str | None]:
    def rule(f: _Facts) -> str | None:
        if all(r.check == check for r in f.failures):
            tensors = sorted({r.tensor for r in f.failures})
            return f"only the {check} checks fail ({', '.join(tensors)}): {cause}"
        return None

    return rule


#: The rules, most specific first; the first two explain everything else away when they apply.
_EXCLUSIVE: tuple[Callable[[_Facts], str | None], ...] = (_raised_everywhere, _nonfinite_everywhere)
_RULES: tuple[Callable[[_Facts], str | None], ...] = (
    _constant_factor,
    _only_tiny_eps,
    _storage_precision,
    _only_check("gradient", "the forward is right; the backward is wrong (or the VJP returns its gradients under "
                "the wrong names or in the wrong order)"),
    _only_check("layout", "the kernel assumes contiguous row-major inputs; the oracle also passes transposed "
                "(strided) ones: make them contiguous or use the strides"),
    _only_check("determinism", "two calls on the same inputs differ (atomics or an unordered reduction); "
                "declare deterministic=False if that is intended"),
)


def diagnose(report: ReportLike) -> list[str]:
    """The likely causes of ``report``'s failures, one sentence each; ``[]`` when it passed or no rule fits."""
    if not report.failures:
        return []
    facts = _Facts(report)
    if not facts.failures:
        return []
    for rule in _EXCLUSIVE:
        said = rule(facts)
        if said is not None:
            return [said]
    out = [said for rule in _RULES if (said := rule(facts)) is not None]
    conj = _conjunction_line(facts)
    if conj is not None and not (conj.startswith("every failing case has regime tiny_eps (")
                                 and any(line.startswith("only the tiny_eps") for line in out)):
        out.append(conj)
    return out


#: The most attributes a separating conjunction may join (:func:`separating_conjunction`).
MAX_CONJUNCTION = 3
#: The tile sizes whose crossing (and remainder) is an attribute of K, d_r, d_v and N.
_ATTRIBUTE_TILES: tuple[int, ...] = (8, 16, 32, 64)
#: What to look at when the causal or the cross variant alone fails with wrong numbers.
_VARIANT_CAUSES: dict[str, str] = {
    "causal": "the causal mask (key j visible to query i iff j <= i), the state carried between chunks (a chunk "
              "boundary, the prefix sums of V~ and Z) or the running mass",
    "cross": "N_q != N_k there: a loop bound, shape or stride taken from the queries for the keys",
}
#: The checks' metrics of a call that returned no result (it raised, exited, crashed, hung or ran out of memory).
_CALL_LOST = ("raised", "crashed", "timeout", "exited", "memory")

_CASE_ID = re.compile(r"^(?:layer-)?(?P<variant>bidirectional|causal|cross)-B(?P<b>\d+)-H(?P<h>\d+)-N(?P<nq>\d+)"
                      r"(?:x(?P<nk>\d+))?-K(?P<k>\d+)-(?:dm\d+-)?dr(?P<dr>\d+)-dv(?P<dv>\d+)-(?P<dt>[a-z0-9]+)"
                      r"(?:-c(?P<c>\d+))?(?P<rest>-.*)?$")
_DTYPES = {"f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def case_attributes(case_id: str) -> dict[str, Any] | None:
    """The attributes of a case read from its id: ``variant``, ``B``, ``H``, ``N_q``, ``N_k``, ``K``, ``d_r``,
    ``d_v``, ``dtype``, ``chunk`` (0 unless causal), ``regime``; ``None`` for an id that is not a case's."""
    m = _CASE_ID.match(case_id)
    if m is None:
        return None
    nq = int(m["nq"])
    return {"variant": m["variant"], "B": int(m["b"]), "H": int(m["h"]), "N_q": nq,
            "N_k": int(m["nk"]) if m["nk"] else nq, "K": int(m["k"]), "d_r": int(m["dr"]), "d_v": int(m["dv"]),
            "dtype": _DTYPES.get(m["dt"], m["dt"]), "chunk": int(m["c"] or 0), "regime": case_regime(case_id)}


def _atoms(failing: list[dict[str, Any]]) -> list[tuple[str, Callable[[dict[str, Any]], bool]]]:
    """The attributes a conjunction is made of, in the order of preference (the first of equals is named)."""
    out: list[tuple[str, Callable[[dict[str, Any]], bool]]] = [
        (f"variant {v}", lambda a, v=v: a["variant"] == v) for v in VARIANTS]
    out += [("B > 1", lambda a: a["B"] > 1), ("H > 1", lambda a: a["H"] > 1),
            ("more than one chunk of 64", lambda a: a["variant"] == "causal" and a["N_q"] > 64),
            ("more than one chunk of its chunk size", lambda a: a["chunk"] > 0 and a["N_q"] > a["chunk"])]
    for x in ("K", "d_r", "d_v"):
        for t in _ATTRIBUTE_TILES:
            out.append((f"{x} > {t}", lambda a, x=x, t=t: a[x] > t))
            out.append((f"{x} > {t} with {x} mod {t} ≠ 0", lambda a, x=x, t=t: a[x] > t and a[x] % t != 0))
            out.append((f"{x} > {t} with {x} mod {t} > 1", lambda a, x=x, t=t: a[x] > t and a[x] % t > 1))
            rems = {a[x] % t for a in failing}
            if len(rems) == 1 and all(a[x] > t for a in failing):
                r = rems.pop()
                out.append((f"{x} > {t} with {x} mod {t} = {r}", lambda a, x=x, t=t, r=r: a[x] > t and a[x] % t == r))
        out.append((f"{x} = 1", lambda a, x=x: a[x] == 1))
    for t in _ATTRIBUTE_TILES:
        out.append((f"N > {t}", lambda a, t=t: max(a["N_q"], a["N_k"]) > t))
    out.append(("N = 1", lambda a: min(a["N_q"], a["N_k"]) == 1))
    out += [(f"regime {r}", lambda a, r=r: a["regime"] == r) for r in REGIMES]
    out += [(f"dtype {d}", lambda a, d=d: a["dtype"] == d) for d in _DTYPES.values()]
    out.append(("N_q ≠ N_k", lambda a: a["N_q"] != a["N_k"]))
    return out


def separating_conjunction(failing: Sequence[str], passing: Sequence[str],
                           max_terms: int = MAX_CONJUNCTION) -> list[str] | None:
    """The smallest conjunction of case attributes that holds for every case id in ``failing`` and for none in
    ``passing`` (ids that are not a case's are left out); ``None`` when none of up to ``max_terms`` attributes
    does, or when there is no case on either side. Of equally small ones, the first in :func:`_atoms`'s order."""
    import itertools

    fail = [a for a in map(case_attributes, failing) if a is not None]
    ok = [a for a in map(case_attributes, passing) if a is not None]
    if not fail or not ok:
        return None
    everyone = fail + ok
    full = (1 << len(fail)) - 1
    masks: dict[int, str] = {}
    for text, pred in _atoms(fail):
        mask = sum(1 << i for i, a in enumerate(everyone) if pred(a))
        if mask & full == full and mask not in masks:  # true of every failing case; first text of a mask kept
            masks[mask] = text
    items = list(masks.items())
    for size in range(1, max_terms + 1):
        for combo in itertools.combinations(items, size):
            mask = -1
            for m, _ in combo:
                mask &= m
            if mask >> len(fail) == 0:
                return [text for _, text in combo]
    return None


def _conjunction_line(f: _Facts) -> str | None:
    """The separating conjunction of the failing cases, in words, with the counts (``None``: there is none)."""
    failing = [c for c in f.failed if case_attributes(c) is not None]
    passing = [c for c in f.passed if case_attributes(c) is not None]
    terms = separating_conjunction(failing, passing)
    if terms is None:
        return None
    counts = f"({len(failing)} of {len(failing)} failing, 0 of {len(passing)} passing)"
    lost = [r for r in f.failures if r.check == "call" and r.metric in _CALL_LOST]
    if lost:
        kinds = "/".join(sorted({r.metric for r in lost}))
        return (f"every failing case has {' and '.join(terms)} {counts}; {len({r.case_id for r in lost})} of them "
                f"returned no result ({kinds}): nothing is known of the arithmetic there")
    said = f"every failing case has {' and '.join(terms)} {counts}"
    variant = terms[0].removeprefix("variant ") if len(terms) == 1 and terms[0].startswith("variant ") else None
    return said + (f": {_VARIANT_CAUSES[variant]}" if variant in _VARIANT_CAUSES else "")


def requested_but_skipped(report: ReportLike) -> list[str]:
    """One line for each thing the run was asked to check and did not (gradients said in full)."""
    out = []
    for s in report.skipped:
        if not s.requested:
            continue
        if s.what == "gradients":
            out.append(f"gradients were requested (--grad / grad=True) but NOT checked: {s.reason}. Declare "
                       "grad=True, with a VJP: impl.gma_vjp or check(vjp=...) for NumPy; namespace='torch' or "
                       "'jax' gives one by autograd")
        else:
            out.append(f"requested but not checked: {s.what} ({s.reason})")
    return out
