"""Verification on the host: numpy stands in for the device and for the kernel."""

from __future__ import annotations

import numpy as np
import pytest

from l2gen.verify import (
    POISON_BYTE,
    SAMPLE_ROWS,
    TOLERANCE,
    HostDevice,
    NumpyReference,
    make_inputs,
    reference,
    relerr,
    sample_rows,
    verify,
)


def matmul(a, b, c, *, layout="kn", k_used=None, transposed=False):
    """The fake kernel: fp32 accumulation, fp16 output, like the real ones."""
    k = a.shape[1] if k_used is None else k_used
    b32 = b.astype(np.float32)
    rhs = b32[:k] if layout == "kn" else b32[:, :k].T
    out = (a[:, :k].astype(np.float32) @ rhs).astype(np.float16)
    c[...] = out.T if transposed else out


# ---- pieces ---------------------------------------------------------------------------


def test_relerr():
    ref = np.arange(1.0, 13.0).reshape(3, 4)
    assert relerr(ref.astype(np.float16), ref) == 0.0
    assert relerr(ref * (1 + 1e-3), ref) == pytest.approx(1e-3)
    bad = ref.copy()
    bad[1, 2] = np.nan
    assert relerr(bad, ref) == float("inf")
    assert relerr(np.ones((2, 2)), np.zeros((2, 2))) == pytest.approx(2.0)


def test_poison_is_nan():
    c = HostDevice().alloc((3, 5))
    HostDevice().poison(c)
    assert np.isnan(c).all()
    assert c.view(np.uint16)[0, 0] == POISON_BYTE * 0x101


def test_inputs_are_fresh_normal_fp16_per_seed():
    a0, b0, _ = make_inputs(64, 48, 96, 0)
    a0b, _, _ = make_inputs(64, 48, 96, 0)
    a1, b1, _ = make_inputs(64, 48, 96, 1)
    assert a0.dtype == np.float16 and a0.shape == (64, 96) and b0.shape == (96, 48)
    assert np.array_equal(a0, a0b)
    assert not np.array_equal(a0, a1) and not np.array_equal(b0, b1)
    assert np.count_nonzero(a0) > 0.99 * a0.size  # never zeros
    assert 0.9 < a0.astype(np.float64).std() < 1.1
    assert not a0.flags.writeable  # cached: nobody may change them
    _, bn, _ = make_inputs(64, 48, 96, 0, "nk")
    assert bn.shape == (48, 96)


def test_sample_rows():
    rng = np.random.default_rng(0)
    assert np.array_equal(sample_rows(100, rng), np.arange(100))
    rows = sample_rows(10_000, np.random.default_rng(1))
    assert len(rows) == SAMPLE_ROWS == len(set(rows.tolist()))
    assert np.all(np.diff(rows) > 0) and rows.max() < 10_000
    assert np.array_equal(rows, sample_rows(10_000, np.random.default_rng(1)))


def test_reference_layouts_and_rows():
    a, b, _ = make_inputs(20, 12, 16, 0, "kn")
    full = reference(a, b, "kn")
    assert full.dtype == np.float64
    assert np.allclose(full, a.astype(np.float64) @ b.astype(np.float64))
    assert np.allclose(reference(a, b, "kn", rows=np.array([3, 7])), full[[3, 7]])
    assert np.allclose(reference(a, np.ascontiguousarray(b.T), "nk"), full)


# ---- the check ------------------------------------------------------------------------


def test_correct_kernel_passes():
    r = verify(lambda a, b, c: matmul(a, b, c), 64, 96, 128)
    assert r.ok and r.error is None and r.seeds == 3
    assert 0 < r.relerr < TOLERANCE  # fp16 output rounding, about 3e-4
    assert r.reference == "numpy"


@pytest.mark.parametrize("m,n,k", [(1, 1, 8), (37, 53, 24), (129, 7, 200), (5, 300, 8)])
def test_odd_shapes(m, n, k):
    assert verify(lambda a, b, c: matmul(a, b, c), m, n, k).ok


def test_nk_layout():
    assert verify(lambda a, b, c: matmul(a, b, c, layout="nk"), 40, 24, 32, b_layout="nk").ok
    # a kn kernel fed an nk problem is wrong
    assert not verify(lambda a, b, c: matmul(a, b, c), 24, 24, 24, b_layout="nk").ok


def test_column_major_output():
    kernel = lambda a, b, c: matmul(a, b, c, transposed=True)  # noqa: E731
    assert verify(kernel, 33, 20, 16, c_transposed=True).ok
    assert not verify(kernel, 20, 20, 16).ok  # read as row-major it is wrong


def test_skipping_part_of_k_is_wrong():
    r = verify(lambda a, b, c: matmul(a, b, c, k_used=120), 64, 64, 128)
    assert not r.ok
    assert r.relerr > TOLERANCE and "relerr" in r.error and r.seeds == 1


def test_unwritten_output_is_caught_by_the_poison():
    def partial(a, b, c):
        tmp = np.empty_like(c)
        matmul(a, b, tmp)
        c[:-1] = tmp[:-1]  # last row never written

    r = verify(partial, 16, 16, 16)
    assert not r.ok and r.relerr is None and "NaN" in r.error and "16 of 256" in r.error


def test_unwritten_rows_outside_the_sample_are_still_caught():
    m = 2000  # > SAMPLE_ROWS: relerr uses a sample, the NaN check every row

    def partial(a, b, c):
        tmp = np.empty_like(c)
        matmul(a, b, tmp)
        c[: m - 1] = tmp[: m - 1]

    r = verify(partial, m, 16, 16)
    assert not r.ok and "NaN" in r.error


def test_spread_error_is_caught_through_the_row_sample():
    def every_fourth_row_zero(a, b, c):
        matmul(a, b, c)
        c[::4] = 0

    r = verify(every_fourth_row_zero, 4000, 32, 64, seeds=1)
    assert not r.ok and r.relerr > 0.1


def test_sampled_reference_uses_only_the_sample():
    seen = []

    class Spy(NumpyReference):
        def compare(self, device, c_handle, a, b, b_layout, rng, c_transposed):
            seen.append(len(sample_rows(a.shape[0], np.random.default_rng(0), self.sample_limit)))
            return super().compare(device, c_handle, a, b, b_layout, rng, c_transposed)

    assert verify(lambda a, b, c: matmul(a, b, c), 300, 16, 16, reference=Spy(8), seeds=1).ok
    assert seen == [8]


def test_a_kernel_that_caches_its_result_is_caught():
    """Results cached across calls: the second seed has new inputs in the same buffers."""
    cache = {}

    def memo(a, b, c):
        key = (id(a), id(b), id(c))
        if key not in cache:
            matmul(a, b, c)
            cache[key] = c.copy()
        else:
            c[...] = cache[key]

    r = verify(memo, 32, 32, 32)
    assert not r.ok and r.seeds == 2


def test_a_kernel_that_skips_repeat_calls_is_caught():
    calls = []

    def once(a, b, c):
        calls.append(1)
        if len(calls) == 1:
            matmul(a, b, c)

    r = verify(once, 32, 32, 32)
    assert not r.ok and "NaN" in r.error


def test_given_buffers_are_reused_and_kept():
    dev = HostDevice()
    bufs = (dev.alloc((8, 16)), dev.alloc((16, 8)), dev.alloc((8, 8)))
    seen = set()

    def kernel(a, b, c):
        seen.add((id(a), id(b), id(c)))
        matmul(a, b, c)

    assert verify(kernel, 8, 8, 16, buffers=bufs).ok
    assert seen == {tuple(id(x) for x in bufs)}
    a, b, _ = make_inputs(8, 8, 16, 2)
    assert np.array_equal(bufs[0], a)  # the last seed's inputs are left in place


def test_a_crashing_kernel_raises():
    def boom(a, b, c):
        raise RuntimeError("launch failed")

    with pytest.raises(RuntimeError):
        verify(boom, 8, 8, 8)
