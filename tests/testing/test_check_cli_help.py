"""``gma-ref check --help`` is plain text: the module's reST docstring without its markup."""

from __future__ import annotations

import subprocess
import sys


def test_check_help_has_no_rest_markup():
    """The help of the check command (standalone and as a subcommand) has no double backquotes, no roles such as
    :class:, no literal-block '::' — and still says what the docstring says."""
    for argv in (["-m", "gma_ref.check_cli", "--help"], ["-m", "gma_ref.cli", "check", "--help"]):
        out = subprocess.run([sys.executable, *argv], capture_output=True, text=True, check=True).stdout
        assert "``" not in out and ":class:" not in out and ":func:" not in out, argv
        assert not any(line.rstrip().endswith("::") for line in out.splitlines()), argv
        assert "Its gma_declaration (a\ngma_ref.testing.Declaration) says what it supports" in out
        assert "package.module:function is imported" in out
