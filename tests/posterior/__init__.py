"""Tests of gma_ref.posterior: the scores and responsibilities (Eqs. 2, 3, 16, 18, 50, 51), Theorem 1."""
