"""gma_ref.testing.harness.triton_interpreter: each workaround repairs what it says, and is still needed.

Every workaround has a pair of assertions on a tiny ``@triton.jit`` kernel run by the interpreter:
*without* it the interpreter misbehaves as documented (so the test fails, and the workaround can
be deleted, once Triton fixes the interpreter), and *with* it the kernel gives the value a GPU
gives. Skipped, with the reason, without triton or torch. ``TRITON_INTERPRET=1`` is set here before
triton is imported; if triton was imported earlier in this process without it, the tests skip.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from gma_ref.testing.harness.triton_interpreter import WORKAROUNDS, interpreter_workarounds

MISSING = [m for m in ("triton", "torch") if importlib.util.find_spec(m) is None]
if not MISSING:
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import triton
    import triton.language as tl
    from triton import knobs

    INTERPRETING = bool(knobs.runtime.interpret)
else:  # pragma: no cover - the fresh environment
    INTERPRETING = False

needs_triton = pytest.mark.skipif(
    bool(MISSING) or not INTERPRETING,
    reason=(f"needs {' and '.join(MISSING)}: pip install -e '.[triton]'" if MISSING
            else "triton was imported before TRITON_INTERPRET=1 was set"))

ROOT = Path(__file__).resolve().parents[3]

if not MISSING:

    @triton.autotune(configs=[triton.Config({"BLOCK": 4}), triton.Config({"BLOCK": 8})], key=["n"])
    @triton.jit
    def copy_autotuned(x, y, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(y + offs, tl.load(x + offs, mask=offs < n), mask=offs < n)

    @triton.jit
    def loop_offsets(y, n_steps):
        for i in range(0, n_steps):
            tl.store(y + i, i.to(tl.int64) * 3)

    @triton.jit
    def loop_kinds(y):
        for i in tl.static_range(2):  # a constexpr in compiled Triton: must stay an int (arange needs one)
            r = tl.arange(0, 2 << i)
            tl.store(y + r, r + 10 * i)
        for j in tl.range(0, 2):  # a tensor in compiled Triton
            tl.store(y + 4 + j, j.to(tl.int64) + 20)
        for c in (1, 2):  # a loop over a tuple is plain Python, left alone (arange needs an int)
            r2 = tl.arange(0, c)
            tl.store(y + 6 + r2, r2 + 30 + c)

    @triton.jit
    def dot16(a, b, c, M: tl.constexpr):
        r = tl.arange(0, M)
        x = tl.load(a + r[:, None] * M + r[None, :])
        w = tl.load(b + r[:, None] * M + r[None, :])
        tl.store(c + r[:, None] * M + r[None, :], tl.dot(x, w))

    @triton.jit
    def to_bf16(x, y, n: tl.constexpr):
        r = tl.arange(0, n)
        tl.store(y + r, tl.load(x + r).to(tl.bfloat16))

    @triton.jit
    def to_f32(x, y, n: tl.constexpr):
        r = tl.arange(0, n)
        tl.store(y + r, tl.load(x + r).to(tl.float32))

    @triton.jit
    def bf16_to_others(x, yi, yd, n: tl.constexpr):
        r = tl.arange(0, n)
        b = tl.load(x + r)
        tl.store(yi + r, b.to(tl.int32))
        tl.store(yd + r, b.to(tl.float64))

    @triton.jit
    def int_to_bf16(x, y, n: tl.constexpr):
        r = tl.arange(0, n)
        tl.store(y + r, tl.load(x + r).to(tl.bfloat16))

    @triton.jit
    def add_and_less(x, z, s, lt, f, e, n: tl.constexpr):
        r = tl.arange(0, n)
        a = tl.load(x + r)
        b = tl.load(z + r)
        tl.store(s + r, a + b)
        tl.store(f + r, tl.fma(a, b, a))
        tl.store(e + r, -b)
        tl.store(lt + r, (a < b).to(tl.int32) * (r + 1))  # integer arithmetic: left to the interpreter


def with_only(names):
    """The context manager with exactly ``names`` applied."""
    return interpreter_workarounds(tuple(names))


def test_importing_the_module_does_not_import_triton_or_torch():
    """`gma_ref.testing.harness.triton_interpreter` imports triton/torch only inside its functions."""
    code = ("import sys, gma_ref.testing.harness.triton_interpreter\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('triton', 'torch')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_unknown_name_is_refused_naming_the_known_ones():
    """A misspelt workaround is a ValueError that lists the valid names, before anything is patched."""
    with pytest.raises(ValueError, match="bf16_dot"), interpreter_workarounds(("bf16-dot",)):
        pass


@needs_triton
def test_refused_when_triton_is_not_interpreting(monkeypatch: pytest.MonkeyPatch):
    """Outside interpreter mode the workarounds would patch nothing that runs: a RuntimeError says so."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"), interpreter_workarounds():
        pass


@needs_triton
def test_patches_are_undone_on_exit():
    """Leaving the block restores every patched attribute, also after an exception."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.interpreter import ASTTransformer, InterpreterBuilder

    names = ("create_dot", "cast_impl", "binary_op", "unary_op", "create_fma")
    before = [getattr(InterpreterBuilder, n) for n in names] + [Autotuner.prune_configs]
    assert "visit_For" not in vars(ASTTransformer)
    with pytest.raises(KeyError), interpreter_workarounds(WORKAROUNDS, tf32=True):
        assert InterpreterBuilder.create_dot is not before[0] and "visit_For" in vars(ASTTransformer)
        raise KeyError("inside")
    assert [getattr(InterpreterBuilder, n) for n in names] + [Autotuner.prune_configs] == before
    assert "visit_For" not in vars(ASTTransformer)


@pytest.mark.skipif(not MISSING and torch.cuda.is_available(), reason="a GPU driver is active: autotuning works")
@needs_triton
def test_autotune_needs_a_driver_without_the_workaround():
    """Without a GPU driver the autotuner fails to benchmark; with the workaround the first config runs."""
    x = torch.arange(6, dtype=torch.float32)
    y = torch.zeros(6)
    with with_only(()), pytest.raises(RuntimeError, match="active drivers"):
        copy_autotuned[(1,)](x, y, 6)
    with with_only(("autotune",)):
        copy_autotuned.cache.clear()
        copy_autotuned[(1,)](x, y, 6)
        assert copy_autotuned.best_config.kwargs == {"BLOCK": 4}  # the first config, not a benchmarked one
    assert y.tolist() == [0.0, 1.0, 2.0, 3.0, 0.0, 0.0]  # BLOCK = 4 copies four elements


@needs_triton
def test_loop_variable_is_a_python_int_without_the_workaround():
    """`for i in range(n)` binds an int (so `i.to(tl.int64)` raises); with the workaround, a tensor."""
    y = torch.zeros(4, dtype=torch.int64)
    with with_only(()), pytest.raises(Exception, match="has no attribute 'to'"):
        loop_offsets[(1,)](y, 4)
    with with_only(("loop_tensors",)):
        loop_offsets[(1,)](y, 4)
    assert y.tolist() == [0, 3, 6, 9]
    with with_only(()), pytest.raises(Exception, match="has no attribute 'to'"):  # undone: no rewrite survives
        loop_offsets[(1,)](y, 4)


@needs_triton
def test_only_dynamic_range_loops_get_tensor_variables():
    """`tl.static_range` keeps its int variable (it is a constexpr in compiled Triton), `tl.range` gets a
    tensor like `range`, and a loop over a tuple is left alone."""
    y = torch.zeros(8, dtype=torch.int64)
    with with_only(("loop_tensors",)):
        loop_kinds[(1,)](y)
    assert y.tolist() == [10, 11, 12, 13, 20, 21, 32, 33]


@needs_triton
def test_bf16_dot_multiplies_bit_patterns_without_the_workaround():
    """triton#11584: a bfloat16 dot of small integers is off by ~1e10; with the workaround it is exact."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randint(-2, 3, (16, 16), generator=g).to(torch.bfloat16) for _ in range(2))
    expected = a.float() @ b.float()
    c = torch.zeros(16, 16)
    with with_only(()):
        dot16[(1,)](a, b, c, M=16)
    assert (c - expected).abs().max().item() > 1e6
    with with_only(("bf16_dot",)):
        dot16[(1,)](a, b, c, M=16)
    assert torch.equal(c, expected)


@needs_triton
def test_bf16_casts_truncate_and_lose_subnormals_without_the_workaround():
    """float32 → bfloat16 truncates (1 + 3·2⁻⁹ → 1, not 1 + 2⁻⁷); bfloat16 → float32 loses subnormals.

    Fixed, the casts agree bit for bit with PyTorch's (round to nearest, ties to even — 1 + 2⁻⁸ → 1,
    1 + 3·2⁻⁸ → 1 + 2⁻⁶ —, overflow to Inf, NaN to a NaN) and widen exactly."""
    x = torch.tensor([1 + 3 * 2.0**-9, -(1 + 3 * 2.0**-9), 2.0**-130, 1.0, 1 + 2.0**-8, 1 + 3 * 2.0**-8,
                      3.3895e38, float("nan"), -float("inf"), 1e-39], dtype=torch.float32)
    y = torch.zeros(10, dtype=torch.bfloat16)
    sub = torch.tensor([2.0**-130, -(2.0**-128 + 2.0**-132), 1e-38, 3.0], dtype=torch.bfloat16)
    w = torch.zeros(4)
    with with_only(()):
        to_bf16[(1,)](x[:4], y[:4], n=4)
        to_f32[(1,)](sub, w, n=4)
    assert y[0].item() == 1.0 and not torch.equal(y[:4], x[:4].to(torch.bfloat16))
    assert not torch.equal(w, sub.float())
    with with_only(("bf16_casts",)):
        to_bf16[(1,)](x[:8], y[:8], n=8)
        to_bf16[(1,)](x[8:], y[8:], n=2)
        to_f32[(1,)](sub, w, n=4)
    finite = ~torch.isnan(x)
    assert y[finite].view(torch.int16).tolist() == x[finite].to(torch.bfloat16).view(torch.int16).tolist()
    assert y[~finite].view(torch.int16).tolist() == [0x7FC0]  # a quiet NaN (PyTorch's is 0xFFFF: any NaN will do)
    assert torch.equal(w, sub.float())


@needs_triton
def test_integer_to_bf16_cast_keeps_the_bit_pattern_without_the_workaround():
    """int32 → bfloat16 makes the integer the bit pattern (3 → 2.8e-45); with the workaround it goes
    through float32 (257 → 256 by ties to even, as PyTorch), and bfloat16 → int32/float64 stays right."""
    b = torch.tensor([3.5, -2.0, 256.0, 1e-3], dtype=torch.bfloat16)
    yi, yd = torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.float64)
    ints = torch.tensor([3, 257, -5, 1000], dtype=torch.int32)
    yb = torch.zeros(4, dtype=torch.bfloat16)
    with with_only(()):
        int_to_bf16[(1,)](ints, yb, n=4)
    assert yb.view(torch.int16)[0].item() == 3  # the integer 3 became the bit pattern 0x0003
    with with_only(("bf16_casts",)):
        bf16_to_others[(1,)](b, yi, yd, n=4)
        int_to_bf16[(1,)](ints, yb, n=4)
    assert yi.tolist() == b.to(torch.int32).tolist() and torch.equal(yd, b.double())
    assert torch.equal(yb, ints.to(torch.bfloat16))


@needs_triton
def test_bf16_arithmetic_runs_on_bit_patterns_without_the_workaround():
    """triton#10919: bfloat16 2.5 + 2.0 is not 4.5 and −5 < −2 is false; with the workaround +, <, fma (one
    rounding) and negation agree with PyTorch."""
    a = torch.tensor([2.5, -5.0, 1.0, 3.0], dtype=torch.bfloat16)
    b = torch.tensor([2.0, -2.0, 2.0**-8, -3.0], dtype=torch.bfloat16)
    s = torch.zeros(4, dtype=torch.bfloat16)
    lt = torch.zeros(4, dtype=torch.int32)
    f, e = torch.zeros(4, dtype=torch.bfloat16), torch.zeros(4, dtype=torch.bfloat16)
    with with_only(("bf16_casts",)), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the fma of two bit patterns overflows uint16
        add_and_less[(1,)](a, b, s, lt, f, e, n=4)
    assert s[0].item() != 4.5 and lt[1].item() == 0
    with with_only(("bf16_casts", "bf16_arithmetic")):
        add_and_less[(1,)](a, b, s, lt, f, e, n=4)
    assert torch.equal(s, a + b)  # torch's bfloat16 add: float32, rounded to nearest even
    assert torch.equal(f, (a.float() * b.float() + a.float()).to(torch.bfloat16))  # one rounding
    assert torch.equal(e, -b)
    assert lt.tolist() == ((a < b).int() * torch.arange(1, 5)).tolist()


@needs_triton
def test_float32_dot_ignores_tf32_and_the_emulation_rounds_to_10_bits():
    """The interpreter's float32 `tl.dot` is exact float32 despite input_precision='tf32' (so the
    emulation is needed to see TF32); emulated, each operand is rounded to 10 mantissa bits."""
    m = 16
    a = torch.full((m, m), 1 + 2.0**-12)  # not representable in TF32: rounds to 1
    b = torch.eye(m)
    c = torch.zeros(m, m)
    for names in ((), ("bf16_dot",)):  # the bfloat16 dot workaround leaves a float32 dot as it is
        c.zero_()
        with with_only(names):
            dot16[(1,)](a, b, c, M=m)
        assert torch.equal(c, a)
    with interpreter_workarounds((), tf32=True):
        dot16[(1,)](a, b, c, M=m)
    assert torch.equal(c, torch.ones(m, m))
