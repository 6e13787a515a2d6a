"""Tests of gma_ref.mixture: the variances and priors from their parameters (Eqs. 14, 15, 55)."""
