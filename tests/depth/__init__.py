"""Tests of gma_ref.depth: the rank-collapse diagnostic of a stack."""
