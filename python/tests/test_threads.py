"""One Bank shared by Python threads: readers in parallel with a writer,
writes serialised, the GIL released while the engine works."""

from __future__ import annotations

import threading
import time

import numpy as np

import deltamem
from conftest import DIM, random_rows, unit

DIM_BIG = 256


def test_readers_and_writers_share_one_bank(tmp_path):
    rows = random_rows(4000, seed=9)
    with deltamem.Bank.create(tmp_path / "b", DIM) as bank:
        bank.load("env", rows[:1000])
        errors: list[BaseException] = []
        acked: dict[int, list[int]] = {}

        def writer(w: int) -> None:
            try:
                ids = []
                for i in range(50):
                    chunk = rows[1000 + w * 500 + i * 10 : 1000 + w * 500 + (i + 1) * 10]
                    acks = bank.insert_many("task", chunk, [f"w{w}-{i}-{j}" for j in range(10)], attach="root")
                    ids += [a.id for a in acks]
                acked[w] = ids
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        def reader() -> None:
            try:
                for i in range(200):
                    q = rows[i]
                    m = bank.query("env", q, k=1)
                    # env rows were loaded before the threads and never change
                    assert m[0].id == i, (i, m)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
        threads += [threading.Thread(target=reader) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors
        all_ids = sorted(i for ids in acked.values() for i in ids)
        assert all_ids == list(range(1000, 3000))  # no id twice, none lost
        # each writer's batches are whole: ids of one batch are consecutive
        for ids in acked.values():
            for b in range(0, len(ids), 10):
                assert ids[b : b + 10] == list(range(ids[b], ids[b] + 10))
        for node in bank.nodes("task"):
            w, i, j = map(int, node.scenario[1:].split("-"))
            expected = rows[1000 + w * 500 + i * 10 + j]
            got = bank.embeddings()[1][node.id]
            np.testing.assert_allclose(got, expected / np.linalg.norm(expected), atol=1e-6)
            break
        assert bank.verify().ok


def test_the_gil_is_released_during_a_scan(tmp_path):
    """A pure-Python counter thread keeps counting while the main thread is
    inside one long query_batch call; with the GIL held it would stand
    still for the whole call."""
    rows = random_rows(60_000, dim=DIM_BIG, seed=10)
    with deltamem.Bank.create(tmp_path / "b", DIM_BIG) as bank:
        bank.load("task", rows)
        queries = rows[:128]
        ticks = 0
        done = threading.Event()

        def counter() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1

        t = threading.Thread(target=counter)
        t.start()
        before = ticks
        time.sleep(0.2)
        free_rate = (ticks - before) / 0.2  # counts per second, GIL free
        start_ticks = ticks
        start = time.perf_counter()
        bank.query_batch("task", queries, k=1)
        during = ticks - start_ticks
        scan_s = time.perf_counter() - start
        done.set()
        t.join()
        assert scan_s > 0.05, scan_s  # long enough to tell
        assert during > 0.2 * free_rate * scan_s, (during, free_rate, scan_s)
