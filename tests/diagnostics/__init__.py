"""Tests of gma_ref.diagnostics (§5.4, App. F.3)."""
