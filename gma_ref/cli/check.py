"""``gma-ref check``: run the oracle on an implementation from the shell.

::

    gma-ref check package.module:function --variant causal --dtype float32 [--device cuda] [--grad]
                  [--mode layer] [--cases N] [--seed S] [--long | --scaling] [--json] [--verbose] [--timeout S]
                  [--keep-going] [--budget SECONDS] [--html FILE]
                  [--traceback] [--repro DIR | --no-repro] [--case-file FILE] [--explore SECONDS]
                  [--eps E] [--eps-sigma E] [--n-multiple M] [--n-max M] [--k-multiple M] [--k-max M]
                  [--d-multiple M] [--d-max M] [--tied-head-width]

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
Without ``--dtype`` every declared dtype is checked, each with its own summary line.
``--explore SECONDS`` then searches beyond the case set for that long (deterministic under
``--seed``); a failure it finds is shrunk and written to the same directory as a case file and a
ready-to-paste pytest test.

Exit status: 0 all checks passed; 1 a mismatch, a timeout, a failure of any kind
of the implementation (it raised, exited, ran out of memory, returned the wrong
thing), or nothing could be checked; 2 everything checked passed but something
explicitly requested was skipped (not declared); 3 the implementation could not
be loaded (or the case file not read); 4 a usage error (bad option or value, an
unwritable --repro DIR); 130 interrupted (Ctrl-C) and 143 terminated (SIGTERM), each after the
partial report.

The implementation runs in a worker process (``--in-process`` to debug it in this one): what
it does there — exit, crash, hang, print, patch the oracle's modules — cannot change the
verdict. A case whose worker dies is ``crashed`` (with the signal or status), one that overruns
``--timeout`` is ``timeout``; a fresh worker runs the next case. Two consecutive cases that end in
``timeout`` (or in the same crash) stop the run, with the cases after listed as not run and exit
status 1 (``--keep-going`` runs them all); ``--budget SECONDS`` bounds the whole run the same way.
Every status prints a report (with --json, one JSON object on stdout, and nothing
else there: what the implementation prints is captured into the report).

Standalone: ``python -m gma_ref.cli.check package.module:function ...``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

__all__ = ["EXIT_USAGE", "EXIT_LOAD", "EXIT_INTERRUPTED", "DEFAULT_REPRO", "add_check_parser", "run_check",
           "load_implementation", "main"]

#: Exit status of a usage error (argparse's own 2 would collide with "passed, but a request was skipped").
EXIT_USAGE = 4
#: Exit status when the implementation (or the case file) cannot be loaded.
EXIT_LOAD = 3
#: Exit status of a run stopped by Ctrl-C (the partial report is printed).
EXIT_INTERRUPTED = 130
#: Where reproducers go unless ``--repro DIR`` or ``--no-repro`` is given.
DEFAULT_REPRO = "gma-ref-repro"


def _plain_text(rst: str) -> str:
    """The module's reST docstring as plain text for ``--help``: no double backquotes, roles or ``::``."""
    import re

    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", rst)
    text = text.replace("``", "")
    return re.sub(r"(\S)::\n", r"\1:\n", text).replace("\n::\n", "\n")


def _usage_error(parser: argparse.ArgumentParser, message: str) -> None:
    parser.print_usage(sys.stderr)
    if getattr(parser, "json_errors", False):  # --json on the command line: the error is JSON too
        print(_error_json("", EXIT_USAGE, message))
    parser.exit(EXIT_USAGE, f"{parser.prog}: error: {message}\n")


def _error_json(target: str, status: int, message: str) -> str:
    """The JSON report of a run that checked nothing: ``exit_code`` and ``error``."""
    import json

    from ..testing.calling.capture import truncated

    return json.dumps({"implementation": target, "passed": False, "exit_code": status, "error": truncated(message),
                       "results": [], "skipped": [], "cases": [], "notes": []}, indent=1)


def _exit_on_usage_error(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Make ``parser`` (and its subcommand parsers) exit with :data:`EXIT_USAGE` on a usage error."""
    parser.error = lambda message: _usage_error(parser, message)  # type: ignore[method-assign]
    return parser


def _configure(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("target", help="the implementation, as package.module:function (or :Class, instantiated)")
    p.add_argument("--variant", action="append", choices=("bidirectional", "causal", "cross"),
                   help="variant to check (repeatable); default: bidirectional, causal and cross")
    p.add_argument("--dtype", choices=("float64", "float32", "float16", "bfloat16"),
                   help="dtype under test; default: every declared dtype, each with its own summary line")
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
    p.add_argument("--html", metavar="FILE", default=None,
                   help="also write the report as one self-contained HTML page (a heatmap of error / threshold per "
                        "case and tensor, the failing cases, what was not checked, the re-run commands)")
    p.add_argument("--verbose", "-v", action="store_true", help="print every check, not only failures")
    p.add_argument("--no-contract", dest="contract", action="store_false",
                   help="skip the determinism and non-contiguous-input checks")
    p.add_argument("--timeout", type=_nonnegative_float, default=300.0, metavar="S",
                   help="seconds one case may take before it fails and the run stops (default 300; 0: no limit)")
    p.add_argument("--keep-going", action="store_true",
                   help="run every case even after two consecutive cases ended in timeout or in the same crash "
                        "(default: the run stops there and lists the rest as not run)")
    p.add_argument("--budget", type=_positive_float, default=None, metavar="SECONDS",
                   help="seconds the whole run may take; the cases left when it is spent are listed as not run")
    p.add_argument("--traceback", action="store_true", help="print the whole traceback of a failing call")
    p.add_argument("--repro", metavar="DIR", default=None,
                   help=f"where minimal reproducers of failing cases are written (default: {DEFAULT_REPRO})")
    p.add_argument("--no-repro", dest="repro", action="store_const", const="",
                   help="do not shrink failing cases or write reproducers")
    p.add_argument("--case-file", metavar="FILE", help="run exactly the case of a reproducer (.npz)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress line on stderr")
    p.add_argument("--no-tiling", dest="tiling", action="store_false",
                   help="leave out the tiling cases (N, K, d_r, d_v straddling the usual tile sizes, up to 8 heads, "
                        "4 batch entries, eps_sigma up to 0.3): the 29 edge cases only")
    p.add_argument("--explore", type=_positive_float, default=None, metavar="SECONDS",
                   help="after the cases, search beyond them for SECONDS (hypothesis: shapes, regimes, the dtypes "
                        "checked; deterministic under --seed); a failure is shrunk and written to the --repro DIR as "
                        "a case file and a pytest test")
    p.add_argument("--in-process", action="store_true",
                   help="run the implementation in this process (for debugging: it can then affect the verdict); "
                        "default: in a worker process that cannot")
    p.add_argument("--import-timeout", type=_positive_float, default=None, metavar="S",
                   help="seconds the worker may take to import the implementation (default 120)")
    c = p.add_argument_group("declared constraints", "override the implementation's Declaration: the harness "
                             "generates cases that satisfy them (docs/oracle/calling-convention.md)")
    c.add_argument("--eps", type=_positive_float, metavar="E", help="the kernel's fixed read stabiliser epsilon")
    c.add_argument("--eps-sigma", type=_positive_float, metavar="E", help="the kernel's fixed variance floor")
    for what, desc in (("n", "sequence lengths N_q, N_k"), ("k", "component counts K"),
                       ("d", "dimensions d_r, d_v")):
        c.add_argument(f"--{what}-multiple", type=_positive_int, metavar="M", help=f"{desc} must be multiples of M")
        c.add_argument(f"--{what}-max", type=_positive_int, metavar="M", help=f"largest admissible {desc}")
    c.add_argument("--tied-head-width", action="store_true", default=None,
                   help="layer mode: the head width is tied, d_r = d_v = d_model / H")
    return p


_CONSTRAINTS = ("eps", "eps_sigma", "n_multiple", "n_max", "k_multiple", "k_max", "d_multiple", "d_max",
                "tied_head_width")


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
                              description=_plain_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    _exit_on_usage_error(_configure(p))
    p.set_defaults(func=run_check)
    return p


def load_implementation(target: str) -> Any:
    """Import ``package.module:attr`` in this process (the current directory is importable); instantiate a class.

    :func:`gma_ref.testing.calling.worker.load_implementation`, which the worker process uses too.
    """
    from ..testing.calling.worker import load_implementation as load

    return load(target)


class _Usage(ValueError):
    """A combination of options that cannot be run (exit status :data:`EXIT_USAGE`)."""


def _failure(args: argparse.Namespace, status: int, message: str, exc: BaseException | None = None) -> str | None:
    """Say why nothing was checked on stderr; the JSON report for stdout with ``--json`` (else ``None``)."""
    from ..testing.calling.capture import safe_text

    if exc is not None:
        message += f": {type(exc).__name__}: {safe_text(exc)}"
        if getattr(args, "traceback", False):
            import traceback

            message += "\n" + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
    print(f"gma-ref check: {'error: ' if status == EXIT_USAGE else ''}{message}", file=sys.stderr)
    return _error_json(args.target, status, message) if getattr(args, "json", False) else None


def _repro_dir(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """The reproducer directory, and a note when the default one cannot be written (then none).

    An explicit ``--repro DIR`` that cannot be written is a usage error (:class:`_Usage`).
    """
    from ..testing.harness.runner import check_writable_dir

    if args.repro == "" or getattr(args, "case_file", None):
        return None, None
    try:
        check_writable_dir(args.repro or DEFAULT_REPRO, "--repro")
    except ValueError as exc:
        if args.repro is not None:
            raise _Usage(str(exc)) from None
        return None, f"reproducers not written: {exc} (give --repro DIR)"
    return args.repro or DEFAULT_REPRO, None


def _declaration(args: argparse.Namespace, impl: Any) -> Any:
    """The implementation's declaration with the constraint options applied (``None``: none given)."""
    from dataclasses import replace

    from ..testing import Declaration
    from ..testing.calling.adapters import declaration_of

    overrides = {k: getattr(args, k) for k in _CONSTRAINTS if getattr(args, k, None) is not None}
    if overrides and getattr(args, "case_file", None):
        flags = ", ".join("--" + k.replace("_", "-") for k in overrides)
        raise _Usage(f"{flags} cannot be combined with --case-file: the case file fixes its case (its eps, "
                     "eps_sigma and sizes); run it without them, or run the default cases with them")
    return replace(declaration_of(impl) or Declaration(), **overrides) if overrides else None


def _run(args: argparse.Namespace) -> tuple[int, str | None]:
    """Check as ``args`` say; returns the exit status and what goes to stdout."""
    try:
        repro, note = _repro_dir(args)
    except _Usage as exc:
        return EXIT_USAGE, _failure(args, EXIT_USAGE, str(exc))
    from ..testing.calling.isolation import IMPORT_TIMEOUT_S, IsolatedCandidate, LoadError

    isolated = not getattr(args, "in_process", False) and not getattr(args, "scaling", False)
    try:
        if isolated:
            impl = IsolatedCandidate(args.target, import_timeout=getattr(args, "import_timeout", None)
                                     or IMPORT_TIMEOUT_S)
        else:
            impl = load_implementation(args.target)
    except LoadError as exc:
        return EXIT_LOAD, _failure(args, EXIT_LOAD, str(exc))
    except Exception as exc:
        return EXIT_LOAD, _failure(args, EXIT_LOAD, f"cannot load {args.target}", exc)
    try:
        return _run_loaded(args, impl, repro, note)
    finally:
        if isolated:
            impl.close()


def _run_loaded(args: argparse.Namespace, impl: Any, repro: str | None, note: str | None) -> tuple[int, str | None]:
    """Check the loaded implementation (or its worker) as ``args`` say; the exit status and what goes to stdout."""
    from ..testing import check
    from ..testing.harness.runner import Interrupted

    if getattr(args, "case_file", None):
        from ..testing.harness.repro import load_case_file

        try:
            load_case_file(args.case_file)
        except ValueError as exc:
            return EXIT_LOAD, _failure(args, EXIT_LOAD, f"cannot read the case file {args.case_file}", exc)
    try:
        cases, run = _case_set(args), _run_options(args)  # a bad value is a usage error, as check's own are
        report = check(
            impl, _declaration(args, impl), variants=tuple(args.variant) if args.variant else None,
            dtype=args.dtype, device=args.device, grad=args.grad, mode=getattr(args, "mode", None),
            cases=cases, contract=getattr(args, "contract", True), name=args.target, repro=repro, run=run)
    except Interrupted as exc:
        report = exc.report
    except (TypeError, ValueError) as exc:
        return EXIT_USAGE, _failure(args, EXIT_USAGE, str(exc))
    except ImportError as exc:  # --explore without hypothesis
        return EXIT_USAGE, _failure(args, EXIT_USAGE, str(exc))
    except Exception as exc:  # noqa: BLE001 - the harness itself failed: still a report, still JSON
        return 1, _failure(args, 1, "the harness failed", exc)
    if note:
        report.notes.append(note)
    _write_html(args, report)
    verbose = args.verbose or getattr(args, "scaling", False)  # a scaling report is its sweeps' tables
    return report.exit_code, report.to_json() if args.json else report.format(verbose=verbose)


def _case_set(args: argparse.Namespace) -> Any:
    """The :class:`~gma_ref.testing.CaseSet` of ``--cases``, ``--seed``, ``--no-tiling``, ``--long``/``--scaling``,
    ``--explore`` and ``--case-file``. Raises as ``CaseSet`` does for a bad value."""
    from ..testing import CaseSet

    scale = "scaling" if getattr(args, "scaling", False) else "long" if getattr(args, "long", False) else "short"
    return CaseSet(n_generated=args.cases, seed=args.seed, tiling=getattr(args, "tiling", True), scale=scale,
                   explore=getattr(args, "explore", None), file=getattr(args, "case_file", None))


def _run_options(args: argparse.Namespace) -> Any:
    """The :class:`~gma_ref.testing.RunOptions` of ``--in-process``, ``--timeout`` (0: none), ``--keep-going``,
    ``--budget``, ``--traceback`` and ``--quiet`` (no progress line). Raises as ``RunOptions`` does."""
    from ..testing import RunOptions

    return RunOptions(in_process=True if getattr(args, "in_process", False) else None,
                      timeout=getattr(args, "timeout", 0.0) or None, budget=getattr(args, "budget", None),
                      keep_going=getattr(args, "keep_going", False),
                      progress=None if getattr(args, "quiet", False) else _Progress(),
                      full_traceback=getattr(args, "traceback", False))


def _write_html(args: argparse.Namespace, report: Any) -> None:
    """``--html FILE``: write the report's page (a file that cannot be written is said on stderr and in the notes)."""
    path = getattr(args, "html", None)
    if not path:
        return
    try:
        report.write_html(path)
    except OSError as exc:
        report.notes.append(f"--html {path}: not written ({type(exc).__name__}: {exc})")
        print(f"gma-ref check: --html {path}: not written ({exc})", file=sys.stderr)


def run_check(args: argparse.Namespace) -> int:
    """Run the harness for parsed ``args``; print the report; return the exit status.

    While it runs, anything written to stdout (by the implementation, or by a call of
    it abandoned after a timeout) goes to stderr, so stdout carries the report alone.
    """
    with _ReportStream(keep=getattr(args, "exit_process", False)) as stream, _TerminateAsInterrupt():
        try:
            status, text = _run(args)
        except KeyboardInterrupt as exc:  # before the first case or after the last: nothing to report
            status = getattr(exc, "status", EXIT_INTERRUPTED)
            text = _failure(args, status, f"interrupted ({getattr(exc, 'reason', 'KeyboardInterrupt')}) "
                            "outside the cases: nothing was checked")
        if text is not None:
            stream.emit(text)
    return status


class _TerminateAsInterrupt:
    """While the check runs, SIGTERM stops it like Ctrl-C: a partial report and exit status 143."""

    def __enter__(self) -> _TerminateAsInterrupt:
        self.old = None
        try:
            self.old = signal.signal(signal.SIGTERM, self._raise)
        except ValueError:  # not the main thread: leave SIGTERM as it is
            self.old = None
        return self

    @staticmethod
    def _raise(signum: int, frame: Any) -> None:
        from ..testing.core.report import Terminated

        raise Terminated()

    def __exit__(self, *exc: object) -> None:
        if self.old is not None:
            signal.signal(signal.SIGTERM, self.old)


class _ReportStream:
    """Stdout reserved for the report: during the run file descriptor 1 and ``sys.stdout`` point at stderr.

    ``keep``: leave descriptor 1 on stderr afterwards (the process is about to end by
    ``os._exit``, and an abandoned thread must not write after the report).
    """

    def __init__(self, keep: bool = False) -> None:
        self.keep, self.fd = keep, None

    def __enter__(self) -> _ReportStream:
        self.py = sys.stdout
        try:
            self.py.flush()
            if self.py.fileno() == 1:  # the process's stdout (not a test's capture)
                self.fd = os.dup(1)
                os.dup2(2, 1)
        except (AttributeError, OSError, ValueError):
            self.fd = None
        sys.stdout = sys.stderr
        return self

    def emit(self, text: str) -> None:
        data = (text + "\n").encode("utf-8", errors="replace")
        if self.fd is None:
            self.py.write(text + "\n")
            self.py.flush()
            return
        while data:
            data = data[os.write(self.fd, data):]

    def __exit__(self, *exc: object) -> None:
        sys.stdout = self.py
        if self.fd is not None and not self.keep:
            sys.stderr.flush()
            os.dup2(self.fd, 1)
            os.close(self.fd)


class _Progress:
    """A progress line on stderr, once a run has taken more than a few seconds (at most one line a second)."""

    def __init__(self, after_s: float = 3.0) -> None:
        self.after_s, self.last = after_s, -1.0

    def __call__(self, done: int, total: int, case_id: str, elapsed: float) -> None:
        if elapsed < self.after_s or (elapsed - self.last < 1.0 and done < total):
            return
        self.last = elapsed
        print(f"gma-ref check: {done}/{total} cases, {elapsed:.0f} s ({case_id})", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None, *, exit_process: bool | None = None) -> int:
    """Standalone entry point: ``python -m gma_ref.cli.check TARGET [options]``; returns the exit status.

    ``exit_process`` (default: when ``argv`` is ``None``, i.e. run as a program) ends
    the process with ``os._exit`` right after the report is written, so a call of the
    implementation abandoned after a timeout (or a library's thread it left running)
    cannot crash the interpreter's shutdown and change the exit status.
    """
    argv_list = sys.argv[1:] if argv is None else list(argv)
    parser = _exit_on_usage_error(_configure(argparse.ArgumentParser(
        prog="gma-ref check", description=_plain_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)))
    parser.json_errors = "--json" in argv_list  # type: ignore[attr-defined]
    args = parser.parse_args(argv_list)
    args.exit_process = argv is None if exit_process is None else exit_process
    status = run_check(args)
    if args.exit_process:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(status)
    return status


if __name__ == "__main__":
    sys.exit(main())
