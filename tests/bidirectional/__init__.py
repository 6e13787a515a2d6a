"""Tests of gma_ref.bidirectional: bidirectional and cross GMA, the read and write steps."""
