"""Tests of gma_ref.verification: the equation registry and its checks."""
