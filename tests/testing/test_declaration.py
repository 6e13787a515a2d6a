"""Declarations (gma_ref.testing.declaration): validated constraints; a constrained kernel passes by declaring them."""

from __future__ import annotations

import pytest

from gma_ref.testing import CaseSet, Declaration, check


def test_declaration_validates_constraints():
    """Bad constraint values raise ValueError naming the field; defaults mean 'any value'."""
    d = Declaration()
    assert (d.eps, d.eps_sigma, d.n_multiple, d.n_max, d.k_multiple, d.k_max, d.d_multiple, d.d_max) == (
        None, None, 1, None, 1, None, 1, None) and not d.constrained
    for bad in ({"eps": 0.0}, {"eps": float("nan")}, {"eps_sigma": -1.0}, {"n_multiple": 0}, {"k_max": 0},
                {"d_multiple": 2.5}, {"n_multiple": 64, "n_max": 32}, {"dtypes": ("float8",)},
                {"variants": ("sideways",)}, {"devices": ("tpu",)}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            Declaration(**bad)
    assert Declaration(eps=1e-10, n_multiple=64).constrained


def test_constrained_kernel_passes_through_its_declaration_alone():
    """A kernel with a fixed eps and shape multiples fails every case undeclared and passes once it declares them."""
    from ..support.planted_impls import ConstrainedKernel, constrained_kernel

    undeclared = check(ConstrainedKernel("float32"), grad=True, cases=CaseSet(tiling=False))
    assert not undeclared.passed and all(r.metric == "raised" for r in undeclared.failures)
    report = check(constrained_kernel(), grad=True, cases=CaseSet(tiling=False))
    assert report.passed, report.format()
    assert {c.split("-")[0] for c in report.case_ids} == {"bidirectional", "causal", "cross"}
    assert any("tiny_eps" in c for c in report.case_ids) and any("far" in c for c in report.case_ids)
    unrealised = [s.reason for s in report.skipped if "not realisable" in s.reason]
    assert any("K = 1" in r for r in unrealised) and any("N = 1" in r for r in unrealised)
