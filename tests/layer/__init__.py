"""Tests of gma_ref.layer: the multi-head GMA layer and its gates."""
