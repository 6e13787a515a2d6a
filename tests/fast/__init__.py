"""Tests of gma_ref.fast: its agreement with the reader's pipeline (test_agreement.py), the entry, the scores by
matrix products and their rounding guard, the token blocks and threads, the fused latent core, the batched causal
core and the saved-array prechecks."""
