"""Token blocks for the fast path's passes over (N, K) arrays.

The fast path (:mod:`gma_ref.scores_fast`) can compute Γ and the score VJPs one block of tokens at a
time: a block's scores, softmax and Γ (or its cotangent, its gradient rows and its share of the
parameter sums) are formed while the block is in cache, and no N × K scores array is formed beside
Γ. What blocks add up is added in block order.

Blocks are used only for NumPy arrays with BLAS on one thread (:func:`worker_count`). With BLAS on
several threads, the many small matrix products of a blocked pass each wake BLAS's threads, and on
the project's 2-core machine that was measured slower than one product over all tokens (and
running blocks on a Python thread pool beside a multi-threaded BLAS oversubscribes the cores: also
measured slower; see docs/benchmarks.md). Other namespaces (CuPy, PyTorch, ``array_api_strict``,
...) always get one block, the whole array, as before.

This module holds no array code.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import array_api_compat

__all__ = ["token_blocks", "run_blocks", "worker_count", "in_place_ok"]

T = TypeVar("T")

#: Elements of the (token, column) intermediates one block may hold: rows × (K + 2 d_r + 1) per block.
#: 2¹⁶ elements are 512 KiB in float64: a block's scores, Γ and features fit a core's 1 MiB L2 cache.
BLOCK_ELEMENTS = 1 << 16
#: Fewest tokens in a block (below that, Python's per-call overhead outweighs the cache).
MIN_BLOCK_ROWS = 256


def in_place_ok(xp: Any) -> bool:
    """Whether the fast path may update arrays it allocated itself in place: only for NumPy.

    An autograd framework (PyTorch, and any namespace not known here) may have saved such an array for
    its backward (``exp``'s output, say) and refuses the gradient once it was modified; other namespaces
    therefore get the same operations out of place.
    """
    return bool(array_api_compat.is_numpy_namespace(xp))


def worker_count() -> int:
    """The threads BLAS runs on: threadpoolctl if installed, else
    ``OPENBLAS_NUM_THREADS``, ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS`` (the first set), else the usable cores."""
    try:
        from threadpoolctl import threadpool_info  # noqa: PLC0415  (optional)
    except ImportError:
        pass
    else:
        counts = [int(i["num_threads"]) for i in threadpool_info() if i.get("user_api") == "blas"]
        if counts:
            return max(1, min(counts))
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        value = os.environ.get(var, "").strip().split(",")[0]
        if value.isdigit() and int(value) >= 1:
            return int(value)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


def token_blocks(xp: Any, n: int, width: int) -> list[tuple[int, int]]:
    """[start, stop) bounds covering ``range(n)``: for NumPy with BLAS on one thread, blocks of about
    ``BLOCK_ELEMENTS / width`` tokens (at least ``MIN_BLOCK_ROWS``), all of one size but the last;
    otherwise one block."""
    if n <= 0:
        return []
    if not array_api_compat.is_numpy_namespace(xp) or worker_count() > 1:
        return [(0, n)]
    size = max(MIN_BLOCK_ROWS, BLOCK_ELEMENTS // max(1, width))
    return [(start, min(n, start + size)) for start in range(0, n, size)]


def run_blocks(fn: Callable[[int, int], T], blocks: Sequence[tuple[int, int]]) -> list[T]:
    """``[fn(start, stop) for (start, stop) in blocks]``, in block order (the first block first, so
    that ``fn`` may allocate there what the others write into)."""
    return [fn(start, stop) for start, stop in blocks]
