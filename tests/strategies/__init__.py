"""Tests of gma_ref.strategies: hypothesis strategies for GMA inputs."""
