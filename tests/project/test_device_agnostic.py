"""gma_ref array code is namespace- and device-agnostic (docs/contributing.md, "Rules for code").

* importing gma_ref (and every submodule) imports neither CuPy nor PyTorch (nor JAX);
* no NumPy calls in the array code of gma_ref/*.py, except the host-side uses listed below
  with their reasons (an AST scan, so strings and comments do not count);
* the forward pipeline runs under ``array_api_strict`` for every variant and form and returns
  ``array_api_strict`` arrays; float32 in gives float32 out.
"""

from __future__ import annotations

import ast
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from gma_ref.attention import FORMS, gma_attention
from gma_ref.layer import GMALayerParams, gma_layer
from gma_ref.mixture import log_priors_from_logits, variances_from_omega
from gma_ref.posterior import responsibilities
from tests.support._helpers import from_numpy, rel_err, to_numpy

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "gma_ref"

#: Functions whose NumPy use is host-side by design (module stem, function name) → reason.
ALLOWED_FUNCTIONS = {
    ("layer", "init_layer_params"): "draws the random initial weights with numpy.random.default_rng "
    "(the array API has no RNG) and copies them into xp",
    ("causal", "initial_causal_state"): "defaults xp to array_api_compat.numpy when the caller passes none",
}
#: Whole modules that are host-side by design → reason.
ALLOWED_MODULES = {
    "diagnostics": "interpretability statistics on the host: numpy.unique for category codes and "
    "numpy.random permutations for the App. F.3 baseline (documented in its module docstring)",
    "extensions": "the Dirichlet KL of Eq. 37 needs lgamma/digamma, which the array API lacks: it "
    "copies to the host and uses scipy.special in float64 (documented in its module docstring)",
    "bench": "the `gma-ref bench` harness (gma_ref/bench/: random NumPy inputs, timing, tracemalloc, the PyTorch "
    "comparison, one token block's passes replayed in NumPy); it calls the array code, it is not array code "
    "(documented in its module docstrings)",
}
_NUMPY_NAMES = {"np", "numpy", "onp"}
#: Subpackages that are the oracle and the checks of the package, host-side tools with their own rules.
_NOT_ARRAY_CODE = {"testing", "verification"}


def _numpy_uses(path: pathlib.Path) -> list[tuple[str, int, str]]:
    """(enclosing function or '<module>', line, what) for each NumPy import or ``np.``/``numpy.`` access."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[tuple[str, int, str]] = []

    def visit(node: ast.AST, func: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            func = node.name if func == "<module>" else func  # attribute nested helpers to the outer function
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "numpy" or alias.name == "array_api_compat.numpy":
                    found.append((func, node.lineno, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            names = {a.name for a in node.names}
            if mod.split(".")[0] == "numpy" or mod == "array_api_compat.numpy" or (
                mod == "array_api_compat" and "numpy" in names
            ):
                found.append((func, node.lineno, f"from {mod} import {sorted(names)}"))
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in _NUMPY_NAMES:
            found.append((func, node.lineno, f"{node.value.id}.{node.attr}"))
        for child in ast.iter_child_nodes(node):
            visit(child, func)

    visit(tree, "<module>")
    return found


def test_importing_gma_ref_does_not_import_cupy_or_torch():
    """`import gma_ref` and all its submodules, in a fresh interpreter, leaves cupy/torch/jax out of sys.modules."""
    code = (
        "import importlib, json, pkgutil, sys\n"
        "import gma_ref\n"
        "top = sorted(m for m in sys.modules if m.split('.')[0] in ('cupy', 'torch', 'jax'))\n"
        "for info in pkgutil.walk_packages(gma_ref.__path__, 'gma_ref.'):\n"
        "    importlib.import_module(info.name)\n"
        "every = sorted(m for m in sys.modules if m.split('.')[0] in ('cupy', 'torch', 'jax'))\n"
        "print(json.dumps({'top': top, 'every': every}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=PACKAGE.parent)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["top"] == [], f"import gma_ref imported {result['top']}"
    assert result["every"] == [], f"importing gma_ref submodules imported {result['every']}"


def test_no_numpy_in_array_code():
    """An AST scan of gma_ref/*.py and of its subpackages but the oracle's and the checks' (gma_ref/fast/*.py, ...)
    finds NumPy imports or ``np.``/``numpy.`` calls only in the allow-list (a subpackage is allowed by its name)."""
    modules = sorted(p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] not in _NOT_ARRAY_CODE)
    assert len(modules) >= 8 and PACKAGE / "fast" / "blocks.py" in modules
    violations = []
    for path in modules:
        stem = path.relative_to(PACKAGE).parts[0] if path.parent != PACKAGE else path.stem
        if stem in ALLOWED_MODULES:
            continue
        for func, line, what in _numpy_uses(path):
            if (stem, func) not in ALLOWED_FUNCTIONS:
                violations.append(f"{path.relative_to(PACKAGE.parent)}:{line} in {func}: {what}")
    assert violations == [], "NumPy used in array code:\n" + "\n".join(violations)


def test_scan_detects_numpy_use(tmp_path):
    """The scanner itself flags `import numpy as np` + `np.sum` inside a function (so the scan can fail)."""
    src = tmp_path / "fake.py"
    src.write_text("import math\n\ndef f(a):\n    import numpy as np\n    return np.sum(a)\n", encoding="utf-8")
    uses = _numpy_uses(src)
    assert ("f", 4, "import numpy") in uses and ("f", 5, "np.sum") in uses


# --------------------------------------------------------------------------- array_api_strict pipeline

def _is_strict(a) -> bool:
    """True for an array_api_strict array (its Array class is not exported by name)."""
    import array_api_strict as xs

    return type(a) is type(xs.asarray(0.0))


_VARIANTS = [(False, f) for f in FORMS[False]] + [(True, f) for f in FORMS[True]]


def _inputs(n_q=7, n_k=7, k=3, d_r=2, d_v=4, seed=0, batch=(2,)):
    rng = np.random.default_rng(seed)
    return {
        "q": rng.normal(size=(*batch, n_q, d_r)),
        "k": rng.normal(size=(*batch, n_k, d_r)),
        "v": rng.normal(size=(*batch, n_k, d_v)),
        "means": rng.normal(size=(k, d_r)),
        "omega": rng.normal(size=(k, d_r)),
        "prior_logits": rng.normal(size=k),
    }


@pytest.mark.parametrize(("causal", "form"), _VARIANTS)
def test_pipeline_runs_under_array_api_strict_for_every_form(causal, form):
    """gma_attention with array_api_strict inputs returns array_api_strict arrays equal to the NumPy result."""
    import array_api_compat.numpy as xnp
    import array_api_strict as xs

    data = _inputs()
    out = gma_attention(*(from_numpy(xs, a) for a in data.values()), causal=causal, form=form, chunk_size=3)
    assert _is_strict(out)
    assert out.dtype == xs.float64 and tuple(out.shape) == (2, 7, 4)
    ref = gma_attention(*(from_numpy(xnp, a) for a in data.values()), causal=causal, form=form, chunk_size=3)
    assert rel_err(out, ref) <= 1e-13


@pytest.mark.parametrize("form", FORMS[False])
def test_cross_pipeline_runs_under_array_api_strict(form):
    """Cross-attention (N_q ≠ N_k) under array_api_strict returns array_api_strict arrays of shape (N_q, d_v)."""
    import array_api_strict as xs

    out = gma_attention(*(from_numpy(xs, a) for a in _inputs(n_q=5, n_k=9).values()), form=form)
    assert _is_strict(out) and tuple(out.shape) == (2, 5, 4)


@pytest.mark.parametrize("causal", [False, True])
def test_layer_runs_under_array_api_strict(causal):
    """gma_layer with array_api_strict parameters and input returns an array_api_strict array."""
    import array_api_strict as xs

    rng = np.random.default_rng(1)
    h, d_model, k, d_r, d_v = 2, 5, 3, 2, 3
    p = GMALayerParams(
        w_q=from_numpy(xs, rng.normal(size=(h, d_model, d_r))),
        w_k=from_numpy(xs, rng.normal(size=(h, d_model, d_r))),
        w_v=from_numpy(xs, rng.normal(size=(h, d_model, d_v))),
        w_o=from_numpy(xs, rng.normal(size=(h * d_v, d_model))),
        means=from_numpy(xs, rng.normal(size=(h, k, d_r))),
        omega=from_numpy(xs, rng.normal(size=(h, k, d_r))),
        prior_logits=from_numpy(xs, rng.normal(size=(h, k))),
    )
    out = gma_layer(p, from_numpy(xs, rng.normal(size=(2, 6, d_model))), causal=causal)
    assert _is_strict(out) and tuple(out.shape) == (2, 6, d_model)


@pytest.mark.parametrize(("causal", "form"), _VARIANTS)
def test_float32_in_float32_out(xp, causal, form):
    """float32 inputs give float32 outputs (mixture, Γ and the attention output), close to float64."""
    data = _inputs()
    f32 = {name: from_numpy(xp, a, xp.float32) for name, a in data.items()}
    var = variances_from_omega(f32["omega"])
    lp = log_priors_from_logits(f32["prior_logits"])
    gamma = responsibilities(f32["q"], f32["means"], var, lp)
    assert var.dtype == xp.float32 and lp.dtype == xp.float32 and gamma.dtype == xp.float32
    out = gma_attention(*f32.values(), causal=causal, form=form, chunk_size=3)
    assert out.dtype == xp.float32
    ref = gma_attention(*(from_numpy(xp, a) for a in data.values()), causal=causal, form=form, chunk_size=3)
    assert rel_err(to_numpy(out).astype(np.float64), ref) <= 1e-4
