"""Tests of gma_ref.bench."""
