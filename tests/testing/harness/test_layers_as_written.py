"""Layers as they are written: tied head width, long layer runs refused with a reason, declared reasons shown."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gma_ref.testing import CaseSet, Declaration, check, default_layer_cases
from gma_ref.testing.calibration.emulated import NumpyKernel
from gma_ref.testing.calibration.emulated_layer import NumpyLayer
from gma_ref.testing.cases.sets import tie_head_width


class TiedLayer(NumpyLayer):
    """A correct layer that, like most multi-head layers, only exists with d_r = d_v = d_model / H."""

    def __call__(self, x, y, w_q, w_k, w_v, w_o, means, omega, prior_logits, **kw):
        heads, d_model, d_r = w_q.shape
        d_v = w_v.shape[-1]
        if not (d_r == d_v and heads * d_r == d_model):
            raise ValueError(f"head width must be d_model / H = {d_model}/{heads}, got d_r={d_r}, d_v={d_v}")
        return super().__call__(x, y, w_q, w_k, w_v, w_o, means, omega, prior_logits, **kw)


def test_tie_head_width_maps_every_layer_case():
    """Each default layer case becomes d_r = d_v = d_model / H with its heads, tokens and regime kept."""
    for case in default_layer_cases():
        tied, _ = tie_head_width(case)
        assert tied.d_r == tied.d_v and tied.heads * tied.d_r == tied.d_model
        assert (tied.heads, tied.n_q, tied.n_k, tied.regime) == (case.heads, case.n_q, case.n_k, case.regime)
    tied, _ = tie_head_width(default_layer_cases()[0], d_multiple=8)
    assert tied.d_r % 8 == 0


def test_tied_head_width_declaration_makes_only_admissible_layer_cases():
    """Undeclared, a tied-width layer fails most default layer cases for a shape reason; with
    Declaration(tied_head_width=True) every case is admissible and it passes, the lost edge (d_r != d_v) listed."""
    layer = TiedLayer("float32")
    undeclared = check(layer, cases=CaseSet(tiling=False))
    assert not undeclared.passed and len(undeclared.failed_cases()) >= 12
    layer.gma_declaration = replace(layer.gma_declaration, tied_head_width=True)
    report = check(layer, grad=True, cases=CaseSet(tiling=False))
    assert report.passed, report.format()
    assert any("d_r != d_v" in s.reason for s in report.skipped)


def test_long_layer_run_is_refused_with_a_reason():
    """--mode layer --long said 'FAIL: 0/0 cases passed' and nothing else; now the requested skip says why."""
    report = check(NumpyLayer("float32"), cases=CaseSet(scale="long"))
    assert not report.passed and report.exit_code == 1
    assert any(s.what == "long cases" and s.requested and "attention mode only" in s.reason for s in report.skipped)
    assert "nothing was checked (long cases: long-sequence cases exist for attention mode only" in report.format()


def test_declared_reason_for_an_unsupported_variant_is_printed():
    """Declaration(extra={'unsupported': {variant: why}}): the reason appears in the skip line of the report."""
    kernel = NumpyKernel("float32")
    kernel.gma_declaration = Declaration(variants=("bidirectional",), extra={"unsupported": {
        "causal": "no mask in this kernel", "grad": "forward only"}})
    report = check(kernel, variants=("bidirectional", "causal"), grad=True, cases=CaseSet(tiling=False))
    text = report.format()
    assert "skip variant causal: not declared: no mask in this kernel  [requested]" in text
    assert "not declared (grad=False): forward only" in text


@pytest.mark.parametrize("flag", ["--tied-head-width"])
def test_cli_tied_head_width_flag(flag, capsys):
    """The CLI's --tied-head-width sets the declaration (a correct layer still passes)."""
    from gma_ref.cli.check import main

    assert main(["gma_ref.testing.calibration.emulated_layer:NumpyLayer", flag, "--no-repro", "--quiet"]) == 0
    assert "d_r != d_v" in capsys.readouterr().out


def test_an_nn_module_checked_through_functional_call():
    """The guide's nn.Module recipe: a multi-head module with nn.Linear projections (tied head width) and a fixed ε,
    built per shape, its parameters replaced by the harness's inputs with torch.func.functional_call, passes
    forward and gradients;
    the undeclared cross variant is skipped with the module's reason."""
    torch = pytest.importorskip("torch")
    from torch.func import functional_call

    from ...support.planted_impls import torch_gma

    class GMAMultiHead(torch.nn.Module):
        def __init__(self, d_model=12, heads=3, components=4, eps=1e-6, eps_sigma=1e-4):
            super().__init__()
            d = d_model // heads
            self.heads, self.eps, self.eps_sigma = heads, eps, eps_sigma
            self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
                torch.nn.Linear(d_model, d_model, bias=False) for _ in range(4))
            self.means = torch.nn.Parameter(torch.randn(heads, components, d))
            self.omega = torch.nn.Parameter(torch.zeros(heads, components, d))
            self.prior_logits = torch.nn.Parameter(torch.zeros(heads, components))

        def forward(self, x, causal=False):
            b, n, _ = x.shape

            def split(t):
                return t.view(b, n, self.heads, -1).transpose(1, 2)

            o = torch_gma(split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x)), self.means,
                          self.omega, self.prior_logits, causal=causal, eps=self.eps, eps_sigma=self.eps_sigma)
            return self.out_proj(o.transpose(1, 2).reshape(b, n, -1))

    modules = {}  # one module per shape the harness asks for; functional_call replaces its parameters

    def layer(x, y, w_q, w_k, w_v, w_o, means, omega, prior_logits, *, causal, eps, eps_sigma):
        h, d_model, d = w_q.shape
        shape = (d_model, h, means.shape[-2])
        module = modules.setdefault(shape, GMAMultiHead(*shape).to(x.dtype))

        def linear(w):  # (H, d_model, d) -> nn.Linear's (H·d, d_model), head-major
            return w.permute(0, 2, 1).reshape(h * d, d_model)

        params = {"q_proj.weight": linear(w_q), "k_proj.weight": linear(w_k), "v_proj.weight": linear(w_v),
                  "out_proj.weight": w_o.T, "means": means, "omega": omega, "prior_logits": prior_logits}
        return functional_call(module, params, (x,), {"causal": causal})

    layer.gma_declaration = Declaration(
        mode="layer", namespace="torch", grad=True, variants=("bidirectional", "causal"), tied_head_width=True,
        eps=1e-6, eps_sigma=1e-4, extra={"unsupported": {"cross": "self-attention only"}})
    report = check(layer, cases=CaseSet(tiling=False))
    assert report.passed, report.format()
    assert "skip variant cross: not declared: self-attention only" in report.format()


@pytest.mark.parametrize("causal", [False, True])
def test_feature_axis_padding_recipe_is_exact(causal):
    """The guide's feature-axis padding: zero columns of q, k and the means with one constant ω for every component
    (each padded feature adds the same −½ log σ² to every component's score, which the softmax cancels), and zero
    columns of v (zero output columns): output and the real slices of every gradient equal the unpadded ones."""
    import numpy as np

    from gma_ref import gma_attention, gma_attention_backward

    rng = np.random.default_rng(3)
    b, h, n, kk, d_r, d_v, pad_r, pad_v = 2, 3, 11, 4, 5, 6, 3, 2
    q, k = rng.normal(size=(b, h, n, d_r)), rng.normal(size=(b, h, n, d_r))
    v, d_out = rng.normal(size=(b, h, n, d_v)), rng.normal(size=(b, h, n, d_v))
    means, omega, alpha = rng.normal(size=(h, kk, d_r)), rng.normal(size=(h, kk, d_r)), rng.normal(size=(h, kk))

    def pad(a, width, value=0.0):
        return np.concatenate([a, np.full(a.shape[:-1] + (width,), value)], axis=-1)

    padded = (pad(q, pad_r), pad(k, pad_r), pad(v, pad_v), pad(means, pad_r), pad(omega, pad_r, 0.7), alpha)
    out = gma_attention(q, k, v, means, omega, alpha, causal=causal)
    out_p = gma_attention(*padded, causal=causal)
    np.testing.assert_allclose(out_p[..., :d_v], out, rtol=1e-13, atol=1e-15)
    assert np.all(out_p[..., d_v:] == 0)
    grads = gma_attention_backward(q, k, v, means, omega, alpha, d_out, causal=causal)
    grads_p = gma_attention_backward(*padded, pad(d_out, pad_v), causal=causal)
    for name, g, gp in zip(grads._fields, grads, grads_p, strict=True):
        np.testing.assert_allclose(gp[..., : g.shape[-1]], g, rtol=1e-11, atol=1e-14, err_msg=name)
