"""``gma-ref check``: run the conformance harness on an implementation from the shell.

::

    gma-ref check package.module:function --variant causal --dtype float32 [--device cuda] [--grad]
                  [--mode layer] [--cases N] [--seed S] [--long | --scaling] [--json] [--verbose] [--timeout S]
                  [--traceback] [--repro DIR | --no-repro] [--case-file FILE]
                  [--eps E] [--eps-sigma E] [--n-multiple M] [--n-max M] [--k-multiple M] [--k-max M]
                  [--d-multiple M] [--d-max M]

``package.module:function`` is imported; a callable attribute that is a class
is instantiated without arguments. Its ``gma_declaration`` (a
:class:`gma_ref.testing.Declaration`) says what it supports; its ``gma_vjp``
(or the PyTorch / JAX adapter, by the declared namespace) gives gradients.
``--mode layer`` checks a multi-head layer ``impl(x, y, w_q, w_k, w_v, w_o, means,
omega, prior_logits, *, causal, eps, eps_sigma)`` (``y = None`` for self-attention)
on the layer cases; an implementation that declares ``mode="layer"`` is checked
in layer mode without the flag.
On failure each failing case (up to three) is shrunk while it still fails and
written as a reproducer to ``--repro DIR`` (default ``gma-ref-repro``; ``--no-repro``
to skip): ``DIR/<case>.npz`` with the inputs and the declaration, and the one-line
command ``gma-ref check package.module:function --case-file DIR/<case>.npz`` that
re-runs just that case.

Exit status: 0 all checks passed; 1 a mismatch, a timeout, or nothing could be
checked; 2 everything checked passed but something explicitly requested was
skipped (not declared); 3 the implementation could not be loaded (or the case
file not read); 4 a usage error (bad option or value).

Standalone: ``python -m gma_ref.check_cli package.module:function ...``.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import sys
from typing import Any

__all__ = ["EXIT_USAGE", "add_check_parser", "run_check", "load_implementation", "main"]

#: Exit status of a usage error (argparse's own 2 would collide with "passed, but a request was skipped").
EXIT_USAGE = 4
#: Exit status when the implementation (or the case file) cannot be loaded.
EXIT_LOAD = 3


def _usage_error(parser: argparse.ArgumentParser, message: str) -> None:
    parser.print_usage(sys.stderr)
    parser.exit(EXIT_USAGE, f"{parser.prog}: error: {message}\n")


def _exit_on_usage_error(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Make ``parser`` (and its subcommand parsers) exit with :data:`EXIT_USAGE` on a usage error."""
    parser.error = lambda message: _usage_error(parser, message)  # type: ignore[method-assign]
    return parser


def _configure(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("target", help="the implementation, as package.module:function (or :Class, instantiated)")
    p.add_argument("--variant", action="append", choices=("bidirectional", "causal", "cross"),
                   help="variant to check (repeatable); default: bidirectional, causal and cross")
    p.add_argument("--dtype", choices=("float64", "float32", "float16", "bfloat16"),
                   help="dtype under test; default: the first declared")
    p.add_argument("--device", choices=("cpu", "cuda"), help="device; default: the first declared")
    p.add_argument("--mode", choices=("attention", "layer"),
                   help="attention: impl(q, k, v, means, omega, prior_logits, ...); layer: the multi-head layer "
                        "impl(x, y, w_q, w_k, w_v, w_o, means, omega, prior_logits, ...); default: the declared mode")
    p.add_argument("--grad", action="store_true", default=None, help="check all gradients (needs a VJP)")
    p.add_argument("--no-grad", dest="grad", action="store_false", help="forward only")
    p.add_argument("--cases", type=_nonnegative_int, default=0, metavar="N",
                   help="add N seeded random cases to the default set (29 attention cases, 25 layer cases)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the case generator")
    p.add_argument("--long", action="store_true",
                   help="long-sequence mode: N = 4096, 32768, 131072 (up to --n-max), O(N)-memory reference")
    p.add_argument("--scaling", action="store_true",
                   help="complexity check: peak memory and time against N (1024 ... 65536, up to --n-max) and the "
                        "width K = d_v, each size in a child process; super-linear memory fails")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--verbose", "-v", action="store_true", help="print every check, not only failures")
    p.add_argument("--no-contract", dest="contract", action="store_false",
                   help="skip the determinism and non-contiguous-input checks")
    p.add_argument("--timeout", type=_nonnegative_float, default=300.0, metavar="S",
                   help="seconds one case may take before it fails and the run stops (default 300; 0: no limit)")
    p.add_argument("--traceback", action="store_true", help="print the whole traceback of a failing call")
    p.add_argument("--repro", metavar="DIR", default="gma-ref-repro",
                   help="where minimal reproducers of failing cases are written (default: gma-ref-repro)")
    p.add_argument("--no-repro", dest="repro", action="store_const", const=None,
                   help="do not shrink failing cases or write reproducers")
    p.add_argument("--case-file", metavar="FILE", help="run exactly the case of a reproducer (.npz)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress line on stderr")
    c = p.add_argument_group("declared constraints", "override the implementation's Declaration: the harness "
                             "generates cases that satisfy them (docs/oracle.md)")
    c.add_argument("--eps", type=_positive_float, metavar="E", help="the kernel's fixed read stabiliser epsilon")
    c.add_argument("--eps-sigma", type=_positive_float, metavar="E", help="the kernel's fixed variance floor")
    for what, desc in (("n", "sequence lengths N_q, N_k"), ("k", "component counts K"),
                       ("d", "dimensions d_r, d_v")):
        c.add_argument(f"--{what}-multiple", type=_positive_int, metavar="M", help=f"{desc} must be multiples of M")
        c.add_argument(f"--{what}-max", type=_positive_int, metavar="M", help=f"largest admissible {desc}")
    return p


_CONSTRAINTS = ("eps", "eps_sigma", "n_multiple", "n_max", "k_multiple", "k_max", "d_multiple", "d_max")


def _nonnegative_int(text: str) -> int:
    try:
        val = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if val < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {val}")
    return val


def _nonnegative_float(text: str) -> float:
    try:
        val = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not (val >= 0 and val < float("inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return val


def _positive_int(text: str) -> int:
    try:
        val = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if val < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {val}")
    return val


def _positive_float(text: str) -> float:
    try:
        val = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not (val > 0 and val < float("inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return val


def add_check_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``check`` subcommand to an ``argparse`` subparsers object; returns its parser."""
    p = subparsers.add_parser("check", help="check a GMA implementation against the reference",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _exit_on_usage_error(_configure(p))
    p.set_defaults(func=run_check)
    return p


def load_implementation(target: str) -> Any:
    """Import ``package.module:attr`` (the current directory is importable); instantiate a class."""
    if ":" not in target:
        raise ValueError(f"target must look like package.module:function, got {target!r}")
    mod_name, attr = target.split(":", 1)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    obj: Any = importlib.import_module(mod_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if inspect.isclass(obj):
        obj = obj()
    if not callable(obj):
        raise TypeError(f"{target} is not callable")
    return obj


def _load_failure(args: argparse.Namespace, what: str, exc: BaseException) -> int:
    message = f"{what}: {type(exc).__name__}: {exc}"
    if getattr(args, "traceback", False):
        import traceback

        message += "\n" + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
    print(f"gma-ref check: {message}", file=sys.stderr)
    if getattr(args, "json", False):
        import json

        print(json.dumps({"implementation": args.target, "passed": False, "exit_code": EXIT_LOAD, "error": message,
                          "results": [], "skipped": [], "cases": []}, indent=1))
    return EXIT_LOAD


def run_check(args: argparse.Namespace) -> int:
    """Run the harness for parsed ``args``; print the report; return the exit status."""
    from .testing import check

    try:
        impl = load_implementation(args.target)
    except Exception as exc:
        return _load_failure(args, f"cannot load {args.target}", exc)
    if getattr(args, "case_file", None):
        from .testing.repro import load_case_file

        try:
            load_case_file(args.case_file)
        except Exception as exc:
            return _load_failure(args, f"cannot read the case file {args.case_file}", exc)
    from dataclasses import replace

    from .testing import Declaration
    from .testing.adapters import declaration_of

    declaration = None
    overrides = {k: getattr(args, k) for k in _CONSTRAINTS if getattr(args, k, None) is not None}
    try:
        if overrides:
            declaration = replace(declaration_of(impl) or Declaration(), **overrides)
        report = check(
            impl, declaration, variants=tuple(args.variant) if args.variant else None, dtype=args.dtype,
            device=args.device, grad=args.grad, n_cases=args.cases, seed=args.seed,
            contract=getattr(args, "contract", True), name=args.target, mode=getattr(args, "mode", None),
            timeout=getattr(args, "timeout", 0.0) or None, full_traceback=getattr(args, "traceback", False),
            repro=getattr(args, "repro", None), case_file=getattr(args, "case_file", None),
            progress=None if getattr(args, "quiet", False) else _Progress(),
            scale="scaling" if getattr(args, "scaling", False) else "long" if getattr(args, "long", False) else "short")
    except (TypeError, ValueError) as exc:
        print(f"gma-ref check: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(report.to_json() if args.json else report.format(verbose=args.verbose or getattr(args, "scaling", False)))
    return report.exit_code


class _Progress:
    """A progress line on stderr, once a run has taken more than a few seconds (at most one line a second)."""

    def __init__(self, after_s: float = 3.0) -> None:
        self.after_s, self.last = after_s, -1.0

    def __call__(self, done: int, total: int, case_id: str, elapsed: float) -> None:
        if elapsed < self.after_s or (elapsed - self.last < 1.0 and done < total):
            return
        self.last = elapsed
        print(f"gma-ref check: {done}/{total} cases, {elapsed:.0f} s ({case_id})", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point: ``python -m gma_ref.check_cli TARGET [options]``."""
    parser = _exit_on_usage_error(_configure(argparse.ArgumentParser(
        prog="gma-ref check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)))
    return run_check(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
