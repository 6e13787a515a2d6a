"""Tests of gma_ref.scores_fast: the expanded scores, their rounding-error guard and token blocks."""
