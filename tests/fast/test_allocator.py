"""``_blocks.prime_allocator``: once per process, before the first blocks run, one 16 MiB block allocated and
freed, so that glibc serves the blocks' temporaries from memory it keeps instead of fresh, page-faulting pages."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from gma_ref.fast import blocks as _blocks
from gma_ref.fast import gma_attention


@pytest.fixture
def allocations(monkeypatch):
    """The sizes of the ``bytes`` objects ``_blocks`` creates, with the process taken as not primed yet."""
    sizes: list[int] = []

    def counting_bytes(*args):
        sizes.append(args[0] if args and isinstance(args[0], int) else -1)
        return bytes(*args)

    monkeypatch.setattr(_blocks, "_primed", [False])
    monkeypatch.setattr(_blocks, "bytes", counting_bytes, raising=False)
    return sizes


def test_prime_allocator_allocates_once_per_process(allocations):
    _blocks.prime_allocator()
    _blocks.prime_allocator()
    assert allocations == [_blocks.PRIME_BYTES]
    assert _blocks.PRIME_BYTES == 1 << 24  # at most 32 MiB with malloc's header, or glibc ignores it


def test_prime_allocator_once_under_concurrent_callers(allocations):
    start = threading.Barrier(4)

    def call():
        start.wait()
        _blocks.prime_allocator()

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert allocations == [_blocks.PRIME_BYTES]


def test_the_pipeline_primes_before_its_blocks(allocations):
    """A NumPy call of the pipeline primes (even for one block); so does a run of several blocks."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((16, 4)) for _ in range(3))
    gma_attention(q, k, v, rng.standard_normal((3, 4)), np.zeros((3, 4)), np.zeros(3))
    assert allocations == [_blocks.PRIME_BYTES]
    _blocks._primed[0] = False
    assert _blocks.run_blocks(lambda a, b: b - a, [(0, 2), (2, 5)]) == [2, 3]
    assert allocations == [_blocks.PRIME_BYTES] * 2


def test_one_block_and_other_namespaces_do_not_prime(allocations):
    array_api_strict = pytest.importorskip("array_api_strict")
    assert _blocks.run_blocks(lambda a, b: b - a, [(0, 4)]) == [4]
    with _blocks.one_blas_thread(array_api_strict), _blocks.small_products(array_api_strict):
        pass
    assert allocations == []
    with _blocks.small_products(np):
        pass
    assert allocations == [_blocks.PRIME_BYTES]


_FAULTS = textwrap.dedent("""
    import resource, sys
    import numpy as np

    def faults_per_loop():  # two 256 KiB temporaries, made and freed 50 times
        a = np.ones((1024, 64), dtype=np.float32)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(50):
            b = a * 2.0
            c = b + a
            del b, c
        return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 50

    fresh = faults_per_loop()
    from gma_ref.fast import gma_attention
    imported = faults_per_loop()
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((16, 4)) for _ in range(3))
    gma_attention(q, k, v, rng.standard_normal((3, 4)), np.zeros((3, 4)), np.zeros(3))
    print(fresh, imported, faults_per_loop())
""")


@pytest.mark.skipif(sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_after_a_pipeline_call_block_temporaries_no_longer_page_fault():
    """In a fresh interpreter with glibc's default thresholds, NumPy temporaries of 256 KiB page-fault each time
    they are made (their pages are given back when they are freed); importing gma_ref changes nothing, a first
    call of the pipeline stops it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    done = subprocess.run([sys.executable, "-c", _FAULTS], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    fresh, imported, primed = (float(x) for x in done.stdout.split())
    if fresh < 16:  # 128 pages are made per loop; this glibc keeps them without being primed
        pytest.skip(f"this allocator does not give these temporaries back ({fresh} faults a loop)")
    assert imported > 16, "importing gma_ref must not change the allocator's state"
    assert primed < fresh / 8, f"{primed} page faults a loop after a call of the pipeline (before it: {imported})"
