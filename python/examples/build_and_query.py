#!/usr/bin/env python3
"""Build a bank from a NumPy matrix, freeze it, query it from several
processes at once.

A frozen bank is a compacted, read-only copy: any number of processes can
open it (it is memory mapped, so they share one copy in the page cache).
The answers are checked against NumPy brute force.

    .venv/bin/python python/examples/build_and_query.py [rows] [processes]
"""

from __future__ import annotations

import multiprocessing
import pathlib
import sys
import tempfile
import time

import numpy as np

import deltamem

DIM = 384


def worker(args: tuple[str, int, int]) -> tuple[int, list[int]]:
    frozen, seed, count = args
    queries = np.random.default_rng(seed).standard_normal((count, DIM), dtype=np.float32)
    with deltamem.Bank.open(frozen, read_only=True) as bank:
        ids, _scores = bank.query_batch("docs", queries, k=1, tau=-1.0)
    return seed, ids[:, 0].tolist()


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    processes = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    work = pathlib.Path(tempfile.mkdtemp(prefix="deltamem-build-"))
    # Any float matrix works: a Parquet column read with pyarrow becomes one
    # with `np.stack(table["embedding"].to_numpy(zero_copy_only=False))`.
    matrix = np.random.default_rng(0).standard_normal((rows, DIM), dtype=np.float32)

    with deltamem.Bank.create(work / "live", DIM, trees={"docs": -1.0}) as bank:
        t = time.perf_counter()
        ids = bank.load("docs", matrix, scenarios=[f"document {i}" for i in range(rows)])
        print(f"loaded {len(ids):,} rows in {time.perf_counter() - t:.2f} s")
        report = bank.freeze(work / "frozen")
        print(f"frozen copy: {report['nodes']:,} nodes, {report['bytes_written'] / 1e6:.0f} MB at {report['out']}")

    jobs = [(str(work / "frozen"), 100 + p, 16) for p in range(processes)]
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        answers = pool.map(worker, jobs)

    normalised = matrix / np.linalg.norm(matrix, axis=1, keepdims=True)
    for seed, got in answers:
        queries = np.random.default_rng(seed).standard_normal((16, DIM), dtype=np.float32)
        expected = np.argmax(queries @ normalised.T, axis=1).tolist()
        assert got == expected, (seed, got, expected)
        print(f"process {seed}: 16 queries, best matches {got[:4]}... equal to NumPy brute force")


if __name__ == "__main__":
    main()
