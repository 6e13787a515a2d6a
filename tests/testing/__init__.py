"""Tests of the oracle, gma_ref.testing: one file per oracle module, and the oracle as a whole."""
