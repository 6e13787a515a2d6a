"""``gma-ref check``: run the conformance harness on an implementation from the shell.

::

    gma-ref check package.module:function --variant causal --dtype float32 [--device cuda] [--grad]
                  [--mode layer] [--cases N] [--seed S] [--json] [--verbose]

``package.module:function`` is imported; a callable attribute that is a class
is instantiated without arguments. Its ``gma_declaration`` (a
:class:`gma_ref.testing.Declaration`) says what it supports; its ``gma_vjp``
(or the PyTorch / JAX adapter, by the declared namespace) gives gradients.
``--mode layer`` checks a multi-head layer ``impl(x, y, w_q, w_k, w_v, w_o, means,
omega, prior_logits, *, causal, eps, eps_sigma)`` (``y = None`` for self-attention)
on the layer cases; an implementation that declares ``mode="layer"`` is checked
in layer mode without the flag.
Exit status: 0 all checks passed; 1 a mismatch (or nothing could be checked);
2 everything checked passed but something explicitly requested was skipped
(not declared); 3 the implementation could not be loaded.

Standalone: ``python -m gma_ref.check_cli package.module:function ...``.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import sys
from typing import Any

__all__ = ["add_check_parser", "run_check", "load_implementation", "main"]


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
    p.add_argument("--cases", type=int, default=0, metavar="N",
                   help="add N seeded random cases to the default set (25 cases in either mode)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the case generator")
    p.add_argument("--long", action="store_true",
                   help="long-sequence mode: N = 4096, 32768, 131072 (up to --n-max), O(N)-memory reference")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--verbose", "-v", action="store_true", help="print every check, not only failures")
    p.add_argument("--no-contract", dest="contract", action="store_false",
                   help="skip the determinism and non-contiguous-input checks")
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
    _configure(p)
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


def run_check(args: argparse.Namespace) -> int:
    """Run the harness for parsed ``args``; print the report; return the exit status."""
    from .testing import check

    try:
        impl = load_implementation(args.target)
    except Exception as exc:
        print(f"gma-ref check: cannot load {args.target}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 3
    from dataclasses import replace

    from .testing import Declaration
    from .testing.adapters import declaration_of

    declaration = None
    overrides = {k: getattr(args, k) for k in _CONSTRAINTS if getattr(args, k, None) is not None}
    if overrides:
        declaration = replace(declaration_of(impl) or Declaration(), **overrides)
    report = check(impl, declaration, variants=tuple(args.variant) if args.variant else None, dtype=args.dtype,
                   device=args.device, grad=args.grad, n_cases=args.cases, seed=args.seed,
                   contract=getattr(args, "contract", True), name=args.target, mode=getattr(args, "mode", None),
                   scale="long" if getattr(args, "long", False) else "short")
    print(report.to_json() if args.json else report.format(verbose=args.verbose))
    return report.exit_code


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point: ``python -m gma_ref.check_cli TARGET [options]``."""
    parser = _configure(argparse.ArgumentParser(prog="gma-ref check", description=__doc__,
                                                formatter_class=argparse.RawDescriptionHelpFormatter))
    return run_check(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
