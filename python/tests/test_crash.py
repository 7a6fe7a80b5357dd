"""kill -9 of a Python writer in the middle of insert_many: every batch the
ledger says was acknowledged is in the bank after reopening, whole, with
its vectors and payloads; no batch is there in part."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import numpy as np

import deltamem

DIM = 64
BATCH_ROWS = 200

WRITER = r"""
import os, sys
import numpy as np
import deltamem

path, ledger_path, first = sys.argv[1], sys.argv[2], int(sys.argv[3])
bank = deltamem.Bank.open(path, sync="batch")
ledger = open(ledger_path, "a")
batch = first
while True:
    rows = np.random.default_rng(batch).standard_normal(({rows}, {dim})).astype(np.float32)
    bank.insert_many(
        "task", rows, [f"b{{batch}}-{{j}}" for j in range({rows})],
        payloads=[{{"batch": str(batch)}}] * {rows},
        attach="root", external_ids=[f"b{{batch}}-{{j}}" for j in range({rows})],
    )
    bank.sync()  # acknowledged and durable: only now into the ledger
    ledger.write(f"{{batch}}\n"); ledger.flush(); os.fsync(ledger.fileno())
    batch += 1
""".format(rows=BATCH_ROWS, dim=DIM)


def read_ledger(path) -> list[int]:
    if not os.path.exists(path):
        return []
    # a line cut by the kill has no newline: not acknowledged
    text = open(path).read()
    return [int(line) for line in text.split("\n")[:-1] if line]


def test_kill_9_mid_insert_many_loses_no_acknowledged_batch(tmp_path):
    path = tmp_path / "bank"
    deltamem.Bank.create(path, DIM).close()
    ledger = tmp_path / "ledger"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    rng = random.Random(int(time.time()))
    next_batch = 0
    kills = 0
    for cycle in range(6):
        child = subprocess.Popen(
            [sys.executable, str(script), str(path), str(ledger), str(next_batch)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(rng.uniform(0.4, 1.2))
        if child.poll() is not None:
            raise AssertionError(f"writer exited early: {child.stderr.read().decode()}")
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        kills += 1
        # Batches in the bank but not in the ledger (acked, killed before
        # the ledger line) are kept; the next writer starts after them.
        with deltamem.Bank.open(path, read_only=True) as bank:
            present = {int(n.payload["batch"]) for n in bank.nodes()}
        next_batch = max(present | set(read_ledger(ledger)) | {-1}) + 1

    acknowledged = read_ledger(ledger)
    assert kills == 6 and len(acknowledged) > 6, acknowledged
    with deltamem.Bank.open(path) as bank:  # writer open: recovery
        assert bank.verify().ok
        by_batch: dict[int, list] = {}
        for node in bank.nodes():
            by_batch.setdefault(int(node.payload["batch"]), []).append(node)
        for batch in acknowledged:
            assert batch in by_batch, f"acknowledged batch {batch} lost"
        ids, vectors = bank.embeddings("task")
        for batch, nodes in by_batch.items():
            assert len(nodes) == BATCH_ROWS, f"batch {batch} is partial: {len(nodes)} rows"
            rows = np.random.default_rng(batch).standard_normal((BATCH_ROWS, DIM)).astype(np.float32)
            for j, node in enumerate(nodes):
                assert node.scenario == f"b{batch}-{j}" and node.external_id == f"b{batch}-{j}"
                want = rows[j] / np.linalg.norm(rows[j])
                np.testing.assert_allclose(vectors[node.id], want, atol=1e-6)
        assert sorted(by_batch) == list(range(len(by_batch))), "a batch id went missing in between"
