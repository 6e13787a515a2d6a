"""Tail sizes and interaction rows (gma_ref.testing.cases.tails): every tail kind for every tile, three-way rows."""

from __future__ import annotations

import pytest

from gma_ref.testing.cases.sets import default_cases, interaction_cases
from gma_ref.testing.cases.tails import (
    AXIS_TILES,
    REMAINDER_CLASSES,
    TAIL_SIZES,
    interaction_rows,
    missing_tails,
    remainder_class,
    tail_coverage,
)
from gma_ref.testing.names import VARIANTS


def test_remainder_classes_of_known_sizes():
    """40 after 16 leaves half a tile, 63 leaves t - 1, 130 leaves 2 for every tile, a size below the tile none."""
    assert remainder_class(40, 16) == "half"
    assert remainder_class(63, 16) == remainder_class(63, 32) == "t-1"
    assert {remainder_class(130, t) for t in (8, 16, 32, 64, 128)} == {"2"}
    assert remainder_class(128, 128) == "0" and remainder_class(64, 128) is None
    assert remainder_class(19, 16) is None  # a tail of 3 of 16 is in no class


def test_remainder_class_refuses_a_tiny_tile_or_size():
    """Tiles below 4 (their classes overlap) and sizes below 1 are refused by name."""
    with pytest.raises(ValueError, match="tile must be >= 4"):
        remainder_class(10, 3)
    with pytest.raises(ValueError, match="n must be >= 1"):
        remainder_class(0, 16)


@pytest.mark.parametrize("axis", sorted(TAIL_SIZES))
def test_every_axis_leaves_every_tail_after_every_tile(axis):
    """TAIL_SIZES reach remainders 0, 1, 2, about half and t - 1 modulo every tile of their axis."""
    assert missing_tails(TAIL_SIZES[axis], AXIS_TILES[axis]) == []
    assert len(tail_coverage(TAIL_SIZES[axis], AXIS_TILES[axis])) == len(AXIS_TILES[axis]) * len(REMAINDER_CLASSES)


def test_missing_tails_names_what_tails_of_one_are_missing():
    """Sizes that straddle tiles by one (17, 33, 65, 129) miss every tail class but 1."""
    missing = missing_tails((17, 33, 65, 129), (16, 32, 64, 128))
    assert (16, "2") in missing and (64, "half") in missing and (128, "t-1") in missing
    assert not any(cls == "1" for _, cls in missing)


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_variant_runs_every_width_tail(variant):
    """Each variant's rows take every tail size of d_r, d_v and K."""
    rows = interaction_rows(variant)
    for axis in ("d_r", "d_v", "n_components"):
        assert set(TAIL_SIZES[axis]) <= {r[axis] for r in rows}, axis


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_variant_meets_batch_head_and_three_chunks_at_once(variant):
    """Every variant has rows with B > 1, H > 1 and N ≥ 129 (three chunks of 64) at once; cross has N_q ≠ N_k."""
    rows = [r for r in interaction_rows(variant) if r["batch"] > 1 and r["heads"] > 1 and r["n_k"] > 128]
    assert len(rows) >= 3
    if variant == "cross":
        assert all(r["n_q"] != r["n_k"] for r in interaction_rows(variant))


def test_causal_rows_reach_every_token_tail_and_a_fourth_chunk():
    """The causal rows take every token count of TAIL_SIZES['n'], some past 192 (a fourth chunk of 64)."""
    rows = interaction_rows("causal")
    assert set(TAIL_SIZES["n"]) <= {r["n_q"] for r in rows}
    assert any(r["n_q"] > 192 and r["batch"] > 1 and r["heads"] > 1 for r in rows)


def test_interaction_rows_refuse_an_unknown_variant():
    with pytest.raises(ValueError, match="variant must be one of"):
        interaction_rows("sideways")


def test_interaction_cases_are_in_the_default_set_and_unique():
    """The interaction cases follow the tiling cases in the default set; every case id is unique."""
    cases = default_cases(tiling=True)
    ids = [c.case_id for c in cases]
    assert len(ids) == len(set(ids))
    assert {c.case_id for c in interaction_cases()} <= set(ids)
    assert not {c.case_id for c in interaction_cases()} & {c.case_id for c in default_cases(tiling=False)}


def test_the_smallest_tile_and_size_are_accepted():
    """A tile of 4 and a size of 1 are the smallest allowed (below them: ValueError)."""
    assert remainder_class(1, 4) is None  # no full tile yet
    assert remainder_class(4, 4) == "0" and remainder_class(7, 4) == "t-1"


def test_about_half_is_three_to_five_eighths_of_the_tile():
    """With tiles of 16, remainders 6 to 10 are about half; 5 and 11, just outside 3t/8 .. 5t/8, are no class."""
    assert [remainder_class(16 + r, 16) for r in (5, 6, 10, 11)] == [None, "half", "half", None]


def test_the_rows_are_those_the_shipped_detection_power_was_measured_on():
    """The interaction rows are part of the default set whose detection power ships: a row changed (a size, an ε,
    B or H) is a default set the fault model was not run on, until tools/fault_power.py measures it again."""
    from gma_ref.testing.cases import power

    assert power.measured_power()["case_set"] == power.default_set_fingerprint()
