"""Streaming decode: chunked prefill, then one token at a time
===========================================================

Streaming decode: prefill a prompt chunkwise, then generate token by token with a constant state.

Run ``python examples/streaming_decode.py``. Causal GMA (Eq. 8b) is a recurrence over the
state (Ṽ, Z) of K × d_v + K numbers. The prompt is processed by
``gma_causal_chunked(..., return_state=True)``; the remaining tokens go one at a time
through ``causal_step``. The concatenated outputs equal one full causal pass
(``gma_causal_chunked`` over the whole sequence) and also a decode that starts from
``initial_causal_state`` with no prefill. With ``--out DIR`` (and matplotlib) the script
draws ``streaming_decode.png``: the difference from the full pass token by token, and the
numbers held by the decode state against those of the prefix-sum form.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

import gma_ref
from gma_ref.posterior import responsibilities


def main(n: int = 256, n_prompt: int = 100, k: int = 8, d_r: int = 6, d_v: int = 16, chunk_size: int = 32,
         seed: int = 0, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Decode ``n`` tokens (``n_prompt`` of them as a prefill) and compare with the full causal pass.

    Returns
    -------
    dict with ``max_diff_prefill`` (prefill + decode vs full pass), ``max_diff_from_empty``
    (decode from ``initial_causal_state`` vs full pass), ``state_numbers`` (K·d_v + K),
    ``prefix_numbers`` (N·K·d_v, what the prefix-sum form stores), ``n_tokens``, the per-token
    differences ``token_diff_prefill`` and ``token_diff_from_empty``, and ``plot`` (the PNG written
    into ``out_dir``, or ``None``).
    """
    if not 0 <= n_prompt <= n:
        raise ValueError(f"n_prompt must lie in [0, n={n}], got {n_prompt}")
    rng = np.random.default_rng(seed)
    q, kk, v = rng.normal(size=(n, d_r)), rng.normal(size=(n, d_r)), rng.normal(size=(n, d_v))
    means = rng.normal(size=(k, d_r))
    variances = gma_ref.variances_from_omega(np.zeros((k, d_r)))
    log_priors = gma_ref.log_priors_from_logits(np.zeros(k))
    gamma_q = responsibilities(q, means, variances, log_priors)
    gamma_k = responsibilities(kk, means, variances, log_priors)

    full = gma_ref.gma_causal_chunked(gamma_q, gamma_k, v, chunk_size=chunk_size)

    # Prefill the prompt chunkwise, keep the state, then decode the rest one token at a time.
    prompt_out, state = gma_ref.gma_causal_chunked(
        gamma_q[:n_prompt], gamma_k[:n_prompt], v[:n_prompt], chunk_size=chunk_size, return_state=True
    )
    decoded = [prompt_out]
    for t in range(n_prompt, n):
        out_t, state = gma_ref.causal.causal_step(state, gamma_q[t], gamma_k[t], v[t])
        decoded.append(out_t[None, :])
    streamed = np.concatenate(decoded, axis=0)
    max_diff_prefill = float(np.max(np.abs(streamed - full)))

    # The same from the empty state, without a prefill.
    state0 = gma_ref.causal.initial_causal_state(k, d_v)
    outs = []
    for t in range(n):
        out_t, state0 = gma_ref.causal.causal_step(state0, gamma_q[t], gamma_k[t], v[t])
        outs.append(out_t)
    max_diff_from_empty = float(np.max(np.abs(np.stack(outs) - full)))
    token_diff_prefill = np.max(np.abs(streamed - full), axis=-1)
    token_diff_from_empty = np.max(np.abs(np.stack(outs) - full), axis=-1)

    state_numbers = int(state.memory.size + state.mass.size)
    print(f"N = {n} tokens: prefill {n_prompt} (chunks of {chunk_size}), then {n - n_prompt} decode steps")
    print(f"max |prefill + decode − full causal pass| = {max_diff_prefill:.1e}")
    print(f"max |decode from empty state − full causal pass| = {max_diff_from_empty:.1e}")
    print(f"state: Ṽ {state.memory.shape} + Z {state.mass.shape} = {state_numbers} numbers, "
          f"independent of N (prefix-sum form stores N·K·d_v = {n * k * d_v})")
    result = {
        "n_tokens": n,
        "max_diff_prefill": max_diff_prefill,
        "max_diff_from_empty": max_diff_from_empty,
        "state_numbers": state_numbers,
        "prefix_numbers": n * k * d_v,
        "token_diff_prefill": token_diff_prefill,
        "token_diff_from_empty": token_diff_from_empty,
    }
    result["plot"] = None if out_dir is None else _plot(result, n_prompt, k, d_v, Path(out_dir))
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


def _plot(result: dict[str, Any], n_prompt: int, k: int, d_v: int, out: Path) -> Path | None:
    """Per-token difference from the full pass, and the numbers held, against the token index."""
    plt = _pyplot()
    if plt is None:
        return None
    out.mkdir(parents=True, exist_ok=True)
    tokens = np.arange(1, result["n_tokens"] + 1)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    floor = 1e-18  # exact zeros drawn at the floor of the log axis
    for key, label in (("token_diff_prefill", "prefill + decode"), ("token_diff_from_empty", "decode from empty")):
        axes[0].semilogy(tokens, np.maximum(result[key], floor), ".", ms=3, label=label)
    axes[0].axvline(n_prompt + 0.5, color="grey", lw=0.8, ls="--", label="end of prefill")
    axes[0].set(xlabel="token", ylabel="max |decode − full causal pass|", ylim=(floor / 3, 1e-12))
    axes[0].legend(fontsize=8)
    axes[1].plot(tokens, np.full(tokens.shape, result["state_numbers"]), label="decode state (Ṽ, Z): K·d_v + K")
    axes[1].plot(tokens, tokens * k * d_v, label="prefix-sum form: t·K·d_v")
    axes[1].set(xlabel="token t", ylabel="numbers held")
    axes[1].legend(fontsize=8)
    for ax in axes:
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path = out / "streaming_decode.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# %%
# Prefill, decode token by token, and compare with the full causal pass.

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--n-prompt", type=int, default=100)
    parser.add_argument("--out", default=None, help="directory for streaming_decode.png (default: no plot)")
    args = parser.parse_args()
    main(n=args.n, n_prompt=args.n_prompt, out_dir=args.out)
