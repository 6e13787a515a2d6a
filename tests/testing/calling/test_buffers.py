"""Arrays as plain data (gma_ref.testing.calling.buffers): read by their bytes, validated when decoded."""

from __future__ import annotations

import numpy as np
import pytest

from gma_ref.testing.calling.buffers import (
    FRAMEWORKS,
    HostArray,
    HostProblem,
    ProtocolError,
    decode,
    encode,
    extract,
    to_float64,
)


def _roundtrip(h):
    header, payload = encode(h)
    return decode(header, payload)


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "int32", "uint8", "bool", "complex64"])
def test_numpy_arrays_round_trip_bit_exactly(dtype: str) -> None:
    """extract → encode → decode gives the same dtype, shape and bytes, for every dtype that crosses."""
    a = (np.arange(24).reshape(2, 3, 4) * 0.37 - 3).astype(dtype)
    h = extract(a)
    assert isinstance(h, HostArray) and (h.dtype, h.shape, h.framework, h.device) == (dtype, (2, 3, 4), "numpy", "cpu")
    back = _roundtrip(h)
    assert back.dtype == dtype and back.shape == (2, 3, 4) and back.data.tobytes() == a.tobytes()


def test_a_transposed_array_is_read_in_logical_order() -> None:
    """A non-contiguous view is sent C-contiguous: its values, not its memory order."""
    a = np.arange(12.0).reshape(3, 4).T
    back = _roundtrip(extract(a))
    assert back.shape == (4, 3) and np.array_equal(back.data, a)


def test_bfloat16_patterns_widen_to_float32_exactly() -> None:
    """bfloat16 crosses as 16-bit patterns; to_float64 widens each to its exact value."""
    bits = np.array([0x3F80, 0xC000, 0x0001, 0x7F7F, 0x0000, 0x8000], dtype=np.uint16)
    h = HostArray(bits, "bfloat16")
    want = [1.0, -2.0, 2.0 ** -133, 3.3895313892515355e38, 0.0, -0.0]
    got = to_float64(_roundtrip(h))
    assert got.dtype == np.float64 and got.tolist() == want and np.signbit(got[-1])


def test_to_float64_refuses_complex_data() -> None:
    """A complex array cannot be compared as float64 without losing its imaginary part: TypeError."""
    with pytest.raises(TypeError, match="imaginary"):
        to_float64(HostArray(np.ones(2, np.complex64), "complex64"))


def test_a_subclass_is_read_through_its_buffer_not_its_methods() -> None:
    """An ndarray subclass whose astype, __array__ and tobytes lie is read by its data."""

    class Lying(np.ndarray):
        def astype(self, *a, **k):
            return np.zeros(self.shape)

        def __array__(self, *a, **k):
            return np.zeros(self.shape)

        def tobytes(self, *a, **k):
            return b""

    a = np.arange(6.0).reshape(2, 3)
    h = extract(a.view(Lying))
    assert isinstance(h, HostArray) and type(h.data) is np.ndarray and np.array_equal(h.data, a)


def test_what_is_not_an_array_is_described() -> None:
    """None, Python containers and objects that cannot be read become a HostProblem saying what they are."""
    assert extract(None) == HostProblem("None")
    assert extract([1.0, 2.0]) == HostProblem("a list (no shape/dtype)")
    assert extract(3.0) == HostProblem("a float (no shape/dtype)")

    class Broken:
        def __dlpack__(self, *a, **k):
            raise RuntimeError("no data here")

    p = extract(Broken())
    assert isinstance(p, HostProblem) and "Broken" in p.text and "no data here" in p.text
    assert _roundtrip(p) == p and _roundtrip(None) is None


def test_a_module_name_does_not_make_a_tensor() -> None:
    """An object claiming torch's module is read by DLPack as an 'other' array, never as a tensor."""

    class Fake:
        __module__ = "torch.fake"

        def __init__(self, a):
            self.a = a

        def __dlpack__(self, *args, **kw):
            return self.a.__dlpack__(*args, **kw)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    h = extract(Fake(np.ones(3)))
    assert isinstance(h, HostArray) and h.framework == "other" and h.framework in FRAMEWORKS


def test_torch_subclasses_are_read_from_their_storage() -> None:
    """A tensor subclass whose __torch_function__ scales every result is read from its own storage, bfloat16 too."""
    torch = pytest.importorskip("torch")

    class Scaled(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            out = super().__torch_function__(func, types, args, kwargs or {})
            return out * 2 if isinstance(out, torch.Tensor) and out.is_floating_point() else out

    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    h = extract(t.as_subclass(Scaled))
    assert (h.framework, h.dtype, h.device) == ("torch", "float32", "cpu")
    assert np.array_equal(h.data, np.arange(6, dtype=np.float32).reshape(2, 3))
    hb = extract(torch.tensor([1.0, -2.0, 0.5], dtype=torch.bfloat16))
    assert hb.dtype == "bfloat16" and to_float64(hb).tolist() == [1.0, -2.0, 0.5]


@pytest.mark.parametrize("header, payload, why", [
    ([], b"", "must be an object"),
    ({"kind": "pickle"}, b"", "unknown array kind"),
    ({"kind": "problem"}, b"", "without text"),
    ({"kind": "array", "dtype": "object", "shape": [1], "device": "cpu", "framework": "numpy"}, b"", "dtype"),
    ({"kind": "array", "dtype": "float32", "shape": [-1], "device": "cpu", "framework": "numpy"}, b"", "bad shape"),
    ({"kind": "array", "dtype": "float32", "shape": [True], "device": "cpu", "framework": "numpy"}, b"", "bad shape"),
    ({"kind": "array", "dtype": "float32", "shape": "2", "device": "cpu", "framework": "numpy"}, b"", "bad shape"),
    ({"kind": "array", "dtype": "float32", "shape": [1] * 33, "device": "cpu", "framework": "numpy"}, b"", "bad shape"),
    ({"kind": "array", "dtype": "float32", "shape": [1.0], "device": "cpu", "framework": "numpy"}, b"", "bad shape"),
    ({"kind": "array", "dtype": "float32", "shape": [2], "device": "c p u", "framework": "numpy"}, b"", "device"),
    ({"kind": "array", "dtype": "float32", "shape": [2], "device": 1, "framework": "numpy"}, b"", "device"),
    ({"kind": "array", "dtype": "float32", "shape": [2], "device": "cpu", "framework": "torch2"}, b"", "framework"),
    ({"kind": "array", "dtype": "float32", "shape": [2], "device": "cpu", "framework": "numpy"}, b"1234567", "bytes"),
    ({"kind": "array", "dtype": "float32", "shape": [2], "device": "cpu", "framework": "numpy"}, b"123456789", "bytes"),
])
def test_malformed_headers_are_protocol_errors(header, payload, why) -> None:
    """Every malformed header (kind, dtype, shape, device, framework, byte count) is a ProtocolError naming it."""
    with pytest.raises(ProtocolError, match=why):
        decode(header, payload)


def test_a_decoded_array_owns_its_data() -> None:
    """decode copies: the payload buffer can be reused without changing the array."""
    payload = bytearray(np.arange(3.0).tobytes())
    h = decode({"kind": "array", "dtype": "float64", "shape": [3], "device": "cpu", "framework": "numpy"},
               bytes(payload))
    assert h.data.flags.writeable and h.data.tolist() == [0.0, 1.0, 2.0]
    assert h.as_layout("noncontiguous").layout == "noncontiguous" and h.ndim == 1


def test_the_largest_rank_and_the_longest_texts_are_kept() -> None:
    """A 32-axis array decodes; a problem's text keeps 2000 characters, an unreadable object's reason 300."""
    h = decode({"kind": "array", "dtype": "float32", "shape": [1] * 32, "device": "cpu", "framework": "numpy"},
               b"\0" * 4)
    assert h.ndim == 32
    assert decode({"kind": "problem", "text": "x" * 2001}, b"") == HostProblem("x" * 2000)

    class Loud:
        def __dlpack__(self, *a, **k):
            raise RuntimeError("y" * 301)

    assert extract(Loud()).text.count("y") == 300


def test_reading_never_raises_but_lets_ctrl_c_through() -> None:
    """An object whose reading raises an unprintable exception is described; KeyboardInterrupt propagates."""

    class Unprintable(Exception):
        def __str__(self):
            raise ValueError

    class Bad:
        def __dlpack__(self, *a, **k):
            raise Unprintable

    class Stop:
        def __dlpack__(self, *a, **k):
            raise KeyboardInterrupt

    assert "<unprintable>" in extract(Bad()).text
    with pytest.raises(KeyboardInterrupt):
        extract(Stop())


def test_to_float64_widens_every_real_dtype() -> None:
    """Integers, booleans and float32 become float64 values equal to the originals."""
    for a in (np.arange(4, dtype=np.int16), np.array([True, False]), np.array([0.1], np.float32)):
        got = to_float64(HostArray(a, a.dtype.name))
        assert got.dtype == np.float64 and np.array_equal(got, a.astype(np.float64))


def test_ml_dtypes_bfloat16_crosses_as_its_bit_patterns() -> None:
    """A NumPy bfloat16 array (ml_dtypes) is sent as 16-bit patterns named bfloat16, and widens exactly."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = np.array([1.0, -0.5, 3.0], dtype=ml_dtypes.bfloat16)
    h = extract(a)
    assert h.dtype == "bfloat16" and h.data.dtype == np.uint16
    assert to_float64(_roundtrip(h)).tolist() == [1.0, -0.5, 3.0]


def test_cupy_and_jax_arrays_are_copied_to_the_host(monkeypatch) -> None:
    """A CuPy array is read by ndarray.get (device 'cuda'); a JAX array by numpy.asarray, on its platform."""
    import sys
    import types

    class CupyArray:
        def __init__(self, a):
            self.a = a

        def get(self):
            return self.a

    class JaxArray:
        def __init__(self, a, platform):
            self.a, self.platform = a, platform

        def devices(self):
            return [types.SimpleNamespace(platform=self.platform)]

        def __array__(self, dtype=None, copy=None):
            return self.a

    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(ndarray=CupyArray))
    monkeypatch.setitem(sys.modules, "jax", types.SimpleNamespace(Array=JaxArray))
    a = np.arange(3.0, dtype=np.float32)
    h = extract(CupyArray(a))
    assert (h.framework, h.device, h.dtype) == ("cupy", "cuda", "float32") and np.array_equal(h.data, a)
    for platform, device in (("gpu", "cuda"), ("cuda", "cuda"), ("cpu", "cpu")):
        h = extract(JaxArray(a, platform))
        assert (h.framework, h.device) == ("jax", device) and np.array_equal(h.data, a)


def test_a_device_name_has_at_most_16_characters() -> None:
    """A device name of 16 identifier characters decodes; 17 is a ProtocolError."""
    base = {"kind": "array", "dtype": "float32", "shape": [0], "framework": "numpy"}
    assert decode(dict(base, device="d" * 16), b"").device == "d" * 16
    with pytest.raises(ProtocolError, match="bad device"):
        decode(dict(base, device="d" * 17), b"")
