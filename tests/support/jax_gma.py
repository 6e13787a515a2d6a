"""An independent JAX GMA for the oracle's JAX tests, written from the paper and not through gma-ref's code.

Bidirectional, causal and cross attention in one function; gradients come from ``jax.vjp`` (the oracle's
:func:`~gma_ref.testing.jax_vjp`). :func:`make_jax_gma` returns the kernel ``jax.jit``-compiled with the
options static, declared as docs/oracle/calling-convention.md shows; ``bug="strict_causal"`` plants a strict causal mask
(token i does not read itself), which the oracle must flag.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from gma_ref.testing import Declaration


def _posterior(x: Any, means: Any, var: Any, log_prior: Any) -> Any:
    """Γ: the posterior over the K components of every row of ``x`` (diagonal Gaussians)."""
    import jax
    import jax.numpy as jnp

    diff = x[..., :, None, :] - means[..., None, :, :]
    maha = jnp.sum(diff * diff / var[..., None, :, :], axis=-1)
    log_det = jnp.sum(jnp.log(var), axis=-1)
    return jax.nn.softmax(log_prior[..., None, :] - 0.5 * log_det[..., None, :] - 0.5 * maha, axis=-1)


def _gma(q: Any, k: Any, v: Any, means: Any, omega: Any, prior_logits: Any, *, causal: bool, eps: float,
         eps_sigma: float, strict: bool = False) -> Any:
    """o_i = Σ_j a_ij v_j / (Σ_j a_ij + ε), a = Γ^Q Γ^Kᵀ (lower-triangular when causal)."""
    import jax
    import jax.numpy as jnp

    var = jax.nn.softplus(omega) + eps_sigma
    log_prior = jax.nn.log_softmax(prior_logits, axis=-1)
    a = _posterior(q, means, var, log_prior) @ jnp.swapaxes(_posterior(k, means, var, log_prior), -1, -2)
    if causal:
        a = jnp.tril(a, k=-1 if strict else 0)
    return (a @ v) / (jnp.sum(a, axis=-1, keepdims=True) + eps)


def make_jax_gma(dtypes: tuple[str, ...] = ("float32", "float64"), bug: str | None = None, jit: bool = True) -> Any:
    """The JAX kernel with its declaration (``namespace='jax'``, gradients by ``jax.vjp``)."""
    import jax

    if bug not in (None, "strict_causal"):
        raise ValueError(f"bug must be None or 'strict_causal', got {bug!r}")
    body = partial(_gma, strict=bug == "strict_causal")
    compiled = jax.jit(body, static_argnames=("causal", "eps", "eps_sigma")) if jit else body

    def jax_gma(q: Any, k: Any, v: Any, means: Any, omega: Any, prior_logits: Any, *, causal: bool, eps: float,
                eps_sigma: float) -> Any:
        return compiled(q, k, v, means, omega, prior_logits, causal=causal, eps=eps, eps_sigma=eps_sigma)

    jax_gma.gma_declaration = Declaration(namespace="jax", dtypes=dtypes, grad=True)
    return jax_gma
