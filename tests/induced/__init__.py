"""Tests of gma_ref.induced: the materialized induced weights and their guarded divisions."""
