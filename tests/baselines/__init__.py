"""Tests of gma_ref.baselines: softmax, linear and gated linear attention."""
