"""Check flash-linear-attention's Triton kernels as causal GMA on a CPU, through Triton's interpreter.
===================================================================================================

fla's three Triton entry points for linear attention — ``chunk_linear_attn``,
``fused_chunk_linear_attn`` and ``fused_recurrent_linear_attn`` (fla-core 0.6.0) — run forward and
backward on CPU tensors when Triton runs in interpreter mode (``TRITON_INTERPRET=1``, which must be
set before triton is first imported: this script sets it on import). The mapping onto GMA is the
one of examples/check_fla.py (responsibilities as the feature maps q := Γ^Q, k := Γ^K, v := V,
scale 1, ``normalize=True``; its adapter is reused), and the kernels are checked through
declarations alone: causal, ε = 1e-10, any N (the kernels mask partial chunks).

The interpreter needs the workarounds of :mod:`gma_ref.testing.harness.triton_interpreter` (first autotune
config only; tensor loop variables; bfloat16 dot, casts and arithmetic on values instead of bit
patterns); ``--without NAME`` leaves one out to show what it repairs, ``--tf32`` adds the opt-in
TF32 emulation of float32 ``tl.dot`` (what a GPU run would show).

Install: ``pip install -e ".[test,triton]"`` (triton 3.9.0, CPU torch, fla-core, einops). Run::

    python examples/check_fla_triton.py                          # 3 kernels x float32, bfloat16, short
    python examples/check_fla_triton.py --kernel fused_chunk --long   # + the long case N = 4096
    python examples/check_fla_triton.py --dtype float32 --tf32
    python examples/check_fla_triton.py --dtype bfloat16 --without bf16_dot --without bf16_casts \\
        --without bf16_arithmetic
    python examples/check_fla_triton.py --repro repro/             # shrink failures into repro/<kernel>/
    python examples/check_fla_triton.py --reordered                # fla's normalise backward, reordered

Result (docs/oracle/triton-and-fla.md): every kernel passes 10 of the 11 default causal cases in float32 and in
bfloat16; ``tiny_grad`` fails because fla's normalise backward computes −(do·o)/den² with the
unnormalised o, and do·o underflows before 1/den² amplifies it. ``--reordered`` runs that backward
as −(do/den)·(o/den) (:func:`reordered_backward`), and then all 11 pass.

Each kernel is also a command-line target (from the repository root), which is how the
reproducers of failing cases name it; loading one turns on every interpreter workaround for the rest
of that process (the oracle's worker)::

    gma-ref check examples.check_fla_triton:fused_chunk --case-file repro/fused_chunk/<case>.npz

Without triton, fla or torch it prints why and exits 0. Exit status 1 if any check failed.
"""

# sphinx_gallery_thumbnail_path = '_figures/gallery_check_fla_triton.png'

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton (fla.ops does)

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import importlib.util  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from contextlib import ExitStack, contextmanager, nullcontext  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from gma_ref.testing import CaseSet, check  # noqa: E402
from gma_ref.testing.harness.triton_interpreter import WORKAROUNDS, interpreter_workarounds  # noqa: E402

KERNELS = ("chunk", "fused_chunk", "fused_recurrent")
LONG_KERNELS = ("fused_chunk",)  # the only one fast enough under the interpreter at N = 4096
LONG_N = 4096


def load_check_fla() -> Any:
    """examples/check_fla.py as a module (its adapter maps GMA onto fla's linear attention)."""
    path = Path(__file__).resolve().parent / "check_fla.py"
    spec = importlib.util.spec_from_file_location("gma_ref_example_check_fla", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def make_triton_gma(name: str, dtype: str = "float32") -> Any:
    """Causal GMA by fla's Triton kernel ``name`` on CPU tensors, declared causal with ε = 1e-10.

    fla's ``chunk`` backward refuses odd K or V in 16-bit dtypes (``chunk_bwd_dv requires even K and
    V``, fla/ops/common/chunk_o.py: a Triton miscompile on GPUs), so for ``chunk`` in bfloat16 the
    declaration also says K and d even: the harness then generates only such cases.
    """
    impl = load_check_fla().make_fla_gma(name, "cpu")
    if name == "chunk" and dtype == "bfloat16":
        impl.gma_declaration = dataclasses.replace(impl.gma_declaration, k_multiple=2, d_multiple=2)
    return impl


#: The interpreter workarounds a command-line target turns on, for the rest of its process.
_TARGET_WORKAROUNDS = ExitStack()
_TARGET_WORKAROUNDS_ON = False


def target(name: str) -> str:
    """The command-line target of the kernel ``name`` (built by :func:`__getattr__` when loaded)."""
    return f"examples.check_fla_triton:{name}"


def __getattr__(name: str) -> Any:
    """``examples.check_fla_triton:<kernel>``: the kernel as ``gma-ref check`` loads it, with every workaround on.

    The workarounds stay on for the rest of the process (the oracle's worker): the backward kernels
    run after the call returns, under autograd. The declaration is the float32 one (for ``chunk``,
    any K and d); a bfloat16 case file of ``chunk`` has even K and d already.
    """
    if name in KERNELS:
        if not _TARGET_WORKAROUNDS_ON:
            _TARGET_WORKAROUNDS.enter_context(interpreter_workarounds())
            globals()["_TARGET_WORKAROUNDS_ON"] = True
        return make_triton_gma(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def reordered_backward(ctx: Any, do: Any, dz_state: Any) -> tuple:
    """fla's ``StatefulNormalizeFunction.backward`` (fla/ops/linear_attn/utils.py) with one line reordered.

    fla computes ``ddenom = -(do * o).sum(-1) / denom**2`` with the *unnormalised* o: when do is
    tiny (the ``tiny_grad`` case, do ≈ 4·2⁻¹²⁶) and den small, do·o underflows to a few subnormal
    spacings (or 0) before 1/den² (≈ 1e16) amplifies it. Reordered, every intermediate stays
    normal: ``ddenom = -((do / denom) * (o / denom)).sum(-1)`` — the same value in exact arithmetic.
    Only the path the check uses (no ``cu_seqlens``, no initial state) is reimplemented
    (:func:`reordered_normalise_backward` sends any other call to fla's own backward).
    """
    from fla.ops.utils.cumsum import chunk_global_cumsum

    o, q, k_cum, denom = ctx.saved_tensors
    d_o_in = do / denom
    ddenom = -(d_o_in * (o / denom)).sum(-1, keepdim=True)  # fla: -(do * o).sum(-1, keepdim=True) / (denom * denom)
    dq = ddenom * ctx.scale * k_cum
    dk_cum = ddenom * ctx.scale * q
    if dz_state is not None:
        edge = dk_cum[:, :1] if ctx.reverse else dk_cum[:, -1:]
        edge.add_(dz_state.to(dk_cum.dtype))
    dk = chunk_global_cumsum(dk_cum, reverse=not ctx.reverse, cu_seqlens=None, output_dtype=ctx.k_dtype)
    return d_o_in, dq, dk, None, None, None, None


@contextmanager
def reordered_normalise_backward() -> Iterator[None]:
    """Within the block, fla's normalise step runs :func:`reordered_backward` (fla's own is restored on exit)."""
    from fla.ops.linear_attn.utils import StatefulNormalizeFunction

    original = StatefulNormalizeFunction.backward

    def backward(ctx: Any, do: Any, dz_state: Any) -> tuple:
        if ctx.cu_seqlens is not None or ctx.has_z_init:
            return original(ctx, do, dz_state)
        return reordered_backward(ctx, do, dz_state)

    StatefulNormalizeFunction.backward = staticmethod(backward)
    try:
        yield
    finally:
        StatefulNormalizeFunction.backward = staticmethod(original)


def unavailable() -> str | None:
    """Why the check cannot run here, or ``None``."""
    for mod, what in (("torch", "PyTorch"), ("triton", "Triton"), ("fla", "flash-linear-attention (fla-core)")):
        if importlib.util.find_spec(mod) is None:
            return f"{what} is not installed: pip install -e '.[triton]'"
    from triton import knobs

    if not knobs.runtime.interpret:
        return "triton was imported before TRITON_INTERPRET=1 was set (run this script in a fresh process)"
    return None


def worst_ratio(report: Any, case_id: str | None = None) -> float:
    """The largest value/threshold over the report's numeric checks (of one case if given; > 1 is a failure)."""
    ratios = [r.value / r.threshold for r in report.results
              if r.value is not None and r.threshold not in (None, 0.0) and case_id in (None, r.case_id)]
    return max(ratios, default=float("nan"))


def run(kernels: tuple[str, ...] = KERNELS, dtypes: tuple[str, ...] = ("float32", "bfloat16"),
        long: bool = False, long_grad: bool = False, workarounds: tuple[str, ...] = WORKAROUNDS,
        tf32: bool = False, reordered: bool = False, repro: str | None = None, case_file: str | None = None,
        verbose: bool = False) -> list[tuple[str, str, str, Any]]:
    """Check each kernel × dtype (short default cases with gradients; ``long``: also N = 4096 for fused_chunk).

    Returns rows ``(kernel, dtype, scale, report)``. Every check runs inside
    :func:`~gma_ref.testing.harness.triton_interpreter.interpreter_workarounds` with ``workarounds`` (and the
    TF32 emulation if ``tf32``), so the backward (run by autograd after the call) is covered too;
    ``reordered`` runs fla's normalise backward reordered (:func:`reordered_backward`). ``repro``:
    write each kernel's shrunk reproducers into ``repro/<kernel>/``; ``case_file``: check only that case.
    """
    rows = []
    fix = reordered_normalise_backward() if reordered else nullcontext()
    with interpreter_workarounds(workarounds, tf32=tf32), fix:
        for name in kernels:
            for dtype in dtypes:
                impl = make_triton_gma(name, dtype)
                where = os.path.join(repro, name) if repro else None
                # A reproducer names the kernel's target only where the target computes the same thing:
                # every workaround, no TF32 emulation, fla's own backward.
                plain = workarounds == WORKAROUNDS and not tf32 and not reordered
                # The edge cases alone: the interpreter runs a kernel hundreds of times slower than a GPU.
                rows.append((name, dtype, "short", check(impl, dtype=dtype, grad=True, repro=where,
                                                         name=target(name) if plain else None,
                                                         cases=CaseSet(tiling=False, file=case_file))))
                if verbose:
                    print(rows[-1][3].format(), flush=True)
                if long and name in LONG_KERNELS and case_file is None:
                    rows.append((name, dtype, "long", check(impl, dtype=dtype, grad=long_grad,
                                                            cases=CaseSet(scale="long", n_max=LONG_N))))
                    if verbose:
                        print(rows[-1][3].format(), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernel", action="append", choices=KERNELS, help="kernel to check (repeatable); default all")
    ap.add_argument("--dtype", action="append", choices=("float32", "bfloat16"))
    ap.add_argument("--long", action="store_true", help=f"also the long case N = {LONG_N} (fused_chunk), forward")
    ap.add_argument("--long-grad", action="store_true", help="gradients in the long case too")
    ap.add_argument("--without", action="append", choices=WORKAROUNDS, default=[],
                    help="leave this interpreter workaround out (repeatable)")
    ap.add_argument("--tf32", action="store_true", help="emulate TF32 in float32 tl.dot, as on a GPU")
    ap.add_argument("--reordered", action="store_true",
                    help="fla's normalise backward reordered as -(do/den)·(o/den): the tiny_grad fix")
    ap.add_argument("--repro", default=None, help="write shrunk reproducers of failing cases into DIR/<kernel>/")
    ap.add_argument("--case-file", default=None, help="check only this reproducer (.npz)")
    ap.add_argument("--verbose", "-v", action="store_true", help="print every report")
    args = ap.parse_args(argv)
    why = unavailable()
    if why:
        print(f"check_fla_triton: skipped: {why}")
        return 0
    t0 = time.perf_counter()
    workarounds = tuple(w for w in WORKAROUNDS if w not in args.without)
    rows = run(tuple(args.kernel or KERNELS), tuple(args.dtype or ("float32", "bfloat16")), args.long,
               args.long_grad, workarounds, args.tf32, args.reordered, args.repro, args.case_file, args.verbose)
    print(f"workarounds: {', '.join(workarounds) or 'none'}" + (" + tf32 emulation" if args.tf32 else "")
          + (" + reordered normalise backward" if args.reordered else ""))
    print(f"{'kernel':<16} {'dtype':<9} {'scale':<6} result")
    failed = 0
    for name, dtype, scale, report in rows:
        n_pass = sum(1 for c in report.case_ids if c not in report.failed_cases())
        print(f"{name:<16} {dtype:<9} {scale:<6} {'PASS' if report.passed else 'FAIL'} {n_pass}/{len(report.case_ids)} "
              f"cases, worst ratio {worst_ratio(report):.3g}, {report.elapsed_s:.1f} s", flush=True)
        if not report.passed:
            failed += 1
            if args.verbose:
                print(report.format())
            else:
                print("  failing: " + ", ".join(f"{c} ({worst_ratio(report, c):.3g})" for c in report.failed_cases()))
    print(f"{len(rows) - failed}/{len(rows)} checks passed in {time.perf_counter() - t0:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
