"""Tests of the symbolic derivations in derivations/."""
