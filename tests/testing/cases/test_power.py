"""Detection power on the summary line (gma_ref.testing.cases.power): the measured figure only for the measured set."""

from __future__ import annotations

import pytest

from gma_ref.testing import check, default_cases
from gma_ref.testing.calibration.emulated import NumpyKernel
from gma_ref.testing.cases import power

MEASURED = {"faults": 120, "float32": {"killed": 119}, "float64": {"killed": 120}}


@pytest.fixture
def measured(monkeypatch):
    """The shipped figure replaced by MEASURED, measured on the current default set."""
    data = dict(MEASURED, case_set=power.default_set_fingerprint())
    monkeypatch.setattr(power, "measured_power", lambda: data)
    return data


def _default(dtype):
    return default_cases(dtype=dtype, tiling=True)


def test_the_fingerprint_is_the_set_not_the_order():
    """The same cases in another order give the same fingerprint; one case more gives another."""
    cases = _default("float32")
    assert power.case_set_fingerprint(cases) == power.case_set_fingerprint(cases[::-1])
    assert power.case_set_fingerprint(cases) != power.case_set_fingerprint(cases + cases[:1])


@pytest.mark.parametrize("field", ["eps", "eps_sigma", "chunk_size", "seed", "n_components", "regime"])
def test_the_fingerprint_holds_every_field_of_a_case(field):
    """One field of one case changed (an ε not in the case id, a size, the regime) gives another fingerprint, and
    the summary line then says the set was not measured."""
    import dataclasses

    cases = _default("float32")
    i = next(i for i, c in enumerate(cases) if c.variant == "causal" and c.n_q > 100)
    value = {"eps": 2e-6, "eps_sigma": 0.05, "chunk_size": 32, "seed": 99, "n_components": 3, "regime": "far"}[field]
    changed = [*cases[:i], dataclasses.replace(cases[i], **{field: value}), *cases[i + 1:]]
    assert power.case_set_fingerprint(changed) != power.case_set_fingerprint(cases)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(power, "measured_power", lambda: dict(MEASURED, case_set=power.default_set_fingerprint()))
        assert power.detection_text(changed, "float32").startswith("detection power not measured for this case set")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_default_set_gets_its_measured_figure(measured, dtype):
    """The default set of a measured dtype: 'detection power killed/faults faults of the fault model'."""
    killed = measured[dtype]["killed"]
    assert power.detection_text(_default(dtype), dtype) == f"detection power {killed}/120 faults of the fault model"


def test_another_case_set_is_not_given_the_default_sets_figure(measured):
    """A narrowed set (one variant) is said not to be measured, with the default set's figure beside it."""
    text = power.detection_text(default_cases(("causal",), dtype="float32", tiling=True), "float32")
    assert text.startswith("detection power not measured for this case set") and "119/120" in text


def test_a_dtype_outside_the_measured_ones_is_named(measured):
    assert power.detection_text(_default("float16"), "float16") == (
        "detection power not measured in float16 (only float32 and float64)")


def test_a_figure_of_another_case_set_is_not_printed(monkeypatch):
    """A figure whose fingerprint is not the current default set's is not printed as the current one."""
    monkeypatch.setattr(power, "measured_power", lambda: dict(MEASURED, case_set="0" * 64))
    assert power.detection_text(_default("float32"), "float32") == (
        "detection power not measured for the current default case set")


def test_no_shipped_figure_prints_nothing(monkeypatch):
    monkeypatch.setattr(power, "measured_power", lambda: None)
    assert power.detection_text(_default("float32"), "float32") == ""


def test_the_shipped_file_is_readable_and_counts_every_measured_dtype():
    """detection_power.json ships with the package: the number of faults and a count per measured dtype."""
    data = power.measured_power()
    assert data is not None and data["faults"] >= 60 and len(data["case_set"]) == 64
    assert all(0 <= data[d]["killed"] <= data["faults"] for d in power.MEASURED_DTYPES)


def test_the_summary_line_and_the_json_carry_it(measured):
    """A default float64 check prints the figure on its summary line and records it in the JSON report."""
    import json

    report = check(NumpyKernel("float64"), dtype="float64", grad=False, contract=False)
    assert report.format().splitlines()[-1].endswith("; detection power 120/120 faults of the fault model")
    assert json.loads(report.to_json())["detection"] == "detection power 120/120 faults of the fault model"
    narrowed = check(NumpyKernel("float64"), dtype="float64", grad=False, contract=False,
                       cases=default_cases(("cross",), dtype="float64"))
    assert "detection power not measured for this case set" in narrowed.format().splitlines()[-1]


def test_the_default_fingerprint_is_that_of_both_measured_dtypes_default_sets():
    """default_set_fingerprint is the fingerprint of the float32 and float64 default sets with the tiling and
    interaction cases (not the set without them), and the shipped figure was measured on it."""
    cases = _default("float32") + _default("float64")
    assert power.default_set_fingerprint() == power.case_set_fingerprint(cases)
    narrow = [c for d in ("float32", "float64") for c in default_cases(dtype=d)]
    assert power.default_set_fingerprint() != power.case_set_fingerprint(narrow)
    assert power.measured_power()["case_set"] == power.default_set_fingerprint()


@pytest.mark.parametrize("text", ['{"case_set": "x"}', "[1, 2]", "not json"])
def test_a_file_without_the_counts_is_no_figure(tmp_path, monkeypatch, text):
    """A detection file that is not an object with 'faults' (or not JSON at all) reads as no figure."""
    (tmp_path / power.DETECTION_FILE).write_text(text, encoding="utf-8")
    monkeypatch.setattr(power.resources, "files", lambda package: tmp_path)
    assert power.measured_power.__wrapped__() is None


def test_a_measured_dtype_missing_from_the_file_is_named(monkeypatch):
    """A figure without float64's count says float64 was not measured."""
    data = {"faults": 120, "float32": {"killed": 119}, "case_set": power.default_set_fingerprint()}
    monkeypatch.setattr(power, "measured_power", lambda: data)
    assert power.detection_text(_default("float64"), "float64").startswith("detection power not measured in")
