"""README.md: it opens with the two commands CI runs, and its Python example runs."""

from __future__ import annotations

import pathlib
import re

README = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")


def test_readme_opens_with_the_install_verify_and_test_commands() -> None:
    """The first code block is bash with exactly two commands: install + verify, install + pytest."""
    first = re.search(r"```(\w+)\n(.*?)```", README, re.S)
    assert first is not None and first.group(1) == "bash"
    commands = [line for line in first.group(2).splitlines() if line.strip()]
    assert len(commands) == 2
    assert "pip install" in commands[0] and commands[0].endswith("gma-ref verify")
    assert "pip install" in commands[1] and "[test]" in commands[1] and "pytest" in commands[1]
    assert README.index("```bash") < README.index("```python")


def test_readme_python_example_runs() -> None:
    """The README's Python example executes and produces the shapes it promises."""
    block = re.search(r"```python\n(.*?)```", README, re.S)
    assert block is not None
    namespace: dict[str, object] = {}
    exec(compile(block.group(1), "README.md", "exec"), namespace)
    assert namespace["out"].shape == (128, 32)
    assert namespace["out_causal"].shape == (128, 32)
    assert namespace["grads"].d_means.shape == (8, 16)
