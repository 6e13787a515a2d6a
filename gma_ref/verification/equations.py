"""The index of the paper's equations and which registry checks cover each one.

:data:`PAPER_EQUATIONS` lists every numbered equation, lettered variant and
unnumbered result of the paper, in the paper's labels. A registry check covers
its own ``equation`` label plus the labels in :data:`ALSO_COVERS` under the
check function's name (the equations it exercises on the way). The few rows
that have nothing to compute are in :data:`DEFINITIONS` with the reason. A test
fails when a row is covered by neither.
"""

from __future__ import annotations

__all__ = ["PAPER_EQUATIONS", "EXTENSIONS", "ALSO_COVERS", "DEFINITIONS"]

#: (label, section, what it says), in the paper's order.
PAPER_EQUATIONS: tuple[tuple[str, str, str], ...] = (
    ("Eq. 1", "§1", "standard attention softmax(QKᵀ/√d_k)V"),
    ("Eq. 2", "§3.2", "diagonal Gaussian density"),
    ("Eq. 3", "§3.2", "responsibilities γ_ik (rows on the simplex)"),
    ("Eq. 4", "§3.3", "projections Q_X, K_X, V_X"),
    ("Eq. 5", "§3.3", "write Ṽ = (Γ^K)ᵀV, Z = (Γ^K)ᵀ1"),
    ("Eq. 6", "§3.3", "the write, component-wise"),
    ("Eq. 6b", "§3.5", "causal prefix memory Ṽ^(i), Z^(i)"),
    ("Eq. 7", "§3.3", "read O = Γ^Q Ṽ / (Γ^Q Z + ε)"),
    ("Eq. 8", "§3.3", "O_i written out with both sums"),
    ("Eq. 8b", "§3.5", "causal O_i from the prefix memory"),
    ("Eq. 9", "§3.3", "induced normalised weights A"),
    ("Eq. 9b (§3.5)", "§3.5", "causal weights A^cGMA"),
    ("Eq. 9b (§4.2)", "§4.2", "row normalisation A = diag(Ã1 + ε)⁻¹Ã"),
    ("Eq. 10", "§3.3", "O_i = Σ_j A_ij V_j"),
    ("Eq. 10b", "§3.5", "causal O_i = Σ_{j≤i} A_ij V_j"),
    ("Eq. 11", "§3.3", "unnormalised affinity Ã = Γ^Q(Γ^K)ᵀ"),
    ("Eq. 12", "§3.4", "routing cost 2NKd_r + 2NKd_v + 4NK + Nd_v (and §3.4 storage)"),
    ("Eq. 13", "§3.6", "trainable set {W_Q, W_K, W_V, μ, ω, α}"),
    ("Eq. 14", "§3.6", "σ² = softplus(ω) + ε_σ"),
    ("Eq. 15", "§3.6", "π = softmax(α)"),
    ("Eq. 16", "§4.1", "score s_ik"),
    ("Eq. 3b", "§4.1", "γ = softmax_k(s)"),
    ("Eq. 17", "§4.1", "softmax Jacobian"),
    ("Eq. 17b", "§4.1", "self-sensitivity γ(1 − γ)"),
    ("Eq. 18", "§4.1", "δ = γ ⊙ (g − Σγg)"),
    ("Eq. 19", "§4.1", "chain rule for a parameter entering the scores"),
    ("Eq. 19b", "§4.1", "the chain rule with the softmax Jacobian expanded"),
    ("Eq. 20", "§4.1", "∇_μ s = Σ⁻¹(x − μ)"),
    ("Eq. 21", "§4.1", "∇_μk γ_ik"),
    ("Eq. 22", "§4.1", "∇_μk γ_ij, j ≠ k"),
    ("Eq. 23", "§4.2", "rank(Ã) ≤ K"),
    ("Thm 1", "§4.3", "local Lipschitz continuity of the responsibilities"),
    ("Eq. 24", "§5.4", "head-averaged responsibilities"),
    ("Eq. 25", "§5.4", "marginal usage"),
    ("Eq. 26", "§5.4", "normalised usage entropy"),
    ("Eq. 27", "§5.4", "normalised mean token entropy"),
    ("Eq. 28", "§5.4", "mean maximum responsibility"),
    ("Eq. 29", "§5.4", "hard assignments"),
    ("Eq. 30", "§5.4", "counts n_kc, n_k"),
    ("Eq. 31", "§5.4", "purity"),
    ("Eq. 32", "§5.4", "weighted purity"),
    ("Eq. 33", "§5.4", "mutual information"),
    ("Eq. 34", "§5.4", "NMI with min-normalisation"),
    ("App. F.3", "App. F.3", "permutation baseline"),
    ("Eq. 35", "§6", "π ~ Dirichlet(α₀/K, …)"),
    ("Eq. 36", "§6", "responsibilities with a random prior (posterior mean)"),
    ("Eq. 37", "§6", "Dirichlet KL added to the loss"),
    ("Eq. 38", "§6", "truncated stick-breaking priors"),
    ("Eq. 39", "§6", "GMA-MoE gates"),
    ("Eq. 40", "§6", "dense expert mixture"),
    ("Eq. 41", "§6", "sparse top-r mixture"),
    ("Eq. 42", "App. B", "(AB)C = A(BC)"),
    ("Eq. 43", "App. B", "cost of (AB)C"),
    ("Eq. 44", "App. B", "cost of A(BC); the 1000×10 example"),
    ("Eq. 45", "App. B", "(Γ^Q(Γ^K)ᵀ)V_X"),
    ("Eq. 46", "App. B", "Γ^Q((Γ^K)ᵀV_X)"),
    ("Eq. 47", "App. B", "Ṽ = (Γ^K)ᵀV_X"),
    ("Eq. 48", "App. B", "write cost 2NKd_v"),
    ("Eq. 49", "App. B", "Z = (Γ^K)ᵀ1 and Γ^Q Z + ε in O(NK)"),
    ("App. C", "App. C.2–C.4", "memory slots M_k, read weights α_ik, row sums"),
    ("App. C.7", "App. C.7", "causal GMA by cumulative sums"),
    ("Eq. 50", "App. D", "s_ik coordinate-wise"),
    ("Eq. 51", "App. D", "γ = softmax(s)"),
    ("Eq. 52", "App. D.1", "∂s/∂μ_km"),
    ("Eq. 53", "App. D.1", "∇_μk s_ik"),
    ("Eq. 54", "App. D.1", "∂L/∂μ_k"),
    ("Eq. 55", "App. D.2", "σ² = softplus(ω) + ε_σ"),
    ("Eq. 56", "App. D.2", "chain rule through σ²"),
    ("Eq. 57", "App. D.2", "∂s/∂σ²"),
    ("Eq. 58", "App. D.2", "∂σ²/∂ω = sigmoid(ω)"),
    ("Eq. 59", "App. D.2", "∂s/∂ω"),
    ("Eq. 60", "App. D.2", "∂L/∂ω"),
    ("Eq. 61", "App. D.3", "∂π/∂α"),
    ("Eq. 62", "App. D.3", "∂s/∂α"),
    ("Eq. 63", "App. D.3", "∂L/∂α"),
    ("Eq. 64", "App. D.3", "∂L/∂α = Σ_i δ_im"),
    ("App. E.1", "App. E.1", "standard self-attention, causal mask"),
    ("App. E.2", "App. E.2", "standard cross-attention"),
    ("App. E.3", "App. E.3", "GMA self-attention restated"),
    ("App. E.4", "App. E.4", "GMA cross-attention"),
    ("App. G", "App. G", "attention as normalised compatibility (conceptual)"),
)

#: Labels of checks of what the project adds beyond the paper (label, where it is documented, what it is).
EXTENSIONS: tuple[tuple[str, str, str], ...] = (
    ("Gates", "docs/guide/13-gated-and-geometry.md", "elementwise and head-wise output gates of the layer"),
)

#: Check function name → further equation labels that check exercises.
ALSO_COVERS: dict[str, tuple[str, ...]] = {
    "_eq3_simplex": ("Eq. 3",),
    "_eq3b_extreme": ("Eq. 3",),
    "_eq16": ("Eq. 50",),
    "_eq51": ("Eq. 3b",),
    "_eq14": ("Eq. 55",),
    "_eq5": ("Eq. 6", "Eq. 47", "Eq. 49"),
    "_eq7": ("Eq. 8", "App. E.3"),
    "_eq9b_rows": ("App. C",),
    "_eq6b": ("Eq. 8b", "App. C.7"),
    "_eq12": ("Eq. 48", "Eq. 49"),
    "_eq44": ("Eq. 43",),
    "_eq46": ("Eq. 42", "Eq. 45", "Eq. 47"),
    "_eq1": ("Eq. 1", "App. E.2"),
    "_eq4": ("App. E.3",),
    "_eq58": ("Eq. 55",),
    "_eq61": ("Eq. 62",),
    "_eq18": ("Eq. 17", "Eq. 17b"),
    "_eq18_rows": ("Eq. 64",),
    "_eq54": ("Eq. 19", "Eq. 19b", "Eq. 20", "Eq. 21", "Eq. 22", "Eq. 52", "Eq. 53", "Eq. 56", "Eq. 57"),
    "_eq63": ("Eq. 19", "Eq. 59", "Eq. 60", "Eq. 64", "Eq. 13"),
    "_eq13": ("Eq. 4",),
    "_eq24_28": ("Eq. 25", "Eq. 26", "Eq. 27", "Eq. 28"),
    "_eq29_34": ("Eq. 29", "Eq. 30", "Eq. 31", "Eq. 32", "Eq. 34"),
    "_eq37": ("Eq. 35",),
    "_eq40_41": ("Eq. 40",),
    "_ext_grads": ("Eq. 38", "Eq. 39"),
    "_sympy": ("Eq. 54", "Eq. 60", "Eq. 64"),
    "_gates_forward": ("Eq. 4",),
    "_gates_backward": ("Eq. 13",),
}

#: Rows with nothing to compute, and why.
DEFINITIONS: dict[str, str] = {
    "App. G": (
        "a conceptual comparison of compatibility functions; the template is mapped onto the code in "
        "docs/guide/12-similarity.md"
    ),
}
