"""Tests of gma_ref.extensions (§6)."""
