"""Workarounds that let Triton 3.9's interpreter (``TRITON_INTERPRET=1``) run real kernels on a CPU.

The interpreter runs a ``@triton.jit`` kernel as NumPy, one program at a time, so a kernel
author without a GPU can check it with :func:`gma_ref.testing.check`. Five defects of the
interpreter (none in the kernels) stop or falsify such a check; each function below repairs one
and returns the function that undoes it:

====================  ==========================================================================
name                  what the interpreter does (Triton 3.9.0) and what the workaround does
====================  ==========================================================================
``autotune``          ``@triton.autotune`` benchmarks every config through the GPU driver:
                      ``RuntimeError: 0 active drivers``. → run only the first config.
``loop_tensors``      ``for i in range(n)`` binds ``i`` to a Python int, so ``i.to(tl.int64)``
                      raises. → bind it to an int32 tensor, as compiled Triton does.
``bf16_dot``          ``tl.dot`` on bfloat16 multiplies the raw 16-bit patterns (stored as
                      ``uint16``; triton#11584). → multiply the values in float32.
``bf16_casts``        float32 → bfloat16 truncates instead of rounding to nearest even;
                      bfloat16 → float32 loses subnormals; an integer cast to bfloat16
                      becomes the bit pattern. → exact, round-to-nearest-even.
``bf16_arithmetic``   elementwise ops and comparisons on bfloat16 run on the bit patterns
                      (triton#10919). → compute in float32, round the result to bfloat16.
====================  ==========================================================================

and one opt-in emulation, ``tf32``: a float32 ``tl.dot`` with ``input_precision="tf32"`` (the
default) runs in full float32 in the interpreter, while a GPU rounds its operands to TF32
(10 mantissa bits); :func:`emulate_tf32_dot` rounds them, so a CPU check shows what a GPU would flag.

Usage (the environment variable must be set before ``triton`` is first imported)::

    import os; os.environ["TRITON_INTERPRET"] = "1"
    from gma_ref.testing.harness.triton_interpreter import interpreter_workarounds
    with interpreter_workarounds():                 # all five; ("tf32",) adds the emulation
        report = check(my_triton_gma, dtype="bfloat16", grad=True)

Every patch is on a class of ``triton.runtime.interpreter`` or ``triton.runtime.autotuner`` and
is undone on leaving the block. Each workaround has a test (tests/testing/harness/test_triton_interpreter.py) that
shows the misbehaviour without it and fails once Triton fixes it, so the workaround can be deleted.

This module imports ``triton`` only inside its functions: importing it (or ``gma_ref``) never
imports triton or torch.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

__all__ = ["WORKAROUNDS", "EMULATIONS", "Undo", "first_config_autotuning", "tensor_loop_variables", "bf16_dot",
           "bf16_rounding_casts", "bf16_value_arithmetic", "emulate_tf32_dot", "APPLY", "interpreter_workarounds"]

WORKAROUNDS = ("autotune", "loop_tensors", "bf16_dot", "bf16_casts", "bf16_arithmetic")
EMULATIONS = ("tf32",)

Undo = Callable[[], None]


def _set(owner: Any, name: str, value: Any) -> Undo:
    """Set ``owner.name = value`` and return the function that restores the previous attribute."""
    had = name in vars(owner)
    old = vars(owner).get(name)
    setattr(owner, name, value)

    def undo() -> None:
        if had:
            setattr(owner, name, old)
        else:
            delattr(owner, name)

    return undo


# ---- bfloat16 <-> float32 on the interpreter's uint16 storage ---------------------------------------------
# bfloat16 is the top half of a float32: widening is a shift (exact, subnormals included); narrowing
# adds 0x7FFF plus the lowest kept bit, then shifts (round to nearest, ties to even). A NaN becomes
# the quiet NaN 0x7FC0 instead of rounding into Inf.

def _bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.ascontiguousarray(bits).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _f32_to_bf16(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    b = x.view(np.uint32)
    rounded = (b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return np.where(np.isnan(x), np.uint32(0x7FC0), rounded).astype(np.uint16)


def _is_bf16(handle: Any) -> bool:
    import triton.language as tl

    return handle.dtype.scalar == tl.bfloat16


def _as_f32(handle: Any) -> Any:
    """A float32 ``TensorHandle`` with the value of a bfloat16 one."""
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    return TensorHandle(_bf16_to_f32(handle.data), tl.float32)


# ---- the workarounds --------------------------------------------------------------------------------------

def first_config_autotuning() -> Undo:
    """Run only the first config of every ``@triton.autotune`` kernel (no benchmarking).

    Reason: ``Autotuner.run`` benchmarks each config with ``driver.active.get_benchmarker()``,
    which needs a GPU driver even under the interpreter (``RuntimeError: 0 active drivers ([]).
    There should only be one.``). No upstream issue found. Patched: ``Autotuner.prune_configs``
    returns its first survivor, and ``Autotuner.run`` skips benchmarking for a single config.
    Consequence: only that tile configuration is checked.
    """
    from triton.runtime.autotuner import Autotuner

    prune = Autotuner.prune_configs

    def prune_configs(self: Any, kwargs: dict) -> list:
        return prune(self, kwargs)[:1]

    return _set(Autotuner, "prune_configs", prune_configs)


def _is_dynamic_range(call: ast.expr) -> bool:
    """``range(...)`` or ``tl.range(...)`` (not ``tl.static_range``, whose variable is a constexpr)."""
    if not isinstance(call, ast.Call):
        return False
    f = call.func
    return (isinstance(f, ast.Name) and f.id == "range") or (isinstance(f, ast.Attribute) and f.attr == "range")


def tensor_loop_variables() -> Undo:
    """Bind the variable of ``for i in range(...)`` / ``tl.range(...)`` to an int32 tensor.

    Reason: compiled Triton lowers such a loop to ``scf.for`` whose induction variable is a
    tensor; the interpreter runs a Python ``for`` and binds a Python int, so kernel code such as
    fla's ``i_t.to(tl.int64)`` raises ``AttributeError``. No upstream issue found. Patched: the
    interpreter's ``ASTTransformer`` gets a ``visit_For`` that prepends
    ``i = interpreter_semantic.to_tensor(i, False)`` to the loop body; the cache of rewritten
    kernels is cleared on applying and on undoing, so no rewritten kernel outlives the patch.
    """
    from triton.runtime.interpreter import ASTTransformer, InterpretedFunction

    def visit_For(self: Any, node: ast.For) -> ast.For:
        node = self.generic_visit(node)
        if isinstance(node.target, ast.Name) and _is_dynamic_range(node.iter):
            to_tensor = ast.Attribute(value=ast.Name(id="interpreter_semantic", ctx=ast.Load()), attr="to_tensor",
                                      ctx=ast.Load())
            wrap = ast.Assign(targets=[ast.Name(id=node.target.id, ctx=ast.Store())],
                              value=ast.Call(func=to_tensor, args=[ast.Name(id=node.target.id, ctx=ast.Load()),
                                                                   ast.Constant(value=False)], keywords=[]))
            node.body.insert(0, ast.copy_location(wrap, node))
        return node

    InterpretedFunction.rewritten_fn.clear()
    restore = _set(ASTTransformer, "visit_For", visit_For)

    def undo() -> None:
        restore()
        InterpretedFunction.rewritten_fn.clear()

    return undo


def bf16_dot() -> Undo:
    """Multiply the values, not the bit patterns, in a bfloat16 ``tl.dot``.

    Reason: the interpreter stores bfloat16 as ``uint16`` and ``InterpreterBuilder.create_dot``
    converts only 8-bit float operands before ``np.matmul``, so a bfloat16 dot multiplies the
    raw 16-bit integers (values around 1e10 for inputs in [-2, 2]): triton#11584 (closed: "we
    just don't support it yet"). Patched: bfloat16 operands are widened (exactly) to float32 first
    (the accumulator of a bfloat16 dot is float32: Triton refuses ``out_dtype=tl.bfloat16``). The
    products of two bfloat16 values are exact in float32, as on a GPU's tensor cores.
    """
    from triton.runtime.interpreter import InterpreterBuilder

    dot = InterpreterBuilder.create_dot

    def create_dot(self: Any, a: Any, b: Any, d: Any, input_precision: Any, max_num_imprecise_acc: Any) -> Any:
        a, b = (_as_f32(h) if _is_bf16(h) else h for h in (a, b))  # d is float32: Triton refuses a bf16 out_dtype
        return dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    return _set(InterpreterBuilder, "create_dot", create_dot)


def bf16_rounding_casts() -> Undo:
    """Cast to bfloat16 by rounding to nearest even, and from bfloat16 exactly (subnormals kept).

    Reason: ``InterpreterBuilder.cast_impl`` converts float32 ↔ bfloat16 with ``_convert_float``
    and no rounding mode, which truncates the mantissa (a GPU's ``cvt.rn.bf16.f32`` rounds to
    nearest even) and mis-normalises bfloat16 subnormals on the way up; an integer or float64 cast
    to bfloat16 uses ``astype(uint16)``, so the value becomes the bit pattern (3 → 2.8e-45). No
    upstream issue found (the interpreter's documentation says bfloat16 is unsupported). Patched:
    ``cast_impl`` goes through float32 — bfloat16 → float32 is a shift, float32 → bfloat16 rounds to
    nearest even (a float64 or integer source is rounded twice, via float32).
    """
    import triton.language as tl
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    cast = InterpreterBuilder.cast_impl

    def cast_impl(self: Any, src: Any, dst_type: Any) -> Any:
        if src.dtype.scalar == tl.bfloat16:  # Triton's semantic routes bfloat16 -> any type through float32
            wide = _as_f32(src)
            return wide if dst_type.scalar == tl.float32 else cast(self, wide, dst_type)
        if dst_type.scalar == tl.bfloat16:
            wide = src if src.dtype.scalar == tl.float32 else cast(self, src, tl.float32)
            return TensorHandle(_f32_to_bf16(wide.data), tl.bfloat16)
        return cast(self, src, dst_type)

    return _set(InterpreterBuilder, "cast_impl", cast_impl)


def bf16_value_arithmetic() -> Undo:
    """Run elementwise bfloat16 ops on the values: in float32, each result rounded to bfloat16.

    Reason: ``InterpreterBuilder.binary_op``, ``unary_op`` and ``create_fma`` apply the NumPy op to
    the ``uint16`` storage, so ``2.5 + 2.0`` gives ``-2.9e-39`` and ``-5.0 < -2.0`` is false
    (triton#10919; the fix, triton#10945, was closed unmerged). Patched: bfloat16 operands are
    widened to float32, the op runs there, and a floating result is rounded to nearest even (a
    comparison's boolean result is kept). A GPU computes bfloat16 add/mul the same way (one
    rounding per op). Not covered (they bypass these three methods): reductions and scans of
    bfloat16 (``tl.sum``, ``tl.cumsum``), ``erf``, ``rsqrt`` and ``clamp`` — cast to float32 first,
    as fla's kernels do — and casts with an explicit ``fp_downcast_rounding``.
    """
    import triton.language as tl
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    binary, unary, fma = InterpreterBuilder.binary_op, InterpreterBuilder.unary_op, InterpreterBuilder.create_fma

    def narrow(out: Any) -> Any:
        if out.data.dtype == np.float32:
            return TensorHandle(_f32_to_bf16(out.data), tl.bfloat16)
        return out

    def binary_op(self: Any, lhs: Any, rhs: Any, op: Any) -> Any:
        if not (_is_bf16(lhs) or _is_bf16(rhs)):
            return binary(self, lhs, rhs, op)
        return narrow(binary(self, *(_as_f32(h) if _is_bf16(h) else h for h in (lhs, rhs)), op))

    def unary_op(self: Any, arg: Any, op: Any) -> Any:
        return narrow(unary(self, _as_f32(arg), op)) if _is_bf16(arg) else unary(self, arg, op)

    def create_fma(self: Any, x: Any, y: Any, z: Any) -> Any:
        if not any(_is_bf16(h) for h in (x, y, z)):
            return fma(self, x, y, z)
        return narrow(fma(self, *(_as_f32(h) if _is_bf16(h) else h for h in (x, y, z))))

    undos = [_set(InterpreterBuilder, "binary_op", binary_op), _set(InterpreterBuilder, "unary_op", unary_op),
             _set(InterpreterBuilder, "create_fma", create_fma)]

    def undo() -> None:
        for u in reversed(undos):
            u()

    return undo


def emulate_tf32_dot() -> Undo:
    """Opt-in: round float32 ``tl.dot`` operands to TF32 when the dot asks for ``tf32``, as a GPU does.

    Reason: on an NVIDIA GPU a float32 ``tl.dot`` with the default ``input_precision="tf32"`` runs
    on tensor cores with 10-bit mantissas; the interpreter ignores ``input_precision`` and
    multiplies in full float32, so a CPU check is more accurate than the kernel will be. Patched:
    ``create_dot`` rounds both float32 operands to 10 mantissa bits (nearest, ties to even — the
    interpreter's own ``_round_f32_to_tf32``; hardware that truncates errs at most twice as much)
    before the float32 product; ``"ieee"`` and ``"tf32x3"`` dots are left alone.
    """
    import triton.language as tl
    from triton._C.libtriton import ir
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle, _round_f32_to_tf32

    dot = InterpreterBuilder.create_dot

    def create_dot(self: Any, a: Any, b: Any, d: Any, input_precision: Any, max_num_imprecise_acc: Any) -> Any:
        if input_precision == ir.INPUT_PRECISION.TF32:
            a, b = (TensorHandle(_round_f32_to_tf32(h.data), tl.float32) if h.dtype.scalar == tl.float32 else h
                    for h in (a, b))
        return dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    return _set(InterpreterBuilder, "create_dot", create_dot)


APPLY: dict[str, Callable[[], Undo]] = {
    "autotune": first_config_autotuning,
    "loop_tensors": tensor_loop_variables,
    "bf16_dot": bf16_dot,
    "bf16_casts": bf16_rounding_casts,
    "bf16_arithmetic": bf16_value_arithmetic,
    "tf32": emulate_tf32_dot,
}


@contextmanager
def interpreter_workarounds(names: Sequence[str] = WORKAROUNDS, *, tf32: bool = False) -> Iterator[tuple[str, ...]]:
    """Apply the chosen workarounds (default: all five) for the duration of a ``with`` block.

    Parameters
    ----------
    names : sequence of str
        A subset of :data:`WORKAROUNDS` (and :data:`EMULATIONS`), applied in the order given.
    tf32 : bool
        Also apply :func:`emulate_tf32_dot` (after the others, so it wraps the bfloat16 dot).

    Yields the tuple of names applied. Undone in reverse order on exit, also after an exception.

    Raises
    ------
    ValueError
        An unknown name (the known ones are listed).
    RuntimeError
        ``TRITON_INTERPRET`` was not ``1`` when triton was imported (the workarounds would do nothing).
    ImportError
        Triton is not installed.
    """
    chosen = tuple(names) + (("tf32",) if tf32 and "tf32" not in names else ())
    unknown = [n for n in chosen if n not in APPLY]
    if unknown:
        raise ValueError(f"names: unknown workaround(s) {unknown}; expected a subset of {WORKAROUNDS + EMULATIONS}")
    from triton import knobs

    if not knobs.runtime.interpret:
        raise RuntimeError("triton is not in interpreter mode: set TRITON_INTERPRET=1 before importing triton")
    undos: list[Undo] = []
    try:
        for name in chosen:
            undos.append(APPLY[name]())
        yield chosen
    finally:
        for undo in reversed(undos):
            undo()
