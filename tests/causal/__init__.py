"""Tests of gma_ref.causal: the causal forms, their state and their checks."""
