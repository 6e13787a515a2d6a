"""Tests of gma_ref.attention: the pipeline entry point, its guard and its residuals."""
