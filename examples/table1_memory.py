"""Table 1 of the paper (§5.1) on a CPU: peak memory of GMA and softmax attention against N.
==========================================================================================

Run ``python examples/table1_memory.py [--json FILE] [--quick]``.

The paper profiles one attention block on a GPU (batch B = 8, H = 12 heads, d_model = 768,
so 64 channels per head, bfloat16) and reports the incremental peak memory of a
forward–backward pass for N = 1000, 2000, 4000 and K = 64, 128, 256, 512. This script measures
the same comparison with the reference on the host:

* ``gma`` — bidirectional GMA from routing vectors (Eqs. 3, 7, 14, 15): responsibilities of
  queries and keys, write, read (``gma_ref.gma_attention``), and its hand-written backward
  (``gma_ref.gma_attention_backward``) for a random cotangent;
* ``softmax`` — eager softmax attention, Eq. 1 (``gma_ref.baselines.softmax_attention``), which
  forms the N × N weights, and the textbook backward of that eager path (dV = Pᵀ dO,
  dP = dO Vᵀ, dS = P ⊙ (dP − rowsum(dP ⊙ P)), dQ = dS K/√d, dK = dSᵀ Q/√d), written below.

Memory is the ``tracemalloc`` peak of one call above what was allocated before it: NumPy
reports its buffers to ``tracemalloc``, so temporaries and outputs count, inputs do not (the
paper's "incremental peak" is the same idea on a GPU allocator). One sequence with the paper's
12 heads of 64 channels is measured (B = 1, each head with its own mixture, as the paper's
parameter counts imply) in float32, the narrowest float NumPy computes in; memory is linear in
the batch (checked below with B = 2 against B = 1, apart from the reference's fixed-size
token-block buffers of a few MiB), so ``paper_scale_gb`` multiplies by B = 8 and by 2/4 bytes
(bfloat16 / float32) to put the figure beside the paper's. That estimate covers the attention
core only: the paper's block also holds the projections X W_Q, X W_K, X W_V, the output
projection and framework overhead, so its figures are larger; the shape of the growth (ratios)
is what is compared.

``main()`` returns the measurements as a dict (also written as JSON with ``--json``), which
``docs/figures_experiments.py`` plots; with ``--out DIR`` (and matplotlib) the script draws
``table1_memory.png`` itself: peak memory against N for GMA at each K and for softmax attention.
Runs in under five minutes on two cores; ``--quick`` divides
every N by 8 (about 20 s).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import gma_ref
from gma_ref.baselines import softmax_attention, softmax_attention_weights

#: The paper's Table 1 setting (footnote 14) and the figures its §5.1 text quotes (GB).
PAPER = {
    "batch": 8,
    "heads": 12,
    "d_model": 768,
    "dtype": "bfloat16",
    "sizes": [1000, 2000, 4000],
    "components": [64, 128, 256, 512],
    "gma_gb": {"K=256": {"1000": 0.85, "2000": 1.70, "4000": 3.39}, "K=64": {"4000": 1.37},
               "K=512": {"4000": 6.32}},
    "softmax_eager_gb": {"4000": 23.07},
    "gma_params_millions": {"K=64": 2.5, "K=512": 3.2},
    "linformer_params_millions": {"1000": 2.9, "4000": 4.4},
}

D_HEAD = 64  # d_model / heads = 768 / 12
HEADS = 12
BYTES_SCALE = PAPER["batch"] * 2 / 4  # batch B = 8, bfloat16 vs float32


def peak_bytes(fn: Callable[[], Any]) -> int:
    """``tracemalloc`` peak of one call of ``fn`` above the memory traced before it."""
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        start = tracemalloc.get_traced_memory()[0]
        result = fn()
        peak = tracemalloc.get_traced_memory()[1] - start
        del result
    finally:
        tracemalloc.stop()
    return int(peak)


def softmax_attention_backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, d_out: np.ndarray
                               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Backward of eager softmax attention (Eq. 1): recompute P, then the textbook VJP.

    An eager framework keeps P from the forward; recomputing it here costs the same N × N
    array, so the peak is that of the eager path.
    """
    scale = 1.0 / math.sqrt(q.shape[-1])
    p = softmax_attention_weights(q, k)
    d_v = np.matmul(np.swapaxes(p, -1, -2), d_out)
    d_p = np.matmul(d_out, np.swapaxes(v, -1, -2))
    d_s = p * (d_p - np.sum(d_p * p, axis=-1, keepdims=True))
    d_q = np.matmul(d_s, k) * scale
    d_k = np.matmul(np.swapaxes(d_s, -1, -2), q) * scale
    return d_q, d_k, d_v


def _inputs(n: int, k: int, batch: int, seed: int, dtype: Any) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    lead = (HEADS,) if batch == 1 else (batch, HEADS)

    def draw(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(dtype)

    return {
        "q": draw(*lead, n, D_HEAD), "k": draw(*lead, n, D_HEAD), "v": draw(*lead, n, D_HEAD),
        "d_out": draw(*lead, n, D_HEAD), "means": draw(HEADS, k, D_HEAD),
        "omega": np.zeros((HEADS, k, D_HEAD), dtype), "prior_logits": np.zeros((HEADS, k), dtype),
    }


def measure_gma(n: int, k: int, batch: int = 1, dtype: Any = np.float32) -> dict[str, int]:
    """Peak bytes of GMA forward and forward + backward for one configuration (12 heads)."""
    a = _inputs(n, k, batch, seed=n + k, dtype=dtype)
    args = (a["q"], a["k"], a["v"], a["means"], a["omega"], a["prior_logits"])

    def fwd_bwd() -> Any:
        out = gma_ref.gma_attention(*args)
        grads = gma_ref.gma_attention_backward(*args, a["d_out"])
        return out, grads

    return {"forward": peak_bytes(lambda: gma_ref.gma_attention(*args)), "forward_backward": peak_bytes(fwd_bwd)}


def measure_softmax(n: int, batch: int = 1, dtype: Any = np.float32) -> dict[str, int]:
    """Peak bytes of eager softmax attention forward and forward + backward (12 heads)."""
    a = _inputs(n, 1, batch, seed=n, dtype=dtype)

    def fwd_bwd() -> Any:
        out = softmax_attention(a["q"], a["k"], a["v"])
        grads = softmax_attention_backward(a["q"], a["k"], a["v"], a["d_out"])
        return out, grads

    return {"forward": peak_bytes(lambda: softmax_attention(a["q"], a["k"], a["v"])),
            "forward_backward": peak_bytes(fwd_bwd)}


def layer_parameter_count(k: int, d_model: int = 768, heads: int = 12) -> int:
    """Parameters of a multi-head GMA layer with per-head mixtures (``gma_ref.layer``).

    W_Q, W_K, W_V (H × d_model × d_head each), W_O (d_model × d_model), and per head
    μ, ω (K × d_head) and α (K); no biases. Counted from ``gma_ref.init_layer_params``.
    """
    p = gma_ref.init_layer_params(d_model, heads, k, d_model // heads, d_model // heads)
    return sum(int(np.prod(getattr(p, f).shape)) for f in
               ("w_q", "w_k", "w_v", "w_o", "means", "omega", "prior_logits"))


def main(quick: bool = False, json_path: str | None = None, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Measure, print the table beside the paper's figures, return (and optionally save) them; with
    ``out_dir``, also draw them (``result["plot"]``, the PNG, or ``None``)."""
    sizes = [n // 8 for n in PAPER["sizes"]] if quick else list(PAPER["sizes"])
    components = list(PAPER["components"])
    rows: list[dict[str, Any]] = []
    measure_gma(sizes[0], components[0])  # warm-up: first-call allocations are not the method's
    measure_softmax(sizes[0])
    for n in sizes:
        for k in components:
            rows.append({"method": "gma", "K": k, "N": n, **measure_gma(n, k)})
        rows.append({"method": "softmax", "K": None, "N": n, **measure_softmax(n)})
    for row in rows:
        row["paper_scale_gb"] = row["forward_backward"] * BYTES_SCALE / 1e9

    # Memory is linear in the batch: B = 2 against B = 1.
    n0, k0 = sizes[0], 256
    batch_ratio = {
        "gma": measure_gma(n0, k0, batch=2)["forward_backward"] / measure_gma(n0, k0)["forward_backward"],
        "softmax": measure_softmax(n0, batch=2)["forward_backward"] / measure_softmax(n0)["forward_backward"],
    }

    def fb(method: str, n: int, k: int | None = None) -> int:
        return next(r["forward_backward"] for r in rows if r["method"] == method and r["N"] == n
                    and (k is None or r["K"] == k))

    lo, hi = sizes[0], sizes[-1]
    ratios = {
        "gma_K256_N_ratio": fb("gma", hi, 256) / fb("gma", lo, 256),
        "paper_gma_K256_N_ratio": 3.39 / 0.85,
        "gma_K512_over_K64": fb("gma", hi, 512) / fb("gma", hi, 64),
        "paper_gma_K512_over_K64": 6.32 / 1.37,
        "softmax_N_ratio": fb("softmax", hi) / fb("softmax", lo),
        "softmax_over_gma_K256": fb("softmax", hi) / fb("gma", hi, 256),
        "paper_softmax_over_gma_K256": 23.07 / 3.39,
    }
    # GMA's peak = a fixed part (the reference forms (token, component, coordinate) triples in
    # token blocks of at most 2**21 elements, a few MiB whatever N is) + a part proportional to N.
    # Least squares over the N measured, per K: peak = intercept + slope · N.
    fits = {}
    for k in components:
        ys = np.array([fb("gma", n, k) for n in sizes], dtype=float)
        slope, intercept = np.polyfit(np.array(sizes, dtype=float), ys, 1)
        fits[f"K={k}"] = {"intercept_bytes": float(intercept), "bytes_per_token": float(slope),
                          "paper_scale_gb_at_N": {str(n): float(slope * n * BYTES_SCALE / 1e9) for n in sizes}}
    ratios["gma_K512_over_K64_proportional_part"] = fits["K=512"]["bytes_per_token"] / fits["K=64"]["bytes_per_token"]
    ratios["softmax_over_gma_K256_proportional_part"] = fb("softmax", hi) / (fits["K=256"]["bytes_per_token"] * hi)
    params = {f"K={k}": layer_parameter_count(k) for k in components}
    result = {"sizes": sizes, "components": components, "dtype": "float32", "heads": HEADS, "batch": 1,
              "d_head": D_HEAD, "rows": rows, "batch_ratio": batch_ratio, "ratios": ratios,
              "layer_parameters": params, "gma_fits": fits, "paper": PAPER, "quick": quick}

    print(f"Peak memory, one sequence x {HEADS} heads (float32, d_head = {D_HEAD}), tracemalloc, MiB; "
          f"'paper scale' = fwd+bwd x B = 8 x 2/4 bytes, GB")
    print(f"{'method':8} {'K':>4} {'N':>6} {'fwd MiB':>9} {'fwd+bwd MiB':>12} {'paper scale GB':>15}")
    for r in rows:
        print(f"{r['method']:8} {r['K'] or '-':>4} {r['N']:>6} {r['forward'] / 2**20:9.2f} "
              f"{r['forward_backward'] / 2**20:12.2f} {r['paper_scale_gb']:15.3f}")
    for key, fit in fits.items():
        print(f"gma {key}: peak = {fit['intercept_bytes'] / 2**20:.1f} MiB"
              f" + {fit['bytes_per_token'] / 2**10:.2f} KiB x N; N-proportional part at paper scale, GB:",
              {n: round(g, 3) for n, g in fit["paper_scale_gb_at_N"].items()})
    print("ratios:", {key: round(val, 3) for key, val in ratios.items()})
    print("B = 2 over B = 1:", {key: round(val, 3) for key, val in batch_ratio.items()})
    print("GMA layer parameters (d_model 768, 12 heads, per-head mixtures):", params)
    if json_path is not None:
        Path(json_path).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    result["plot"] = None if out_dir is None else _plot(result, Path(out_dir))
    return result


def _pyplot():
    """matplotlib.pyplot on the Agg backend, or ``None`` (with a hint) when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print('matplotlib not installed: no plot (pip install -e ".[plot]")')
        return None
    return plt


def _plot(result: dict[str, Any], out: Path) -> Path | None:
    """Forward+backward peak memory (MiB) against N, log–log: GMA for each K, and softmax attention."""
    plt = _pyplot()
    if plt is None:
        return None
    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for k in result["components"]:
        rows = [r for r in result["rows"] if r["method"] == "gma" and r["K"] == k]
        ax.loglog([r["N"] for r in rows], [r["forward_backward"] / 2**20 for r in rows], "o-", label=f"GMA, K = {k}")
    rows = [r for r in result["rows"] if r["method"] == "softmax"]
    ax.loglog([r["N"] for r in rows], [r["forward_backward"] / 2**20 for r in rows], "s--k", label="softmax (Eq. 1)")
    ax.set(xlabel="N (tokens)", ylabel="forward + backward peak [MiB]",
           title=f"one sequence × {result['heads']} heads, {result['dtype']}, tracemalloc")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path = out / "table1_memory.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--json", default=None, help="write the measurements to this JSON file")
    parser.add_argument("--quick", action="store_true", help="divide every N by 8")
    parser.add_argument("--out", default=None, help="directory for table1_memory.png (default: no plot)")
    ns = parser.parse_args()
    main(quick=ns.quick, json_path=ns.json, out_dir=ns.out)
