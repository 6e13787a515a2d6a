"""Checking a PyTorch CUDA implementation against the CuPy reference
=================================================================

Check a PyTorch CUDA implementation of GMA against the CuPy reference on the same GPU.

Needs a CUDA GPU, PyTorch with CUDA and CuPy (``pip install -e ".[test,cuda12]"`` plus a CUDA
build of torch). Run from the repository root::

    python examples/check_torch_cuda.py                 # float32 and bfloat16, forward + gradients
    python examples/check_torch_cuda.py --dtype float16 --cases 200 --json

or, for your own kernel, the CLI: ``gma-ref check mypkg.kernels:my_gma --device cuda --dtype bfloat16 --grad``.

The implementation below (``cuda_gma``) receives CUDA tensors rounded to the dtype under test and
returns a CUDA tensor; gradients come from autograd (``gma_ref.testing.torch_autograd``). The
harness moves the outputs to CuPy by DLPack on the same device (upcast to float64 there), runs
the float64 reference with CuPy on the GPU, and compares on the GPU: nothing goes through the
host except the error figures. Replace ``cuda_gma`` by your kernel to check it.
"""

# sphinx_gallery_thumbnail_path = '_figures/gallery_check_torch_cuda.png'

from __future__ import annotations

import argparse
import math
import sys

from gma_ref.testing import CaseSet, Declaration, check


def cuda_gma(q, k, v, means, omega, prior_logits, *, causal, eps, eps_sigma):
    """Mixed-precision GMA in PyTorch: scores/softmax/divisions in float32, Γ and matmuls in the input dtype."""
    import torch

    dt = q.dtype
    cdt = torch.float64 if dt == torch.float64 else torch.float32
    qf, kf, mu, om, al = (t.to(cdt) for t in (q, k, means, omega, prior_logits))
    var = torch.nn.functional.softplus(om) + eps_sigma
    log_pi = torch.log_softmax(al, dim=-1)
    const = 0.5 * torch.log(var).sum(-1) + 0.5 * q.shape[-1] * math.log(2 * math.pi)

    def gamma(x):
        diff = x.unsqueeze(-2) - mu.unsqueeze(-3)
        s = log_pi.unsqueeze(-2) - const.unsqueeze(-2) - 0.5 * (diff * diff / var.unsqueeze(-3)).sum(-1)
        g = torch.softmax(s, dim=-1)
        return g + (g.to(dt).to(cdt) - g).detach()  # stored in the input dtype, gradient in float32

    gq, gk = gamma(qf), gamma(kf)
    vf = v.to(cdt)
    if causal:
        a = torch.tril(gq @ gk.transpose(-1, -2))
        num, den = a @ vf, a.sum(-1) + eps
    else:
        memory, mass = gk.transpose(-1, -2) @ vf, gk.sum(-2)
        num, den = gq @ memory, (gq * mass.unsqueeze(-2)).sum(-1) + eps
    return (num / den.unsqueeze(-1)).to(dt)


cuda_gma.gma_declaration = Declaration(namespace="torch", devices=("cuda",), grad=True,
                                       dtypes=("float32", "bfloat16", "float16", "float64"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", action="append", help="dtype(s) to check (default: float32 and bfloat16)")
    ap.add_argument("--cases", type=int, default=0, help="random cases added to the default 25")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    try:
        import cupy
        import torch

        if not torch.cuda.is_available() or cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device visible to torch and CuPy")
    except Exception as exc:
        print(f"skipped: this example needs torch with CUDA, CuPy and a GPU ({type(exc).__name__}: {exc})")
        return 0
    status = 0
    for dtype in args.dtype or ["float32", "bfloat16"]:
        report = check(cuda_gma, dtype=dtype, device="cuda", grad=True,
                       name="examples/check_torch_cuda.py:cuda_gma", cases=CaseSet(n_generated=args.cases))
        print(report.to_json() if args.json else report.format())
        status = max(status, report.exit_code)
    return status


if __name__ == "__main__":
    sys.exit(main())
