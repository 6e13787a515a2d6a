"""Command line: ``gma-ref verify | derive | coverage | bench | check``.

* ``gma-ref verify [--namespace NS] [--dtype DT] [--seed S] [--kind forward|gradient]``:
  the equation-by-equation verification report; exits 1 on any failure.
* ``gma-ref derive [NAME]``: print the sympy derivations (all, or one).
* ``gma-ref coverage [--write PATH]``: the equation-coverage table from the registry.
* ``gma-ref bench [--quick | --end-to-end ...]``: time and memory versus N for every form.
* ``gma-ref check module:function ...``: check an implementation against the reference.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__
    from ..verification.registry import NAMESPACES

    parser = argparse.ArgumentParser(prog="gma-ref", description="Gaussian Mixture Attention reference")
    parser.add_argument("--version", action="version", version=f"gma-ref {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("verify", help="run every equation check and print the report")
    p.add_argument("--namespace", default="numpy", choices=sorted(NAMESPACES))
    p.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kind", choices=["forward", "gradient", "all"], default="all")

    p = sub.add_parser("derive", help="print the sympy derivations")
    p.add_argument("name", nargs="?", help="one derivation (default: all)")

    p = sub.add_parser("coverage", help="print (or write) the equation coverage table")
    p.add_argument("--write", metavar="PATH", help="write the table to PATH instead of printing it")

    p = sub.add_parser("bench", help="time and peak memory versus N for each form")
    from ..bench import add_arguments

    add_arguments(p)

    try:
        from .check import add_check_parser
    except ModuleNotFoundError as exc:
        if exc.name != "gma_ref.cli.check":
            raise
    else:
        add_check_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``gma-ref`` command; returns its exit status.

    A reader that stops early (``gma-ref derive | head``) ends the command quietly with status 0:
    stdout then points at the null device, so the interpreter's final flush cannot fail either.
    """
    try:
        return _command(argv)
    except BrokenPipeError:
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 0


def _command(argv: Sequence[str] | None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) and run the command it names."""
    words = sys.argv[1:] if argv is None else list(argv)
    if words[:1] == ["check"]:  # its own parser: usage errors exit 4, JSON errors with --json
        from .check import main as check_main

        return check_main(words[1:], exit_process=argv is None)
    args = build_parser().parse_args(argv)
    if args.command == "verify":
        from ..verification.report import verify

        kinds = ("forward", "gradient") if args.kind == "all" else (args.kind,)
        try:
            return verify(args.namespace, args.dtype, args.seed, kinds=kinds)
        except RuntimeError as exc:
            print(f"gma-ref verify: {exc}", file=sys.stderr)
            return 2
    if args.command == "derive":
        from derivations import DERIVATIONS, print_derivation

        names = [args.name] if args.name else list(DERIVATIONS)
        unknown = [n for n in names if n not in DERIVATIONS]
        if unknown:
            print(f"gma-ref derive: unknown derivation {unknown[0]!r}; choose from {sorted(DERIVATIONS)}",
                  file=sys.stderr)
            return 2
        ok = all([print_derivation(n) for n in names])
        return 0 if ok else 1
    if args.command == "coverage":
        from ..verification.registry import coverage_markdown

        text = coverage_markdown()
        if args.write:
            with open(args.write, "w", encoding="utf-8") as fh:
                fh.write(text)
        else:
            print(text, end="")
        return 0
    if args.command == "bench":
        from ..bench import run_from_args

        result = run_from_args(args)
        return 0 if result is not None else 1
    if args.command == "check":
        from .check import run_check

        return run_check(args)
    raise AssertionError(args.command)  # argparse enforces the choices

