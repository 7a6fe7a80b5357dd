"""NumPy input: float32 C-contiguous read in place, other floats and
strided arrays converted, wrong shapes and dtypes refused by name."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import deltamem
from conftest import DIM, random_rows, unit


def numpy_peak_bytes(call) -> int:
    """Peak bytes NumPy allocated during `call` (tracemalloc sees NumPy's
    buffers, not the Rust side's)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        call()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_float32_c_contiguous_is_not_copied(bank):
    rows = random_rows(20_000, seed=7)  # 640 kB
    bank.insert("task", unit(0), "a")
    size = rows.nbytes
    peak32 = numpy_peak_bytes(lambda: bank.query_batch("task", rows, k=1))
    peak64 = numpy_peak_bytes(lambda: bank.query_batch("task", rows.astype(np.float64), k=1))
    # The float32 call allocates only its small result arrays; the float64
    # one also its float32 copy (the float64 input itself is made outside).
    assert peak32 < size / 4, peak32
    assert peak64 >= size, peak64


@pytest.mark.parametrize(
    "make",
    [
        lambda v: v.astype(np.float64),
        lambda v: v.astype(np.float16),
        lambda v: np.repeat(v, 2)[::2],  # strided view
        lambda v: list(map(float, v)),
        lambda v: tuple(v.tolist()),
    ],
    ids=["float64", "float16", "strided", "list", "tuple"],
)
def test_single_vectors_in_any_float_form(bank, make):
    bank.insert("task", unit(0), "a")
    v = unit(0)
    got = bank.query("task", make(v))
    assert got and got[0].id == 0 and got[0].score == pytest.approx(1.0)
    ack = bank.insert("task", make(unit(4)), "b", attach="root")
    assert bank.embeddings("task")[1][ack.id][4] == pytest.approx(1.0)


def test_matrices_in_any_float_form(bank):
    rows = random_rows(10, seed=8)
    fortran = np.asfortranarray(rows)
    assert not fortran.flags.c_contiguous
    bank.insert_many("task", fortran, [f"s{i}" for i in range(10)], attach="root")
    bank.load("env", rows.astype(np.float64))
    a = bank.embeddings("task")[1]
    b = bank.embeddings("env")[1]
    np.testing.assert_allclose(a, b, atol=1e-6)
    ids, _ = bank.query_batch("task", rows[::2].astype(np.float16), k=1)
    assert ids[:, 0].tolist() == [0, 2, 4, 6, 8]
    ids, _ = bank.query_batch("task", rows[:2].tolist(), k=1)  # list of rows
    assert ids[:, 0].tolist() == [0, 1]


@pytest.mark.parametrize(
    "value, words",
    [
        (np.zeros(DIM + 1, dtype=np.float32), ["shape [9]", "float32", f"({DIM},)"]),
        (np.zeros((1, DIM), dtype=np.float32), ["shape [1, 8]", f"({DIM},)"]),
        (np.arange(DIM), ["int64", "floats"]),
        (np.zeros(DIM, dtype=np.complex64), ["complex64"]),
        ([1.0, 2.0], ["2 numbers", "8"]),
        (["a"] * DIM, ["not all numbers"]),
        ("text", ["str"]),
    ],
)
def test_bad_single_vectors_are_refused_by_name(bank, value, words):
    with pytest.raises(ValueError) as e:
        bank.query("task", value)
    assert isinstance(e.value, deltamem.InvalidInputError)
    for word in words:
        assert word in str(e.value), (word, str(e.value))
    with pytest.raises(deltamem.InvalidInputError):
        bank.insert("task", value, "x")
    assert len(bank) == 0


@pytest.mark.parametrize(
    "value, words",
    [
        (np.zeros(DIM, dtype=np.float32), ["shape [8]", "(n, 8)"]),
        (np.zeros((3, DIM + 1), dtype=np.float64), ["shape [3, 9]", "float64", "(n, 8)"]),
        (np.zeros((2, 2, DIM), dtype=np.float32), ["shape [2, 2, 8]"]),
        (np.ones((2, DIM), dtype=np.int32), ["int32"]),
    ],
)
def test_bad_matrices_are_refused_by_name(bank, value, words):
    for call in (
        lambda: bank.query_batch("task", value),
        lambda: bank.insert_many("task", value, ["s"] * 3),
        lambda: bank.load("task", value),
    ):
        with pytest.raises(deltamem.InvalidInputError) as e:
            call()
        for word in words:
            assert word in str(e.value), (word, str(e.value))
    assert len(bank) == 0


def test_empty_matrix_is_a_no_op(bank):
    empty = np.zeros((0, DIM), dtype=np.float32)
    assert bank.insert_many("task", empty, []) == []
    ids, scores = bank.query_batch("task", empty, k=2)
    assert ids.shape == (0, 2) and scores.shape == (0, 2)
