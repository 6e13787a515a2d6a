"""Check flash-linear-attention's normalised linear attention as a causal GMA, through declarations alone.
=======================================================================================================

Causal GMA with responsibilities as features *is* normalised linear attention::

    O_i = Σ_k γ^Q_ik Ṽ^(i)_k / (Σ_k γ^Q_ik Z^(i)_k + ε)  =  q_i·S_i / (q_i·z_i + ε)

with q := Γ^Q, k := Γ^K, v := V, scale 1 and ``normalize=True``. The adapter below
(:func:`make_fla_gma`) computes Γ^Q and Γ^K in float32 with PyTorch, hands them to an
fla kernel in the dtype under test (layout ``[B, T, H, K]``), and returns its output; gradients
come from autograd through both. fla fixes ε = 1e-10 and its chunk reference works on whole
chunks of 64 tokens, so the kernels are declared with ``eps=1e-10`` and (for that reference)
``n_multiple=64``: the harness generates every case to satisfy them (no padding, no ε trick).

Kernels checked:

* CPU (no Triton needed): fla's pure-PyTorch references ``naive_recurrent_linear_attn``
  (token by token, state in float32) and ``naive_chunk_linear_attn`` (chunks of 64, matmuls and
  prefix sums in the input dtype). ``fla.ops`` imports Triton when imported, so this script loads
  ``fla/ops/linear_attn/naive.py`` by its file path with ``importlib`` (that file needs only torch
  and einops) instead of importing the package.
* CUDA (needs Triton and a GPU): ``chunk_linear_attn``, ``fused_chunk_linear_attn`` and
  ``fused_recurrent_linear_attn`` from ``fla.ops.linear_attn``, against the CuPy reference.

Install: ``pip install -e ".[test,fla]"`` (fla-core, einops, the CPU torch); for the GPU path a
CUDA build of torch, Triton and ``cupy-cuda12x``. Run from the repository root::

    python examples/check_fla.py                     # CPU, float32 and bfloat16, short cases + gradients
    python examples/check_fla.py --long              # also the long cases (N up to 131072), forward
    python examples/check_fla.py --device cuda --long --n-max 1048576

Each kernel is also a command-line target (from the repository root), which is how the
reproducers of failing cases name it::

    gma-ref check examples.check_fla:naive_chunk --dtype bfloat16

Without fla (or, for ``--device cuda``, without CUDA/Triton/CuPy) it prints why and exits 0.
Exit status 1 if any check failed.
"""

# sphinx_gallery_thumbnail_path = '_figures/gallery_check_fla.png'

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
import time
from typing import Any

from gma_ref.testing import CaseSet, Declaration, check

FLA_EPS = 1e-10  # fla's fixed denominator stabiliser
FLA_CHUNK = 64  # the chunk length of fla's naive chunk reference
CPU_KERNELS = ("naive_recurrent", "naive_chunk")
GPU_KERNELS = ("chunk", "fused_chunk", "fused_recurrent")


def load_naive() -> Any:
    """fla's ``ops/linear_attn/naive.py`` as a module, loaded by path (``fla.ops`` itself imports Triton).

    Raises ``ImportError`` naming what is missing.
    """
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("flash-linear-attention (package fla, from fla-core) is not installed")
    path = os.path.join(list(spec.submodule_search_locations)[0], "ops", "linear_attn", "naive.py")
    if not os.path.exists(path):
        raise ImportError(f"this fla has no {path}")
    mod_spec = importlib.util.spec_from_file_location("fla_linear_attn_naive", path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)  # imports torch and einops only
    return module


def load_kernel(name: str) -> Any:
    """The fla function for ``name`` (one of :data:`CPU_KERNELS` or :data:`GPU_KERNELS`)."""
    if name in CPU_KERNELS:
        naive = load_naive()
        fn = naive.naive_recurrent_linear_attn if name == "naive_recurrent" else naive.naive_chunk_linear_attn

        def run(q: Any, k: Any, v: Any) -> Any:
            out = fn(q, k, v, scale=1.0, normalize=True)
            return out[0] if isinstance(out, tuple) else out

        return run
    from fla.ops.linear_attn import chunk_linear_attn, fused_chunk_linear_attn, fused_recurrent_linear_attn

    fn = {"chunk": chunk_linear_attn, "fused_chunk": fused_chunk_linear_attn,
          "fused_recurrent": fused_recurrent_linear_attn}[name]
    return lambda q, k, v: fn(q, k, v, scale=1.0, normalize=True)[0]


def responsibilities_torch(x: Any, means: Any, omega: Any, prior_logits: Any, eps_sigma: float) -> Any:
    """Γ ``(B, H, N, K)`` in float32 (direct (x − μ)²/σ², in token blocks), differentiable."""
    import torch

    xf, mu, om, al = (t.float() for t in (x, means, omega, prior_logits))
    var = torch.nn.functional.softplus(om) + eps_sigma
    const = torch.log_softmax(al, -1) - 0.5 * torch.log(var).sum(-1) - 0.5 * x.shape[-1] * math.log(2 * math.pi)
    step = max(1, (1 << 22) // max(1, x.shape[0] * x.shape[1] * mu.shape[-2] * mu.shape[-1]))
    blocks = []
    for s in range(0, x.shape[-2], step):
        diff = xf[..., s:s + step, :].unsqueeze(-2) - mu.unsqueeze(-3)
        blocks.append(torch.softmax(const.unsqueeze(-2) - 0.5 * (diff * diff / var.unsqueeze(-3)).sum(-1), -1))
    return torch.cat(blocks, dim=-2)


def make_fla_gma(name: str, device: str = "cpu") -> Any:
    """Causal GMA by the fla kernel ``name``, with its :class:`Declaration` (ε = 1e-10; N % 64 for naive_chunk)."""
    kernel = load_kernel(name)

    def fla_gma(q, k, v, means, omega, prior_logits, *, causal, eps, eps_sigma):
        if not causal or eps != FLA_EPS:  # the declaration rules both out; a guard, not a trick
            raise ValueError(f"fla computes causal GMA with eps = {FLA_EPS}, got causal={causal}, eps={eps}")
        dt = q.dtype
        gq = responsibilities_torch(q, means, omega, prior_logits, eps_sigma).to(dt)
        gk = responsibilities_torch(k, means, omega, prior_logits, eps_sigma).to(dt)
        out = kernel(gq.transpose(1, 2), gk.transpose(1, 2), v.transpose(1, 2))  # [B, T, H, ·]
        return out.transpose(1, 2).to(dt)

    fla_gma.__name__ = fla_gma.__qualname__ = f"fla.{name}"
    fla_gma.gma_declaration = Declaration(
        variants=("causal",), dtypes=("float32", "bfloat16"), grad=True, devices=(device,), namespace="torch",
        eps=FLA_EPS, n_multiple=FLA_CHUNK if name == "naive_chunk" else 1)
    return fla_gma


def target(name: str) -> str:
    """The command-line target of the kernel ``name`` (built by :func:`__getattr__` when loaded)."""
    return f"examples.check_fla:{name}"


def __getattr__(name: str) -> Any:
    """``examples.check_fla:<kernel>``: the kernel as ``gma-ref check`` loads it (a reproducer's command names it)."""
    if name in CPU_KERNELS or name in GPU_KERNELS:
        return make_fla_gma(name, "cuda" if name in GPU_KERNELS else "cpu")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def unavailable(device: str) -> str | None:
    """Why the fla check cannot run on ``device`` here, or ``None``."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if importlib.util.find_spec("fla") is None:
        return "flash-linear-attention (fla-core) is not installed: pip install -e '.[fla]'"
    if device == "cuda":
        if not torch.cuda.is_available():
            return "no CUDA device (fla's Triton kernels need a GPU)"
        for mod in ("triton", "cupy"):
            if importlib.util.find_spec(mod) is None:
                return f"{mod} is not installed"
    return None


def run(device: str = "cpu", kernels: tuple[str, ...] | None = None, dtypes: tuple[str, ...] = ("float32", "bfloat16"),
        long: bool = False, n_max: int | None = None, long_grad: bool = False, verbose: bool = False,
        repro: str | None = None) -> list[tuple[str, str, str, Any]]:
    """Check each kernel × dtype: the short default cases with gradients, then (``long``) the long cases.

    Returns rows ``(kernel, dtype, scale, report)``. Long cases are forward only unless
    ``long_grad`` (the recurrent references keep a graph of every step). ``repro``: write the
    shrunk reproducers of failing short cases into ``repro/<kernel>/``; their command names the
    kernel's target (:func:`target`).
    """
    rows = []
    for name in kernels or (GPU_KERNELS if device == "cuda" else CPU_KERNELS):
        impl = make_fla_gma(name, device)
        for dtype in dtypes:
            where = os.path.join(repro, name) if repro else None
            # The 29 edge cases (the figures of the oracle guide); fla's kernels take any N, K, d and heads.
            rows.append((name, dtype, "short", check(impl, dtype=dtype, grad=True, repro=where, name=target(name),
                                                     cases=CaseSet(tiling=False))))
            if long:
                rows.append((name, dtype, "long", check(impl, dtype=dtype,
                                                        grad=long_grad and name != "naive_recurrent",
                                                        cases=CaseSet(scale="long", n_max=n_max))))
            if verbose:
                print(rows[-1][3].format())
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--kernel", action="append", choices=CPU_KERNELS + GPU_KERNELS,
                    help="kernel to check (repeatable); default: the device's kernels")
    ap.add_argument("--dtype", action="append", choices=("float32", "bfloat16"))
    ap.add_argument("--long", action="store_true", help="also the long cases (forward; --long-grad for gradients)")
    ap.add_argument("--long-grad", action="store_true", help="gradients in the long cases too")
    ap.add_argument("--n-max", type=int, default=None, help="longest N of the long cases (default 131072)")
    ap.add_argument("--verbose", "-v", action="store_true", help="print every report")
    args = ap.parse_args(argv)
    why = unavailable(args.device)
    if why:
        print(f"check_fla: skipped: {why}")
        return 0
    t0 = time.perf_counter()
    rows = run(args.device, tuple(args.kernel) if args.kernel else None, tuple(args.dtype or ("float32", "bfloat16")),
               args.long, args.n_max, args.long_grad, args.verbose)
    failed = 0
    print(f"{'kernel':<16} {'dtype':<9} {'scale':<6} result")
    for name, dtype, scale, report in rows:
        n_pass = sum(1 for c in report.case_ids if c not in report.failed_cases())
        print(f"{name:<16} {dtype:<9} {scale:<6} {'PASS' if report.passed else 'FAIL'} {n_pass}/{len(report.case_ids)} "
              f"cases, {report.elapsed_s:.1f} s")
        if not report.passed:
            failed += 1
            print(report.format())
    print(f"{len(rows) - failed}/{len(rows)} checks passed in {time.perf_counter() - t0:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
