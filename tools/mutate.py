#!/usr/bin/env python3
"""Mutation testing for gma-ref: do the tests notice when the code is wrong?

For one module of ``gma_ref`` this script generates *mutants* (copies of the module with
one small change each: an operator swapped, a constant changed, a check removed, ...),
runs the module's test files against each mutant and reports the mutants no test fails
on (the *survivors*). A survivor is either a missing test or an *equivalent* mutant (a
change that cannot alter any result); equivalents are listed, one reason each, in
``tools/mutation-equivalents.txt``. The score is killed / (total − equivalents).

Usage (from the repository root, with the test dependencies installed)::

    python tools/mutate.py gma_ref/mixture.py                 # default test files
    python tools/mutate.py gma_ref/induced.py --tests tests/bidirectional/test_equations.py
    python tools/mutate.py gma_ref/causal.py --list           # list the mutants, run nothing
    python tools/mutate.py gma_ref/causal.py --match read_weights   # only mutants whose key matches
    python tools/mutate.py --write-table                      # the table of docs/contributing.md
    python tools/mutate.py --status                           # modules to rerun: changed or never run in full

The working tree is never modified: the mutant is served to the test process by an
import hook (``sys.meta_path``) in a forked child, so the source file on disk stays as it
is. First one traced run of the unmutated module records which lines each test executes;
each mutant then runs only the tests that execute its line(s) (all the files when the line
runs at import time, e.g. a default argument; none when no test runs it — a survivor), with
``pytest -x -q -p no:cacheprovider`` and the ``ci`` hypothesis profile, under a per-mutant
timeout (a mutant that hangs counts as killed). ``--all-tests`` runs every file instead. Heavy imports (NumPy,
SciPy, SymPy, hypothesis, pytest) happen once in the parent before forking, so a mutant
costs only the time of its tests. POSIX only (``os.fork``).

Mutant keys are stable under line shifts: ``module | function | mutation #n | line text``
where ``#n`` counts equal mutations of equal line text in the same function.

A run of every mutant of a module against its default test files (no ``--match``, no
``--tests``) records its counts and the SHA-256 of the module's source in
``tools/mutation-results.json``; ``--write-table`` writes the table of those results into
``docs/contributing.md`` between its two ``mutation-table`` marker comments, and ``--status``
names the modules whose source has changed since their recorded run and those never run in full.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.abc
import importlib.util
import io
import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENTS = ROOT / "tools" / "mutation-equivalents.txt"
RESULTS = ROOT / "tools" / "mutation-results.json"
CONTRIBUTING = ROOT / "docs" / "contributing.md"
TABLE_START = "<!-- mutation-table: written by python tools/mutate.py --write-table -->"
TABLE_END = "<!-- /mutation-table -->"

#: The tests of the scores and responsibilities: both the direct form (posterior) and the fast path
#: (scores_fast) answer to them.
_SCORES_TESTS: list[str] = [
    "tests/posterior/test_equations.py",
    "tests/posterior/test_scores_cotangent.py",
    "tests/posterior/test_overflow.py",
    "tests/posterior/test_contract.py",
    "tests/fast/test_guard.py",
    "tests/fast/test_token_blocks.py",
    "tests/posterior/test_backward_checks.py",
    "tests/across_modules/test_adversarial_inputs.py",
    "tests/across_modules/test_backward_convention.py",
    "tests/attention/test_saved.py",
    "tests/across_modules/test_bad_input.py",
    "tests/across_modules/test_gradients.py",
    "tests/verification/test_checks_sympy.py",
    "tests/across_modules/test_gradient_identities.py",
    "tests/posterior/test_accuracy.py",
    "tests/fast/test_overflow_guard.py",
    "tests/across_modules/test_exact_arithmetic.py",
]

#: Test files run against each module's mutants, fastest and most targeted first (``-x`` stops
#: at the first failure, so a killed mutant usually costs only the first file or two).
MODULE_TESTS: dict[str, list[str]] = {
    "gma_ref/testing/cases/tails.py": ["tests/testing/cases/test_tails.py",
                                       "tests/testing/cases/test_case_generation.py"],
    "gma_ref/testing/cases/power.py": ["tests/testing/cases/test_power.py"],
    "gma_ref/testing/harness/options.py": ["tests/testing/harness/test_options.py"],
    # The worker process imports gma_ref from disk, so the mutants of buffers.py reach the oracle's side
    # (decode, to_float64) and these in-process tests of extract; worker.py is exercised by test_isolation.py only.
    "gma_ref/testing/calling/buffers.py": ["tests/testing/calling/test_buffers.py",
                                           "tests/testing/calling/test_wire.py"],
    "gma_ref/testing/calling/wire.py": ["tests/testing/calling/test_wire.py"],
    # Each reply of the worker on its own (canned replies, no process; seconds) first, then the whole runs
    # against hostile kernels (a minute).
    "gma_ref/testing/calling/isolation.py": ["tests/testing/calling/test_isolation_protocol.py",
                                             "tests/testing/calling/test_isolation.py"],
    "gma_ref/mixture.py": [
        "tests/mixture/test_equations.py",
        "tests/mixture/test_contract.py",
        "tests/mixture/test_backward_checks.py",
        "tests/across_modules/test_bad_input.py",
        "tests/across_modules/test_gradients.py",
    ],
    "gma_ref/induced.py": [
        "tests/induced/test_denominators.py",
        "tests/induced/test_materialized_checks.py",
        "tests/across_modules/test_values_near_float_max.py",
        "tests/bidirectional/test_equations.py",
        "tests/causal/test_equations.py",
        "tests/across_modules/test_bad_input.py",
        "tests/across_modules/test_gradients.py",
        "tests/across_modules/test_gradient_identities.py",
        "tests/across_modules/test_exact_arithmetic.py",
    ],
    "gma_ref/posterior.py": _SCORES_TESTS,
    # the fast path is tested where the direct form is, and its blocks on their own
    "gma_ref/fast/matmul_scores.py": [*_SCORES_TESTS, "tests/fast/test_blocked_path.py",
                               "tests/fast/test_fused_backward.py"],
    "gma_ref/fast/blocks.py": ["tests/fast/test_block_time.py", "tests/fast/test_blocked_path.py",
                           "tests/fast/test_token_blocks.py", "tests/fast/test_relay.py",
                           "tests/fast/test_allocator.py"],
    # the benchmark's rows and columns (tiny sizes, one repeat: about 15 s for both files)
    "gma_ref/bench/end_to_end.py": ["tests/bench/test_threads.py", "tests/bench/test_cli_output.py"],
    "gma_ref/fast/causal_batched.py": ["tests/fast/test_causal_batched.py", "tests/fast/test_entry.py",
                                   "tests/fast/test_prechecks.py"],
    "gma_ref/fast/latent.py": ["tests/fast/test_latent.py", "tests/fast/test_fused_backward.py",
                                "tests/attention/test_saved.py", "tests/fast/test_entry.py",
                                "tests/fast/test_prechecks.py", "tests/fast/test_overflow_guard.py"],
    "gma_ref/fast/prechecks.py": ["tests/fast/test_prechecks.py", "tests/attention/test_saved.py"],
    # the shared checks: their own tests first, then the entry points' refusals of bad input through them, and the
    # memory budget's figures
    "gma_ref/_array.py": ["tests/across_modules/test_array_helpers.py", "tests/across_modules/test_bad_input.py",
                          "tests/attention/test_saved.py", "tests/across_modules/test_memory_peaks.py"],
    "gma_ref/bidirectional.py": [
        "tests/bidirectional/test_equations.py",
        "tests/bidirectional/test_routing_input_checks.py",
        "tests/bidirectional/test_read_write_broadcasting.py",
        "tests/bidirectional/test_saved_output_scale.py",
        "tests/bidirectional/test_backward_checks.py",
        "tests/across_modules/test_empty_and_batched.py",
        "tests/across_modules/test_values_near_float_max.py",
        "tests/induced/test_denominators.py",
        "tests/across_modules/test_bad_input.py",
        "tests/bidirectional/test_saved_output.py",
        "tests/across_modules/test_gradients.py",
        "tests/across_modules/test_gradient_identities.py",
        "tests/across_modules/test_exact_arithmetic.py",
    ],
    "gma_ref/causal.py": [
        "tests/causal/test_checks.py",
        "tests/causal/test_device.py",
        "tests/causal/test_continuation.py",
        "tests/causal/test_equations.py",
        "tests/causal/test_state.py",
        "tests/causal/test_guards.py",
        "tests/causal/test_state_checks.py",
        "tests/across_modules/test_backward_convention.py",
        "tests/bidirectional/test_routing_input_checks.py",
        "tests/across_modules/test_empty_and_batched.py",
        "tests/across_modules/test_values_near_float_max.py",
        "tests/across_modules/test_bad_input.py",
        "tests/bidirectional/test_saved_output.py",
        "tests/across_modules/test_gradients.py",
        "tests/across_modules/test_gradient_identities.py",
        "tests/across_modules/test_exact_arithmetic.py",
    ],
    "gma_ref/attention.py": [
        "tests/attention/test_composition.py",
        "tests/attention/test_saved.py",
        "tests/fast/test_agreement.py",
        "tests/across_modules/test_bad_input.py",
        "tests/across_modules/test_empty_and_batched.py",
        "tests/across_modules/test_gradients.py",
        "tests/across_modules/test_adversarial_inputs.py",
        "tests/across_modules/test_exact_arithmetic.py",
    ],
    "gma_ref/layer.py": [
        "tests/layer/test_gates.py",
        "tests/layer/test_equations.py",
        "tests/layer/test_contract.py",
        "tests/layer/test_backward_checks.py",
        "tests/across_modules/test_bad_input.py",
        "tests/across_modules/test_gradients.py",
        "tests/bidirectional/test_saved_output.py",
        "tests/across_modules/test_exact_arithmetic.py",
        "tests/costs/test_gates.py",
    ],
    "gma_ref/geometry.py": ["tests/geometry/test_convex_hull.py"],
    "gma_ref/depth.py": ["tests/depth/test_rank_collapse.py"],
    "gma_ref/testing/core/compare.py": [
        "tests/testing/core/test_compare.py",
    ],
    "gma_ref/testing/core/reference.py": [
        "tests/testing/core/test_reference.py",
    ],
    # Its first tests take one small float64 case each (no worker process): seconds per mutant; the contract
    # tests through check() after them run only for the mutants they reach.
    "gma_ref/testing/core/case_runner.py": ["tests/testing/core/test_case_runner.py"],
    # The generated data's properties and the pinned case sets first (a few seconds for the whole file), then the
    # case set's other tests; the tiling file also runs the harness over a few tiling cases.
    "gma_ref/testing/cases/sets.py": ["tests/testing/cases/test_case_generation.py",
                                      "tests/testing/cases/test_cases.py",
                                      "tests/testing/cases/test_tiling_cases.py"],
    # check() in process on small explicit case lists first, then the plan, the other entries (case files,
    # targets) and the worker's side; the default and 200-case runs (seconds each) last.
    "gma_ref/testing/harness/runner.py": ["tests/testing/harness/test_runner.py",
                                          "tests/testing/harness/test_runner_plan.py",
                                          "tests/testing/harness/test_runner_entry.py",
                                          "tests/testing/harness/test_runner_isolated.py",
                                          "tests/testing/harness/test_runner_full.py"],
}

#: Decorators/functions whose bodies are not mutated (pure formatting of messages, reprs).
SKIP_FUNCTIONS = {"__repr__", "__str__"}


# --------------------------------------------------------------------------- mutants


@dataclass
class Mutant:
    key: str
    lineno: int
    description: str
    source: str
    end_lineno: int = 0


_BINOP_SWAPS: dict[type, type] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div,
    ast.Pow: ast.Mult,
    ast.Mod: ast.Mult,
    ast.BitAnd: ast.BitOr,
    ast.BitOr: ast.BitAnd,
}
_CMP_SWAPS: dict[type, list[type]] = {
    ast.Lt: [ast.LtE, ast.Gt],
    ast.LtE: [ast.Lt, ast.Gt],
    ast.Gt: [ast.GtE, ast.Lt],
    ast.GtE: [ast.Gt, ast.Lt],
    ast.Eq: [ast.NotEq],
    ast.NotEq: [ast.Eq],
    ast.Is: [ast.IsNot],
    ast.IsNot: [ast.Is],
    ast.In: [ast.NotIn],
    ast.NotIn: [ast.In],
}


def _name(op: ast.AST) -> str:
    return type(op).__name__


def _constant_variants(value: object) -> list[object]:
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [1] if value == 0 else ([0] if value == 1 else [value + 1])
    if isinstance(value, float):
        if value == 0.0:
            return [1.0]
        if value == 1.0:
            return [0.0]
        return [value * 2.0]
    if value is None:
        return []
    return []


class _Site:
    """One place in the tree and one way to change it (apply returns an undo)."""

    def __init__(self, node: ast.AST, description: str, apply: Callable[[], Callable[[], None]]):
        self.node = node
        self.description = description
        self.apply = apply


def _set_attr(obj: object, attr: str, value: object) -> Callable[[], Callable[[], None]]:
    def apply() -> Callable[[], None]:
        old = getattr(obj, attr)
        setattr(obj, attr, value)
        return lambda: setattr(obj, attr, old)

    return apply


def _set_item(seq: list, index: int, value: object) -> Callable[[], Callable[[], None]]:
    def apply() -> Callable[[], None]:
        old = seq[index]
        seq[index] = value
        return lambda: seq.__setitem__(index, old)

    return apply


def _del_item(seq: list, index: int) -> Callable[[], Callable[[], None]]:
    def apply() -> Callable[[], None]:
        old = seq.pop(index)
        return lambda: seq.insert(index, old)

    return apply


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _sites(tree: ast.Module) -> Iterator[tuple[str, _Site]]:
    """Yield (enclosing function qualname, site) in a deterministic order."""

    def visit(node: ast.AST, func: str) -> Iterator[tuple[str, _Site]]:
        # Not mutated: imports, __all__, annotations, f-strings and other strings, docstrings.
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.JoinedStr)):
            return
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name in SKIP_FUNCTIONS:
                return
            func = f"{func}.{node.name}" if func else node.name
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for default in [*node.args.defaults, *[d for d in node.args.kw_defaults if d is not None]]:
                    yield from visit(default, func)
            else:
                for base in node.bases:
                    yield from visit(base, func)
            yield from _body_sites(node, "body", func)
            return
        if isinstance(node, ast.AnnAssign):
            if node.value is not None:
                yield from visit(node.value, func)
            return
        if isinstance(node, ast.arguments):
            return

        yield from _node_sites(node, func)
        for field, value in ast.iter_fields(node):
            if isinstance(value, list):
                if value and isinstance(value[0], ast.stmt):
                    yield from _body_sites(node, field, func)
                else:
                    for item in value:
                        if isinstance(item, ast.AST):
                            yield from visit(item, func)
            elif isinstance(value, ast.AST):
                yield from visit(value, func)

    def _body_sites(node: ast.AST, field: str, func: str) -> Iterator[tuple[str, _Site]]:
        body = getattr(node, field)
        for i, stmt in enumerate(list(body)):
            if _is_docstring(stmt):
                continue
            # Statement deletion: raises, bare calls (checks), augmented assignments, continue/break.
            # (An ``if`` whose only content is a ``raise`` is covered by removing the ``raise``.)
            lone_raise = isinstance(stmt, ast.If) and not stmt.orelse and [type(s) for s in stmt.body] == [ast.Raise]
            removable = (ast.Raise, ast.Expr, ast.AugAssign, ast.Continue, ast.Break, ast.If)
            if isinstance(stmt, removable) and not lone_raise:
                yield func, _Site(stmt, f"remove {type(stmt).__name__}", _set_item(body, i, ast.Pass()))
            yield from visit(stmt, func)

    def _node_sites(node: ast.AST, func: str) -> Iterator[tuple[str, _Site]]:
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOP_SWAPS:
            new = _BINOP_SWAPS[type(node.op)]
            yield func, _Site(node, f"{_name(node.op)}->{new.__name__}", _set_attr(node, "op", new()))
        elif isinstance(node, ast.AugAssign) and type(node.op) in _BINOP_SWAPS:
            new = _BINOP_SWAPS[type(node.op)]
            yield func, _Site(node, f"{_name(node.op)}=->{new.__name__}=", _set_attr(node, "op", new()))
        elif isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                for new in _CMP_SWAPS.get(type(op), []):
                    yield func, _Site(node, f"{_name(op)}->{new.__name__}", _set_item(node.ops, i, new()))
        elif isinstance(node, ast.BoolOp):
            new = ast.Or if isinstance(node.op, ast.And) else ast.And
            yield func, _Site(node, f"{_name(node.op)}->{new.__name__}", _set_attr(node, "op", new()))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
            yield func, _Site(node, f"drop {_name(node.op)}", _replace_with_operand(node))
        elif isinstance(node, ast.Constant):
            for value in _constant_variants(node.value):
                yield func, _Site(node, f"constant {node.value!r}->{value!r}", _set_attr(node, "value", value))
        elif isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id == "namespace"):
            # (The keywords of ``namespace(a=a, ...)`` only name arrays for error messages.)
            for i, kw in enumerate(node.keywords):
                if kw.arg is not None:
                    yield func, _Site(node, f"drop keyword {kw.arg}=", _del_item(node.keywords, i))
        elif isinstance(node, ast.Return) and node.value is not None:
            if not (isinstance(node.value, ast.Constant) and node.value.value is None):
                yield func, _Site(node, "return None", _set_attr(node, "value", ast.Constant(None)))
        elif isinstance(node, ast.If) and not _is_not(node.test):
            yield func, _Site(node, "negate if", _negate(node))
        elif isinstance(node, ast.IfExp):
            yield func, _Site(node, "negate conditional expression", _negate(node))

    yield from visit(tree, "")


def _is_not(test: ast.expr) -> bool:
    return isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)


def _negate(node: ast.If | ast.IfExp) -> Callable[[], Callable[[], None]]:
    def apply() -> Callable[[], None]:
        old = node.test
        node.test = ast.UnaryOp(op=ast.Not(), operand=old)
        return lambda: setattr(node, "test", old)

    return apply


def _replace_with_operand(node: ast.UnaryOp) -> Callable[[], Callable[[], None]]:
    # Turn ``-x`` into ``+x`` (keeps the tree shape, so the parent needs no change).
    def apply() -> Callable[[], None]:
        old = node.op
        node.op = ast.UAdd()
        return lambda: setattr(node, "op", old)

    return apply


def generate(module: str) -> tuple[str, list[Mutant]]:
    """The module's baseline source (unparsed, so it matches the mutants' layout) and its mutants."""
    path = ROOT / module
    text = path.read_text()
    lines = text.splitlines()
    tree = ast.parse(text)
    baseline = ast.unparse(tree)
    seen: Counter[tuple[str, str, str]] = Counter()
    mutants = []
    for func, site in list(_sites(tree)):
        lineno = getattr(site.node, "lineno", 0)
        line = " ".join(lines[lineno - 1].split()) if lineno else ""
        undo = site.apply()
        try:
            source = ast.unparse(ast.fix_missing_locations(tree))
        finally:
            undo()
        if source == baseline:
            continue
        n = seen[(func, line, site.description)]
        seen[(func, line, site.description)] += 1
        key = f"{module} | {func or '<module>'} | {site.description} #{n} | {line}"
        end = getattr(site.node, "end_lineno", None) or lineno
        mutants.append(Mutant(key, lineno, site.description, source, end))
    return baseline, mutants


# --------------------------------------------------------------------------- running


class _SourceFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serve one module from a source string instead of its file."""

    def __init__(self, fullname: str, path: Path, source: str):
        self.fullname, self.path, self.source = fullname, path, source

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.fullname:
            return None
        return importlib.util.spec_from_loader(fullname, self, origin=str(self.path))

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__file__ = str(self.path)
        exec(compile(self.source, str(self.path), "exec"), module.__dict__)


#: The test runs use plain asserts: gma-ref installs a pytest plugin (a ``pytest11`` entry point), so
#: pytest marks every module of the gma-ref distribution for assertion rewriting, and its rewriting
#: import hook (ahead of the mutant's) would load gma_ref's modules from disk — no mutant would ever
#: be tested. Plain asserts change no verdict, only the failure messages nobody reads here.
_NO_PLUGIN = ("--assert=plain",)


def _dotted(module: str) -> str:
    return module.removesuffix(".py").replace("/", ".")


def run_one(module: str, source: str, tests: list[str], timeout: float, verbose: bool = False) -> tuple[str, float]:
    """Run ``tests`` (files or pytest node ids) with ``module`` replaced by ``source`` in a forked child.

    Returns (outcome, seconds) with outcome ``"survived"`` (tests pass), ``"killed"`` (a test
    fails or errors), ``"timeout"``.
    """
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.setpgid(0, 0)
            if not verbose:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1)
                os.dup2(devnull, 2)
            sys.meta_path.insert(0, _SourceFinder(_dotted(module), ROOT / module, source))
            import pytest

            args = ["-x", "-q", "-p", "no:cacheprovider", *_NO_PLUGIN, "--hypothesis-profile=ci",
                    "-c", str(ROOT / "pyproject.toml"),
                    "--rootdir", str(ROOT), *[str(ROOT / t) for t in tests]]
            code = pytest.main(args)
            os._exit(0 if code == 0 else 1)
        except BaseException:
            os._exit(2)
    deadline = start + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            elapsed = time.monotonic() - start
            code = os.waitstatus_to_exitcode(status)
            return ("survived" if code == 0 else "killed"), elapsed
        if time.monotonic() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            return "timeout", time.monotonic() - start
        time.sleep(0.02)


def coverage_map(module: str, tests: list[str], timeout: float) -> tuple[dict[str, set[int]], list[str]] | None:
    """Which lines of ``module`` each test executes (unmutated module, as on disk).

    Returns ({node id or ``"<import>"``: lines}, node ids in run order), or ``None`` if the
    tests fail. Recorded with a trace function that follows only the module's own frames.
    """
    import json
    import tempfile

    path = str(ROOT / module)
    out = Path(tempfile.mkstemp(suffix=".json")[1])
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.setpgid(0, 0)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            import threading

            import pytest

            hits: dict[str, set[int]] = {}
            order: list[str] = []
            current = ["<import>"]

            def local(frame, event, arg):
                if event == "line":
                    hits.setdefault(current[0], set()).add(frame.f_lineno)
                return local

            def tracer(frame, event, arg):
                if frame.f_code.co_filename == path:
                    hits.setdefault(current[0], set()).add(frame.f_lineno)
                    return local
                return None

            class Recorder:
                @pytest.hookimpl(hookwrapper=True)
                def pytest_runtest_protocol(self, item, nextitem):
                    current[0] = item.nodeid
                    order.append(item.nodeid)
                    yield
                    current[0] = "<between tests>"

            sys.settrace(tracer)
            threading.settrace(tracer)
            args = ["-q", "-p", "no:cacheprovider", *_NO_PLUGIN, "--hypothesis-profile=ci",
                    "-c", str(ROOT / "pyproject.toml"),
                    "--rootdir", str(ROOT), *[str(ROOT / t) for t in tests]]
            code = pytest.main(args, plugins=[Recorder()])
            sys.settrace(None)
            out.write_text(json.dumps({"hits": {k: sorted(v) for k, v in hits.items()}, "order": order}))
            os._exit(0 if code == 0 else 1)
        except BaseException:
            os._exit(2)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.05)
    try:
        if os.waitstatus_to_exitcode(status) != 0:
            return None
        data = json.loads(out.read_text())
    finally:
        out.unlink(missing_ok=True)
    return {k: set(v) for k, v in data["hits"].items()}, data["order"]


def select_tests(m: Mutant, hits: dict[str, set[int]], order: list[str], files: list[str]) -> list[str]:
    """The tests that execute a line of the mutant (all files if the line runs at import time)."""
    lines = set(range(m.lineno, max(m.lineno, m.end_lineno) + 1))
    if hits.get("<import>", set()) & lines:
        return files
    return [t for t in order if hits.get(t, set()) & lines]


def load_equivalents(path: Path = EQUIVALENTS) -> dict[str, str]:
    """Mutant key -> reason, from ``key || reason`` lines (``#`` comments and blank lines ignored)."""
    out: dict[str, str] = {}
    if not path.exists():
        return out
    for raw in path.read_text().splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        key, sep, reason = raw.partition(" || ")
        if not sep or not reason.strip():
            raise SystemExit(f"{path}: line without ' || reason': {raw!r}")
        out[" ".join(key.split())] = reason.strip()
    return out


# --------------------------------------------------------------------------- recorded results


def source_sha256(module: str) -> str:
    """SHA-256 of the module's source file, which a recorded run is tied to."""
    return hashlib.sha256((ROOT / module).read_bytes()).hexdigest()


def load_results(path: Path = RESULTS) -> dict[str, dict]:
    """Module path -> its last full run: ``mutants``, ``killed``, ``equivalent``, ``survived``, ``source_sha256``."""
    if not path.exists():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    for module, row in data.items():
        missing = {"mutants", "killed", "equivalent", "survived"} - set(row)
        if missing:
            raise SystemExit(f"{path}: {module} lacks {sorted(missing)}")
        if row["killed"] + row["equivalent"] + row["survived"] != row["mutants"]:
            raise SystemExit(f"{path}: {module}: killed + equivalent + survived is not the number of mutants")
    return data


def record_result(module: str, mutants: int, killed: int, equivalent: int, survived: int,
                  path: Path = RESULTS) -> None:
    """Store one full run of ``module`` (replacing its previous one); modules are kept in path order."""
    data = load_results(path)
    data[module] = {"mutants": mutants, "killed": killed, "equivalent": equivalent, "survived": survived,
                    "source_sha256": source_sha256(module)}
    path.write_text(json.dumps(dict(sorted(data.items())), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def mutation_table(results: dict[str, dict]) -> str:
    """The Markdown table of the recorded runs: one row per module, score = killed / (mutants − equivalent)."""
    lines = ["| module | mutants | killed | equivalent (listed) | survivors | score |", "|---|---|---|---|---|---|"]
    for module, row in sorted(results.items()):
        scored = row["mutants"] - row["equivalent"]
        score = f"{100 * row['killed'] / scored:.1f} %" if scored else "–"
        lines.append(f"| `{module}` | {row['mutants']} | {row['killed']} | {row['equivalent']} | {row['survived']} "
                     f"| {score} |")
    return "\n".join(lines)


def replace_table(text: str, table: str) -> str:
    """``text`` with what lies between the two marker comments replaced by ``table``."""
    start, end = text.find(TABLE_START), text.find(TABLE_END)
    if start < 0 or end < start or text.count(TABLE_START) != 1 or text.count(TABLE_END) != 1:
        raise ValueError(f"the page needs one {TABLE_START!r} and, after it, one {TABLE_END!r}")
    return text[:start + len(TABLE_START)] + "\n" + table + "\n" + text[end:]


def write_table(page: Path = CONTRIBUTING, results: Path = RESULTS) -> bool:
    """Write the table of ``results`` into ``page``; True when the page changed."""
    text = page.read_text(encoding="utf-8")
    new = replace_table(text, mutation_table(load_results(results)))
    if new != text:
        page.write_text(new, encoding="utf-8")
    return new != text


def status(results: dict[str, dict]) -> list[str]:
    """One line per module to rerun: source changed since (or not recorded with) its run, never run in full."""
    out = []
    for module in sorted(set(results) | set(MODULE_TESTS)):
        if not (ROOT / module).is_file():
            out.append(f"{module}: no longer present" + (" (remove its recorded run)" if module in results else ""))
        elif module not in results:
            out.append(f"{module}: never run in full")
        elif results[module].get("source_sha256") is None:  # counts recorded without the source they came from
            now, then = len(generate(module)[1]), results[module]["mutants"]
            out.append(f"{module}: its recorded run names no source ({now} mutants now, {then} in that run)")
        elif results[module]["source_sha256"] != source_sha256(module):
            out.append(f"{module}: source changed since its recorded run")
    return out


def _preimport() -> None:
    sys.path.insert(0, str(ROOT))
    os.chdir(ROOT)
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    sys.dont_write_bytecode = True
    for name in ("numpy", "scipy", "scipy.special", "scipy.linalg", "sympy", "mpmath", "hypothesis", "pytest",
                 "array_api_strict", "array_api_compat", "array_api_compat.numpy", "_pytest.python"):
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    # The package itself must be imported fresh in every child (so it picks up the mutant).
    for name in [m for m in sys.modules if m == "gma_ref" or m.startswith(("gma_ref.", "tests", "derivations"))]:
        del sys.modules[name]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("module", nargs="?", help="path of the module under test, e.g. gma_ref/mixture.py")
    parser.add_argument("--tests", nargs="+", help="test files to run (default: the module's list in MODULE_TESTS)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per mutant (default: 3 × baseline + 10)")
    parser.add_argument("--match", action="append", default=None,
                        help="only mutants whose key contains this text (repeat for several)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--show", action="store_true", help="print the diff line of each survivor")
    parser.add_argument("--verbose", action="store_true", help="show pytest output of each run")
    parser.add_argument("--all-tests", action="store_true",
                        help="run every test file for every mutant (default: only the tests that execute the "
                             "mutated line, from a traced run of the unmutated module)")
    parser.add_argument("--write-table", action="store_true",
                        help=f"write the table of {RESULTS.name} into docs/contributing.md and exit")
    parser.add_argument("--status", action="store_true",
                        help="name the modules whose source changed since their recorded run, or never run in full")
    args = parser.parse_args(argv)

    if args.write_table:
        changed = write_table()
        print(f"{CONTRIBUTING.relative_to(ROOT)}: mutation table {'written' if changed else 'already up to date'}")
        return 0
    if args.status:
        lines = status(load_results())
        print("\n".join(lines) if lines else "every module's recorded run is of its current source")
        return 0
    module = args.module
    if module is None:
        parser.error("name a module (or --write-table, --status)")
    if not (ROOT / module).is_file():
        parser.error(f"no such module: {module}")
    tests = args.tests or MODULE_TESTS.get(module)
    if not tests:
        parser.error(f"no default test files for {module}: pass --tests")
    missing = [t for t in tests if not (ROOT / t).is_file()]
    tests = [t for t in tests if (ROOT / t).is_file()]
    if missing:
        print(f"note: test files not present, skipped: {', '.join(missing)}")
    if not tests:  # pytest without a path would run the whole suite for every mutant
        parser.error(f"none of the test files of {module} is present: pass --tests")

    baseline, mutants = generate(module)
    if args.match:
        mutants = [m for m in mutants if any(text in m.key for text in args.match)]
    if args.list:
        for m in mutants:
            print(f"{m.lineno:5d}  {m.key}")
        print(f"{len(mutants)} mutants")
        return 0

    equivalents = load_equivalents()
    _preimport()
    start = time.monotonic()
    coverage = None
    if args.all_tests:  # unmutated run, to check the tests pass and time them
        outcome, _ = run_one(module, baseline, tests, timeout=1200, verbose=args.verbose)
        ok = outcome == "survived"
    else:  # the traced run of the unmutated module doubles as that check
        coverage = coverage_map(module, tests, timeout=1200)
        ok = coverage is not None
    seconds = time.monotonic() - start
    if not ok:
        print(f"the tests fail on the unmutated module ({' '.join(tests)}): fix them first")
        return 2
    timeout = args.timeout or 3 * seconds + 10
    print(f"{module}: {len(mutants)} mutants; tests {' '.join(tests)}; unmutated run {seconds:.1f} s, "
          f"timeout {timeout:.0f} s per mutant")
    counts: Counter[str] = Counter()
    survivors, wrongly_equivalent = [], []
    uncovered = 0
    t0 = time.monotonic()
    for i, m in enumerate(mutants, 1):
        selected = tests if coverage is None else select_tests(m, *coverage, tests)
        if selected:
            outcome, _ = run_one(module, m.source, selected, timeout, verbose=args.verbose)
        else:  # no test executes this line: nothing can fail
            outcome = "survived"
            uncovered += 1
        key = " ".join(m.key.split())
        is_equivalent = key in equivalents
        if outcome == "survived":
            counts["equivalent" if is_equivalent else "survived"] += 1
            if not is_equivalent:
                survivors.append(m)
                note = "" if selected else "  (no test runs this line)"
                print(f"SURVIVED  line {m.lineno}: {m.key}{note}", flush=True)
        else:
            counts["killed"] += 1
            counts["timeout"] += outcome == "timeout"
            if outcome == "timeout":  # named, so that a loaded machine's time-outs can be rerun with --match
                print(f"TIMED OUT line {m.lineno}: {m.key}", flush=True)
            if is_equivalent:
                wrongly_equivalent.append(m)
        if i % 25 == 0:
            print(f"  ... {i}/{len(mutants)} ({time.monotonic() - t0:.0f} s)", flush=True)

    total = len(mutants)
    non_equivalent = total - counts["equivalent"]
    score = counts["killed"] / non_equivalent if non_equivalent else 1.0
    print()
    if uncovered:
        print(f"{uncovered} mutants on lines no test runs (counted as survivors)")
    print(f"{module}: {total} mutants, {counts['killed']} killed, {counts['survived']} survived, "
          f"{counts['equivalent']} equivalent (listed); score {counts['killed']}/{non_equivalent} = "
          f"{100 * score:.1f} % of non-equivalent mutants; {time.monotonic() - t0:.0f} s")
    if counts["timeout"]:
        print(f"{counts['timeout']} of the killed mutants timed out (after {timeout:.0f} s): on a loaded machine, "
              "rerun them (--match) before counting them")
    for m in wrongly_equivalent:
        print(f"KILLED but listed as equivalent (remove from {EQUIVALENTS.name}): {m.key}")
    if args.match or args.tests:
        print(f"not recorded in {RESULTS.name}: a run with --match or --tests is not the module's full run")
    else:
        record_result(module, total, counts["killed"], counts["equivalent"], counts["survived"])
        print(f"recorded in {RESULTS.name}; python tools/mutate.py --write-table puts it in the docs")
    if args.show and survivors:
        print("\nsurvivors:")
        for m in survivors:
            print(_changed_line(baseline, m.source, m))
    return 0 if not survivors else 1


def _changed_line(baseline: str, source: str, m: Mutant) -> str:
    a, b = baseline.splitlines(), source.splitlines()
    buf = io.StringIO()
    print(f"{m.key}", file=buf)
    for x, y in zip(a, b, strict=False):
        if x != y:
            print(f"    - {x.strip()}\n    + {y.strip()}", file=buf)
            break
    return buf.getvalue().rstrip()


if __name__ == "__main__":
    sys.exit(main())
