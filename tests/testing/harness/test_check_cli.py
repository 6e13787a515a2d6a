"""The command line gma-ref check (gma_ref.cli.check): exit statuses, entry points, options, progress line, help.

``gma-ref check --help`` is plain text: the module's reST docstring without its markup.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gma_ref.cli.check import main as cli_main
from gma_ref.testing import CaseSet, RunOptions, check

from ...support.oracle_helpers import K32 as _K


def test_check_help_has_no_rest_markup():
    """The help of the check command (standalone and as a subcommand) has no double backquotes, no roles such as
    :class:, no literal-block '::' — and still says what the docstring says."""
    for argv in (["-m", "gma_ref.cli.check", "--help"], ["-m", "gma_ref.cli", "check", "--help"]):
        out = subprocess.run([sys.executable, *argv], capture_output=True, text=True, check=True).stdout
        assert "``" not in out and ":class:" not in out and ":func:" not in out, argv
        assert not any(line.rstrip().endswith("::") for line in out.splitlines()), argv
        assert "Its gma_declaration (a\ngma_ref.testing.Declaration) says what it supports" in out
        assert "package.module:function is imported" in out


def test_cli_exit_codes(capsys, tmp_path):
    """gma-ref check exits 0 on a correct kernel, 1 on a planted bug, 3 when the target cannot be loaded."""
    assert cli_main(["gma_ref.testing.calibration.emulated:NumpyKernel", "--grad"]) == 0
    assert cli_main(["tests.support.planted_impls:StrictCausalMask", "--variant", "causal", "--repro",
                     str(tmp_path)]) == 1
    assert cli_main(["no_such_module:f"]) == 3
    assert cli_main(["tests.support.planted_impls:StrictCausalMask", "--variant", "cross", "--json"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out[out.index("{"):])["passed"] is True


def test_cli_module_entry_point():
    """python -m gma_ref.cli.check works standalone."""
    proc = subprocess.run([sys.executable, "-m", "gma_ref.cli.check", "tests.support.planted_impls:MissingLogDet",
                           "--variant", "bidirectional", "--no-repro"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "FAIL" in proc.stdout


def test_add_check_parser_wires_run_check():
    """add_check_parser builds a 'check' subcommand whose func is run_check."""
    import argparse

    from gma_ref.cli.check import add_check_parser, run_check

    parser = argparse.ArgumentParser()
    add_check_parser(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(["check", "x:y", "--variant", "causal", "--dtype", "float16", "--cases", "3"])
    assert args.func is run_check and args.variant == ["causal"] and args.cases == 3


def test_cli_usage_errors_have_their_own_exit_status(capsys):
    """Bad options exit with EXIT_USAGE (4), not argparse's 2, through both entry points."""
    from gma_ref.cli import main as gma_ref_main
    from gma_ref.cli.check import EXIT_USAGE

    assert EXIT_USAGE not in (0, 1, 2, 3)
    target = "gma_ref.testing.calibration.emulated:NumpyKernel"

    def status(fn, argv):
        try:
            return fn(argv)
        except SystemExit as exc:
            return exc.code

    for argv in ([target, "--cases", "-1"], [target, "--dtype", "float8"], [target, "--n-multiple", "0"],
                 [target, "--timeout", "-2"], [], [target, "--n-multiple", "64", "--n-max", "32"]):
        assert status(cli_main, argv) == EXIT_USAGE, argv
        assert status(gma_ref_main, ["check", *argv]) == EXIT_USAGE, argv
    capsys.readouterr()


def test_progress_callback_and_progress_line(capsys):
    """check calls progress(done, total, case_id, elapsed) after every case; the CLI line goes to stderr."""
    from gma_ref.cli.check import _Progress

    calls = []
    check(_K, variants=("causal",), cases=CaseSet(tiling=False), run=RunOptions(progress=lambda *a: calls.append(a)))
    assert [c[0] for c in calls] == list(range(1, 12)) and all(c[1] == 11 for c in calls)
    line = _Progress(after_s=0.0)
    line(3, 29, "causal-x", 4.2)
    assert "3/29 cases" in capsys.readouterr().err
    quiet = _Progress()
    quiet(1, 29, "causal-x", 0.5)
    assert capsys.readouterr().err == ""


def test_cli_constraint_flags(capsys):
    """--eps, --n-multiple, --k-multiple, --d-multiple, --d-max declare the constraints from the shell."""
    target = "tests.support.planted_impls:ConstrainedKernel"
    assert cli_main([target, "--grad", "--variant", "causal", "--no-repro"]) == 1
    capsys.readouterr()
    assert cli_main([target, "--grad", "--variant", "causal", "--eps", "1e-10", "--n-multiple", "16",
                     "--k-multiple", "4", "--d-multiple", "8", "--d-max", "64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["declaration"]["eps"] == 1e-10 and out["declaration"]["n_multiple"] == 16


def test_cli_checks_every_declared_dtype_and_explores(capsys, tmp_path):
    """Without --dtype every declared dtype has its summary line, then one for the run; --dtype narrows it to one.
    --explore SECONDS on a kernel wrong only at K mod 32 = 21 exits 1 and names the case file and test written."""
    two = "tests.support.oracle_helpers:TWO_DTYPES"
    assert cli_main([two, "--variant", "cross", "--no-tiling", "--no-grad", "--no-repro", "-q"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(("PASS", "FAIL"))]
    assert [ln.split(":")[0] for ln in lines] == ["PASS", "PASS", "PASS over 2 dtypes (float64 PASS, float32 PASS)"]
    assert cli_main([two, "--variant", "cross", "--no-tiling", "--no-grad", "--no-repro", "-q", "--dtype",
                     "float32"]) == 0
    assert [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(("PASS", "FAIL"))][0].startswith(
        "PASS: ")
    status = cli_main(["tests.support.planted_explore:kernel", "--in-process", "--no-tiling",
                       "--explore", "10", "--seed", "27", "--repro", str(tmp_path), "-q"])
    text = capsys.readouterr().out
    assert status == 1 and "explore: " in text and "FAIL" in text
    assert str(tmp_path / "test_") in text and ".npz" in text
    with pytest.raises(SystemExit) as bad:
        cli_main(["tests.support.planted_explore:kernel", "--explore", "0"])
    assert bad.value.code == 4
