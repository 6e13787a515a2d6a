"""Tests of gma_ref.fast.matmul_scores: the expanded scores, their rounding-error guard and token blocks."""
