"""Tests of the project as a whole: docs, README, site, examples, figures, errata, public API."""
