"""Framework adapters (gma_ref.testing.calling.adapters): torch_autograd and jax_vjp give every gradient."""

from __future__ import annotations

import pytest

from gma_ref.testing import Case, Declaration, check, default_cases, torch_autograd
from gma_ref.testing.cases.sets import case_arrays

from ...support.planted_impls import make_torch_impl


def test_torch_autograd_adapter_returns_every_gradient():
    """torch_autograd returns d_q ... d_prior_logits with the input shapes."""
    torch = pytest.importorskip("torch")
    impl = make_torch_impl()
    a = case_arrays(Case("causal", 1, 2, 5, 5, 3, 2, 4))
    t = {n: torch.from_numpy(x).float() for n, x in a.items()}
    g = torch_autograd(impl)(t["q"], t["k"], t["v"], t["means"], t["omega"], t["prior_logits"], t["d_out"],
                             causal=True, eps=1e-6, eps_sigma=1e-4)
    assert {n: tuple(x.shape) for n, x in g.items()} == {"d_" + n: tuple(t[n].shape) for n in
                                                       ("q", "k", "v", "means", "omega", "prior_logits")}


def test_jax_adapter():
    """A JAX implementation checked through jax_vjp (skipped when JAX is absent)."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    def jax_gma(q, k, v, means, omega, prior_logits, *, causal, eps, eps_sigma):
        var = jax.nn.softplus(omega) + eps_sigma
        lp = jax.nn.log_softmax(prior_logits, axis=-1)

        def gamma(x):
            d = x[..., :, None, :] - means[..., None, :, :]
            maha = (d * d / var[..., None, :, :]).sum(-1)
            s = lp[..., None, :] - 0.5 * jnp.log(var).sum(-1)[..., None, :] - 0.5 * maha
            return jax.nn.softmax(s, axis=-1)

        gq, gk = gamma(q), gamma(k)
        a = gq @ jnp.swapaxes(gk, -1, -2)
        if causal:
            a = jnp.tril(a)
        return (a @ v) / (a.sum(-1) + eps)[..., None]

    jax_gma.gma_declaration = Declaration(namespace="jax", grad=True)
    cases = [c for c in default_cases(("causal",)) if "tiny_grad" in c.case_id or c.case_id.endswith("-s0")]
    report = check(jax_gma, cases=cases)
    assert report.passed, report.format()
