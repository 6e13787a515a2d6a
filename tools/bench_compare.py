"""Compare the end-to-end benchmark of two source trees in one interleaved run.

``python tools/bench_compare.py OLD_TREE NEW_TREE [--rounds R] [-- bench options]`` runs
``gma-ref bench --end-to-end`` of each tree in a child process (``PYTHONPATH`` set to the tree),
alternating old, new, old, new … for ``R`` rounds, and prints one Markdown row per configuration:
each tree's best forward + backward time and its ratio over PyTorch's time in the same child, and new
over old (of the best times), then the geometric mean of new over old. The bench options after ``--``
are passed to both trees (default: ``--n 8192 --repeats 3 --threads 2``).
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
from pathlib import Path

DEFAULT_BENCH = ["--n", "8192", "--repeats", "3", "--threads", "2"]
#: Columns of a row of the end-to-end table, as ``gma-ref bench --end-to-end`` prints them.
COLUMNS = ("form", "dtype", "K", "N", "thr", "fwd", "fwd_torch", "fwd_ratio", "fb", "fb_torch", "fb_ratio")


def run_tree(tree: Path, bench: list[str]) -> dict[tuple[str, ...], dict[str, float]]:
    """The rows of one end-to-end run of ``tree``: (form, dtype, K, N, threads) -> the timed columns."""
    code = ("import sys; from gma_ref.cli import main; "
            f"sys.exit(main(['bench', '--end-to-end', *{bench!r}]))")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True,
                         check=True).stdout
    rows = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= len(COLUMNS) and parts[0] in ("bidirectional", "causal") and parts[1].startswith("float"):
            named = dict(zip(COLUMNS, parts[:len(COLUMNS)], strict=True))
            rows[tuple(named[c] for c in COLUMNS[:5])] = {c: float(named[c]) for c in COLUMNS[5:]}
    if not rows:
        raise SystemExit(f"no end-to-end rows in the output of {tree}:\n{out}")
    return rows


def best(runs: list[dict[tuple[str, ...], dict[str, float]]]) -> dict[tuple[str, ...], dict[str, float]]:
    """Per row, the run with the smallest forward + backward time."""
    return {key: min((r[key] for r in runs), key=lambda row: row["fb"]) for key in runs[0]}


def table(old: dict, new: dict) -> str:
    """The Markdown comparison: each tree's best f+b, its ratio over PyTorch, new over old; their geometric mean."""
    lines = ["| form | dtype | K | N | threads | old f+b s | old / PyTorch | new f+b s | new / PyTorch | new / old |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    logs = []
    for key in sorted(old):
        o, n = old[key], new[key]
        logs.append(math.log(n["fb"] / o["fb"]))
        lines.append(f"| {' | '.join(key)} | {o['fb']:.3f} | {o['fb_ratio']:.2f} | {n['fb']:.3f} "
                     f"| {n['fb_ratio']:.2f} | {n['fb'] / o['fb']:.2f} |")
    lines.append(f"\nGeometric mean of new / old over {len(logs)} rows: {math.exp(sum(logs) / len(logs)):.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    bench = argv[argv.index("--") + 1:] if "--" in argv else DEFAULT_BENCH
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path, help="the source tree to compare against (a git worktree)")
    parser.add_argument("new", type=Path, help="the source tree under test")
    parser.add_argument("--rounds", type=int, default=3, help="old/new pairs of runs (default 3)")
    args = parser.parse_args(argv)
    runs: dict[str, list] = {"old": [], "new": []}
    for r in range(args.rounds):
        for which in ("old", "new"):
            print(f"round {r + 1}/{args.rounds}: {which}", file=sys.stderr, flush=True)
            runs[which].append(run_tree(getattr(args, which).resolve(), bench))
    print(table(best(runs["old"]), best(runs["new"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
