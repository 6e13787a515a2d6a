"""Operation counts and storage of GMA (Eq. 12, §3.4) and of matrix-chain orders (App. B).

All counts are exact Python integers in the paper's unit: one multiply-add (or one
scalar operation for the non-matmul terms) counts 1, and an ``m × n`` by ``n × p``
product costs ``m·n·p`` (App. B, Eqs. 43–44). The paper writes Eq. 12 with "≈"
because it ignores constant factors inside the Gaussian log-density and the
exponentials; these functions return exactly the paper's expressions, itemised so
each term can be checked separately. Everything is for one sequence and one head;
multiply by batch × heads for a layer.

- :func:`routing_cost` — Eq. 12 itemised per §3.4: responsibilities ``2NKd_r + 2NK``,
  write ``NKd_v``, mass ``Z`` ``NK``, read ``NKd_v``, denominator ``NK``,
  normalisation ``Nd_v``; total ``2NKd_r + 2NKd_v + 4NK + Nd_v``.
- :func:`routing_storage` — §3.4 storage ``2NK + Kd_v + K + Nd_v``.
- :func:`projection_cost` — §3.4 ``N d_model (2d_r + d_v)`` for ``Q_X, K_X, V_X``.
- :func:`chain_cost` — Eqs. 43–44, ``(AB)C`` versus ``A(BC)``.
- :func:`gma_association_cost` — Eqs. 45–49, ``(Γ^Q(Γ^K)ᵀ)V_X`` versus
  ``Γ^Q((Γ^K)ᵀV_X)`` and the ``O(NK)`` normaliser.
- :func:`gate_parameters` — parameters of the layer's output gates against W_O: elementwise
  ``H·d_model·d_v + H·d_v``, head-wise ``H·d_model + H``.
- :func:`matmul_multiply_adds`, :class:`MatmulProduct`, :func:`count_multiply_adds`,
  :func:`latent_memory_products` — a pure-Python multiply-add counter over the
  shapes of the products a latent-memory forward performs.

Nothing here touches arrays; arguments are Python integers >= 1 (shapes may hold 0), and
:func:`gate_parameters` also takes the gate's name.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from gma_ref._array import check_positive_int

__all__ = [
    "RoutingCost",
    "routing_cost",
    "routing_cost_total",
    "RoutingStorage",
    "routing_storage",
    "routing_storage_total",
    "ProjectionCost",
    "projection_cost",
    "GateParameters",
    "gate_parameters",
    "ChainCost",
    "chain_cost",
    "GmaAssociationCost",
    "gma_association_cost",
    "matmul_multiply_adds",
    "MatmulProduct",
    "count_multiply_adds",
    "latent_memory_products",
]


# --------------------------------------------------------------------------- Eq. 12 and §3.4


@dataclass(frozen=True)
class RoutingCost:
    """Eq. 12 itemised as in §3.4 (one sequence, one head; projections excluded).

    Attributes
    ----------
    responsibilities : int
        ``2NKd_r + 2NK`` — diagonal Gaussian log-densities for ``Q_X`` and ``K_X``
        (``2NKd_r``) and the row-wise normalisation over components (``2NK``).
    write : int
        ``NKd_v`` — ``Ṽ = (Γ^K)ᵀ V_X`` (Eqs. 5, 47).
    mass : int
        ``NK`` — ``Z = (Γ^K)ᵀ 1_N`` (Eqs. 5, 49).
    read : int
        ``NKd_v`` — ``Γ^Q Ṽ`` (Eq. 7).
    denominator : int
        ``NK`` — ``Γ^Q Z + ε`` (Eqs. 7, 49).
    normalisation : int
        ``Nd_v`` — the row-wise division of the output (Eq. 7).
    """

    responsibilities: int
    write: int
    mass: int
    read: int
    denominator: int
    normalisation: int

    @property
    def total(self) -> int:
        """Sum of the six items; equals Eq. 12 ``2NKd_r + 2NKd_v + 4NK + Nd_v``."""
        return (self.responsibilities + self.write + self.mass + self.read
                + self.denominator + self.normalisation)

    def as_dict(self) -> dict[str, int]:
        """The items plus ``total`` as a plain ``dict``."""
        return {**asdict(self), "total": self.total}


def routing_cost(n: int, k: int, d_r: int, d_v: int) -> RoutingCost:
    """Itemised GMA routing cost of §3.4 / Eq. 12 for ``n`` tokens, ``k`` components.

    Parameters
    ----------
    n, k, d_r, d_v : int
        sequence length N, number of mixture components K, routing dimension d_r and
        value dimension d_v; all integers >= 1.

    Returns
    -------
    RoutingCost
        the itemised counts; ``.total`` is Eq. 12.

    Raises
    ------
    TypeError
        a non-integer argument.
    ValueError
        an argument < 1.
    """
    n, k, d_r, d_v = _positive_ints(n=n, k=k, d_r=d_r, d_v=d_v)
    # [eq:12]
    return RoutingCost(
        responsibilities=2 * n * k * d_r + 2 * n * k,
        write=n * k * d_v,
        mass=n * k,
        read=n * k * d_v,
        denominator=n * k,
        normalisation=n * d_v,
    )
    # [/eq:12]


def routing_cost_total(n: int, k: int, d_r: int, d_v: int) -> int:
    """Eq. 12 as printed: ``C_GMA = 2NKd_r + 2NKd_v + 4NK + Nd_v``.

    Written from the closed form (not by summing :func:`routing_cost`) so the two can
    be checked against each other. Raises as :func:`routing_cost`.
    """
    n, k, d_r, d_v = _positive_ints(n=n, k=k, d_r=d_r, d_v=d_v)
    # [eq:12total]
    return 2 * n * k * d_r + 2 * n * k * d_v + 4 * n * k + n * d_v
    # [/eq:12total]


@dataclass(frozen=True)
class RoutingStorage:
    """§3.4 routing-specific activation storage, in array entries.

    Attributes:
        responsibilities: ``2NK`` — ``Γ^Q`` and ``Γ^K``.
        memory: ``Kd_v`` — ``Ṽ``.
        mass: ``K`` — ``Z``.
        output: ``Nd_v`` — ``O``.
    """

    responsibilities: int
    memory: int
    mass: int
    output: int

    @property
    def total(self) -> int:
        """``2NK + Kd_v + K + Nd_v``."""
        return self.responsibilities + self.memory + self.mass + self.output

    def as_dict(self) -> dict[str, int]:
        """The items plus ``total`` as a plain ``dict``."""
        return {**asdict(self), "total": self.total}


def routing_storage(n: int, k: int, d_v: int) -> RoutingStorage:
    """§3.4 storage ``2NK + Kd_v + K + Nd_v`` (bidirectional GMA, one head), itemised.

    Args: ``n`` = N, ``k`` = K, ``d_v``; integers >= 1. Returns :class:`RoutingStorage`.
    Raises TypeError (non-integer) / ValueError (< 1).
    """
    n, k, d_v = _positive_ints(n=n, k=k, d_v=d_v)
    return RoutingStorage(responsibilities=2 * n * k, memory=k * d_v, mass=k, output=n * d_v)


def routing_storage_total(n: int, k: int, d_v: int) -> int:
    """§3.4 storage as printed, ``2NK + Kd_v + K + Nd_v`` (closed form). Raises as above."""
    n, k, d_v = _positive_ints(n=n, k=k, d_v=d_v)
    return 2 * n * k + k * d_v + k + n * d_v


@dataclass(frozen=True)
class ProjectionCost:
    """§3.4 projection cost ``N d_model (2d_r + d_v)``, itemised per projection (Eq. 4).

    Attributes: ``query`` = ``N d_model d_r`` (``X W_Q``), ``key`` = ``N d_model d_r``
    (``X W_K``), ``value`` = ``N d_model d_v`` (``X W_V``).
    """

    query: int
    key: int
    value: int

    @property
    def total(self) -> int:
        """``N d_model (2 d_r + d_v)``."""
        return self.query + self.key + self.value

    def as_dict(self) -> dict[str, int]:
        """The items plus ``total`` as a plain ``dict``."""
        return {**asdict(self), "total": self.total}


def projection_cost(n: int, d_model: int, d_r: int, d_v: int) -> ProjectionCost:
    """Multiply-adds of ``Q_X = X W_Q``, ``K_X = X W_K``, ``V_X = X W_V`` (§3.4, Eq. 4).

    Args: ``n`` = N, ``d_model``, ``d_r``, ``d_v``; integers >= 1.
    Returns :class:`ProjectionCost` (``.total = N d_model (2d_r + d_v)``).
    Raises TypeError (non-integer) / ValueError (< 1).
    """
    n, d_model, d_r, d_v = _positive_ints(n=n, d_model=d_model, d_r=d_r, d_v=d_v)
    return ProjectionCost(query=n * d_model * d_r, key=n * d_model * d_r,
                          value=n * d_model * d_v)


# --------------------------------------------------------------------------- output gates of the layer


@dataclass(frozen=True)
class GateParameters:
    """Trainable parameters an output gate adds to one layer, and the output projection's size.

    Attributes: ``weights`` (``W_G``: ``H·d_model·d_v``; head-wise ``u``: ``H·d_model``),
    ``biases`` (``b_G``: ``H·d_v``; head-wise ``c``: ``H``), ``output_projection``
    (``W_O``: ``H·d_v·d_model``).
    """

    weights: int
    biases: int
    output_projection: int

    @property
    def total(self) -> int:
        """``weights + biases``."""
        return self.weights + self.biases

    @property
    def overhead(self) -> float:
        """``total / output_projection``: the gate's parameters as a fraction of W_O's."""
        return self.total / self.output_projection

    def as_dict(self) -> dict[str, int | float]:
        """The items plus ``total`` and ``overhead`` as a plain ``dict``."""
        return {**asdict(self), "total": self.total, "overhead": self.overhead}


def gate_parameters(gate: str, n_heads: int, d_model: int, d_v: int) -> GateParameters:
    """Parameter count of the layer's output gate (:func:`gma_ref.layer.gma_layer` ``gate=``).

    elementwise: ``W_G,h`` (d_model × d_v) and ``b_G,h`` (d_v) per head, ``H·d_model·d_v + H·d_v``
    in all — as many weights as W_O itself (``H·d_v·d_model``). head-wise: ``u_h`` (d_model) and
    ``c_h`` per head, ``H·d_model + H``; relative to W_O that is ``(d_model + 1) / (d_v·d_model)``
    ≈ 1/d_v. For d_model = 768, H = 12 (d_v = 64, W_O 768 × 768 = 589 824 weights) the head-wise
    weights are 9 216 = 1.5625 % of W_O and 9 228 = 1.5645 % with the 12 biases.

    Args: ``gate`` ``"elementwise"`` or ``"headwise"``; ``n_heads`` = H, ``d_model``, ``d_v``
    integers >= 1. Raises ValueError (unknown gate, size < 1), TypeError (non-integer size).
    """
    if gate not in ("elementwise", "headwise"):
        raise ValueError(f"gate must be 'elementwise' or 'headwise', got {gate!r}")
    h, d_model, d_v = _positive_ints(n_heads=n_heads, d_model=d_model, d_v=d_v)
    width = d_v if gate == "elementwise" else 1
    return GateParameters(weights=h * d_model * width, biases=h * width, output_projection=h * d_v * d_model)


# --------------------------------------------------------------------------- Appendix B


@dataclass(frozen=True)
class ChainCost:
    """Cost of the two orders of ``A B C`` with ``A: m×n``, ``B: n×p``, ``C: p×q``.

    Attributes:
        left_first: Eq. 43, ``(AB)C`` = ``mnp + mpq``.
        right_first: Eq. 44, ``A(BC)`` = ``npq + mnq``.
        left_intermediate: entries of ``AB`` (``m·p``).
        right_intermediate: entries of ``BC`` (``n·q``).
    """

    left_first: int
    right_first: int
    left_intermediate: int
    right_intermediate: int


def chain_cost(m: int, n: int, p: int, q: int) -> ChainCost:
    """Eqs. 43–44: multiply counts of ``(AB)C`` and ``A(BC)`` (Eq. 42: same result).

    ``A ∈ R^{m×n}``, ``B ∈ R^{n×p}``, ``C ∈ R^{p×q}``. App. B's example
    ``chain_cost(1000, 10, 1000, 10)`` gives ``2·10⁷`` versus ``2·10⁵``.

    Raises TypeError (non-integer) / ValueError (< 1).
    """
    m, n, p, q = _positive_ints(m=m, n=n, p=p, q=q)
    # [eq:42+43+44]
    return ChainCost(left_first=m * n * p + m * p * q, right_first=n * p * q + m * n * q,
                     left_intermediate=m * p, right_intermediate=n * q)
    # [/eq:42+43+44]


@dataclass(frozen=True)
class GmaAssociationCost:
    """Eqs. 45–49 for the GMA numerator ``Γ^Q (Γ^K)ᵀ V_X`` (``Γ: N×K``, ``V_X: N×d_v``).

    Attributes:
        explicit: Eq. 45, ``(Γ^Q(Γ^K)ᵀ)V_X`` = ``N²K + N²d_v`` (``O(N²K)``).
        associative: Eqs. 46–48, ``Γ^Q((Γ^K)ᵀV_X)`` = ``NKd_v + NKd_v = 2NKd_v``.
        explicit_intermediate: ``N²`` entries of ``Γ^Q(Γ^K)ᵀ``.
        associative_intermediate: ``Kd_v`` entries of ``Ṽ`` (Eq. 47).
        normaliser: Eq. 49, ``Z = (Γ^K)ᵀ1_N`` (``NK``) plus ``Γ^Q Z`` (``NK``) = ``2NK``.
    """

    explicit: int
    associative: int
    explicit_intermediate: int
    associative_intermediate: int
    normaliser: int


def gma_association_cost(n: int, k: int, d_v: int) -> GmaAssociationCost:
    """Eqs. 45–49: the two parenthesisations of GMA's numerator and the normaliser cost.

    This is :func:`chain_cost` with ``A = Γ^Q`` (N×K), ``B = (Γ^K)ᵀ`` (K×N),
    ``C = V_X`` (N×d_v). Raises TypeError (non-integer) / ValueError (< 1).
    """
    n, k, d_v = _positive_ints(n=n, k=k, d_v=d_v)
    # [eq:45+46+47+48+49]
    chain = chain_cost(n, k, n, d_v)
    return GmaAssociationCost(
        explicit=chain.left_first,
        associative=chain.right_first,
        explicit_intermediate=chain.left_intermediate,
        associative_intermediate=chain.right_intermediate,
        normaliser=2 * n * k,
    )
    # [/eq:45+46+47+48+49]


# --------------------------------------------------------------------------- multiply-add counter


def matmul_multiply_adds(
    a_shape: Sequence[int],
    b_shape: Sequence[int],
    *,
    transpose_a: bool = False,
    transpose_b: bool = False,
) -> int:
    """Multiply-adds of ``a @ b`` from shapes alone: ``(m×n) @ (n×p)`` costs ``m·n·p``.

    Follows ``matmul`` semantics: a 1-D left operand is a row ``(1, n)``, a 1-D right
    operand a column ``(n, 1)``; leading (batch) dims broadcast and multiply the count.
    ``transpose_a`` / ``transpose_b`` swap the last two axes first (``Γᵀ @ V`` is
    ``matmul_multiply_adds(gamma.shape, v.shape, transpose_a=True)``).

    Raises
    ------
    TypeError
        a shape entry that is not an integer.
    ValueError
        an empty shape or negative entry, a transpose of a 1-D operand,
        mismatched inner dimensions, non-broadcastable batch dims.
    """
    a = _shape("a_shape", a_shape)
    b = _shape("b_shape", b_shape)
    if transpose_a:
        if len(a) < 2:
            raise ValueError(f"transpose_a needs a_shape of rank >= 2, got {a}")
        a = (*a[:-2], a[-1], a[-2])
    if transpose_b:
        if len(b) < 2:
            raise ValueError(f"transpose_b needs b_shape of rank >= 2, got {b}")
        b = (*b[:-2], b[-1], b[-2])
    if len(a) == 1:
        a = (1, a[0])
    if len(b) == 1:
        b = (b[0], 1)
    m, n = a[-2], a[-1]
    n2, p = b[-2], b[-1]
    if n != n2:
        raise ValueError(
            f"inner dimensions differ: a_shape {tuple(a_shape)} (as used: {a}) and "
            f"b_shape {tuple(b_shape)} (as used: {b})"
        )
    batch = 1
    for size in _broadcast(a[:-2], b[:-2], a_shape, b_shape):
        batch *= size
    return batch * m * n * p


@dataclass(frozen=True)
class MatmulProduct:
    """One matrix product of a forward pass, described by its operand shapes.

    Attributes:
        name: what the product computes (e.g. ``"write"``); counts are grouped by name.
        a_shape, b_shape: operand shapes as stored (before any transpose).
        transpose_a, transpose_b: whether the operand enters transposed.
    """

    name: str
    a_shape: tuple[int, ...]
    b_shape: tuple[int, ...]
    transpose_a: bool = False
    transpose_b: bool = False

    @property
    def multiply_adds(self) -> int:
        """:func:`matmul_multiply_adds` of this product."""
        return matmul_multiply_adds(self.a_shape, self.b_shape,
                                    transpose_a=self.transpose_a, transpose_b=self.transpose_b)


def count_multiply_adds(products: Iterable[MatmulProduct]) -> dict[str, int]:
    """Multiply-adds per product name (products sharing a name are summed).

    Returns ``{name: count}`` in first-seen order; ``sum(result.values())`` is the total.
    Raises TypeError for an item that is not a :class:`MatmulProduct`, and what
    :func:`matmul_multiply_adds` raises for bad shapes.
    """
    counts: dict[str, int] = {}
    for item in products:
        if not isinstance(item, MatmulProduct):
            raise TypeError(f"products must hold MatmulProduct items, got {type(item).__name__}")
        counts[item.name] = counts.get(item.name, 0) + item.multiply_adds
    return counts


def latent_memory_products(n: int, k: int, d_v: int) -> tuple[MatmulProduct, ...]:
    """The four products of the bidirectional latent-memory write/read (Eqs. 5, 7, 47–49).

    ``write``: ``(Γ^K)ᵀ V_X`` = ``(N,K)ᵀ @ (N,d_v)``; ``mass``: ``(Γ^K)ᵀ 1_N`` =
    ``(N,K)ᵀ @ (N,)``; ``read``: ``Γ^Q Ṽ`` = ``(N,K) @ (K,d_v)``; ``denominator``:
    ``Γ^Q Z`` = ``(N,K) @ (K,)``. Counted with :func:`count_multiply_adds` they give
    Eq. 12's ``NKd_v``, ``NK``, ``NKd_v``, ``NK``. Raises TypeError / ValueError for
    non-integer / < 1 arguments.
    """
    n, k, d_v = _positive_ints(n=n, k=k, d_v=d_v)
    return (
        MatmulProduct("write", (n, k), (n, d_v), transpose_a=True),
        MatmulProduct("mass", (n, k), (n,), transpose_a=True),
        MatmulProduct("read", (n, k), (k, d_v)),
        MatmulProduct("denominator", (n, k), (k,)),
    )


# --------------------------------------------------------------------------- helpers


def _positive_ints(**values: int) -> list[int]:
    for name, v in values.items():
        if isinstance(v, bool):  # check_positive_int would read True as 1
            raise TypeError(f"{name} must be an integer >= 1, got {v!r}")
    return [check_positive_int(name, v) for name, v in values.items()]


def _shape(name: str, shape: Sequence[int]) -> tuple[int, ...]:
    try:
        entries = tuple(shape)
    except TypeError:
        raise TypeError(f"{name} must be a sequence of integers, got {shape!r}") from None
    if not entries:
        raise ValueError(f"{name} must have at least one axis, got {shape!r}")
    out = []
    for e in entries:
        if isinstance(e, bool):
            raise TypeError(f"{name} entries must be integers, got {shape!r}")
        try:
            e = operator.index(e)
        except TypeError:
            raise TypeError(f"{name} entries must be integers, got {shape!r}") from None
        if e < 0:
            raise ValueError(f"{name} entries must be >= 0, got {shape!r}")
        out.append(e)
    return tuple(out)


def _broadcast(
    a: tuple[int, ...], b: tuple[int, ...], a_shape: Sequence[int], b_shape: Sequence[int]
) -> tuple[int, ...]:
    ndim = max(len(a), len(b))
    a = (1,) * (ndim - len(a)) + a
    b = (1,) * (ndim - len(b)) + b
    out = []
    for x, y in zip(a, b, strict=True):
        if x != y and 1 not in (x, y):
            raise ValueError(
                f"batch dimensions of a_shape {tuple(a_shape)} and b_shape {tuple(b_shape)} "
                "do not broadcast"
            )
        out.append(y if x == 1 else x)
    return tuple(out)
