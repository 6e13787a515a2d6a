"""Modules the tests import: helpers, known-good and planted implementations, exact arithmetic."""
