"""Tests of gma_ref.costs (Eq. 12, §3.4, App. B)."""
