"""Tests of gma_ref.geometry: the convex-hull identity and the affine rank."""
