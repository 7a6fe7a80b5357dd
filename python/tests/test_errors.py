"""Every exception class, raised by what it names, with the bank unchanged."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import deltamem
from conftest import DIM, unit


def test_hierarchy():
    assert issubclass(deltamem.NotFoundError, KeyError)
    assert issubclass(deltamem.InvalidInputError, ValueError)
    assert issubclass(deltamem.IoError, OSError)
    for cls in (
        deltamem.IoError,
        deltamem.LockedError,
        deltamem.CorruptError,
        deltamem.PoisonedError,
        deltamem.ReadOnlyError,
        deltamem.NotFoundError,
        deltamem.InvalidInputError,
        deltamem.ClosedError,
        deltamem.AgentError,
    ):
        assert issubclass(cls, deltamem.Error)


def test_locked_by_another_writer(bank, bank_path):
    with pytest.raises(deltamem.LockedError, match="locked"):
        deltamem.Bank.open(bank_path)
    started = time.monotonic()
    with pytest.raises(deltamem.LockedError, match="gave up after waiting"):
        deltamem.Bank.open(bank_path, lock_wait_s=0.3)
    assert time.monotonic() - started >= 0.3


def test_a_writer_waits_for_the_lock_to_be_released(bank, bank_path):
    # The holder lets go while the second open waits (without the GIL).
    releaser = threading.Timer(0.3, bank.close)
    releaser.start()
    with deltamem.Bank.open(bank_path, lock_wait_s=10.0) as second:
        assert second.path == bank.path
    releaser.join()


def test_not_found(bank, tmp_path):
    with pytest.raises(deltamem.NotFoundError) as e:
        bank.node(3)
    assert str(e.value) == "unknown node 3"  # not quoted, unlike a plain KeyError
    with pytest.raises(KeyError):
        bank.node("no-such-id")
    with pytest.raises(deltamem.NotFoundError, match="unknown tree"):
        bank.query("nope", unit(0))
    with pytest.raises(deltamem.NotFoundError, match="not a deltamem bank"):
        deltamem.Bank.open(tmp_path)


def test_invalid_input_leaves_the_bank_unchanged(bank):
    bank.insert("task", unit(0), "a")
    before = bank.stats()
    cases = [
        lambda: bank.insert("task", np.zeros(DIM), "zero vector"),
        lambda: bank.insert("task", [float("nan")] * DIM, "nan"),
        lambda: bank.insert("task", unit(0), ""),
        lambda: bank.insert("task", unit(0), "bad label", label="MAYBE"),
        lambda: bank.insert("task", unit(0), "bad payload", payload={"k": 3}),
        lambda: bank.insert("task", unit(0), "bad sync", sync="sometimes"),
        lambda: bank.insert("task", unit(0), "dup", external_id="x") and bank.insert("task", unit(1), "dup", external_id="x"),
        lambda: bank.query("task", unit(0), k=0),
        lambda: bank.query("task", unit(0), tau=float("inf")),
        lambda: bank.node(-1),
        lambda: bank.insert_many("task", np.ones((2, DIM)), ["only one scenario"]),
    ]
    for i, case in enumerate(cases):
        with pytest.raises(deltamem.InvalidInputError):
            case()
        assert isinstance(i, int)
    after = bank.stats()
    # only the first of the duplicate pair went in
    assert after["nodes"] == before["nodes"] + 1
    bank.close()
    with pytest.raises(deltamem.InvalidInputError, match="already"):
        deltamem.Bank.create(bank.path, DIM)
    with pytest.raises(ValueError, match="dim"):
        deltamem.Bank.create(bank.path.parent / "zero", 0)
    assert not (bank.path.parent / "zero").exists()


def test_io_failures_are_oserrors_naming_the_file(bank, tmp_path):
    import errno

    bank.insert("task", unit(0), "a")
    missing = tmp_path / "no-such-dir" / "m.npy"
    # Read by the engine (the reference importer) and by numpy (import_npy).
    for call in (
        lambda: bank.import_reference("task", tmp_path / "no-such.json"),
        lambda: bank.import_npy("task", missing),
        lambda: bank.export_npy("task", missing),
    ):
        with pytest.raises(deltamem.IoError) as e:
            call()
        assert isinstance(e.value, OSError) and e.value.errno == errno.ENOENT
        assert "no-such" in e.value.file and "no-such" in str(e.value)
    assert len(bank) == 1 and bank.verify().ok


def test_read_only(bank, bank_path):
    bank.insert("task", unit(0), "a")
    with deltamem.Bank.open(bank_path, read_only=True) as r:
        with pytest.raises(deltamem.ReadOnlyError):
            r.insert("task", unit(1), "b")
        with pytest.raises(deltamem.ReadOnlyError):
            r.success_hit(0)


def test_closed(bank):
    bank.close()
    with pytest.raises(deltamem.ClosedError):
        len(bank)


def test_corrupt_names_file_and_offset(bank_path):
    with deltamem.Bank.create(bank_path, DIM) as b:
        for i in range(4):
            b.insert("task", unit(i), f"s{i}", attach="root")
    table = sorted(p for p in os.listdir(bank_path) if p.startswith("nodes-"))[0]
    with open(bank_path / table, "r+b") as f:
        f.seek(70)
        byte = f.read(1)
        f.seek(70)
        f.write(bytes([byte[0] ^ 0xFF]))
    with deltamem.Bank.open(bank_path, read_only=True) as r:
        with pytest.raises(deltamem.CorruptError) as e:
            for node in r.nodes():
                pass
        assert table in e.value.file and e.value.offset_bytes >= 64
        assert table in str(e.value)
        report = r.verify()
        assert not report.ok and any(table in p.file for p in report.problems)


POISON_SCRIPT = r"""
import resource, signal, sys
import numpy as np
import deltamem

path = sys.argv[1]
bank = deltamem.Bank.open(path)
bank.insert("task", np.eye(8, dtype=np.float32)[1], "acknowledged", attach="root")
# Writes past this size fail with EFBIG (SIGXFSZ ignored): the next WAL
# record cannot be written.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
wal_size = __import__("os").path.getsize(path + "/wal.log")
resource.setrlimit(resource.RLIMIT_FSIZE, (wal_size + 100, resource.RLIM_INFINITY))
try:
    # Incompressible: the record must outgrow the zeros the WAL keeps
    # written ahead of its records (FORMAT.md section 6), so it grows the file.
    big = __import__("base64").b64encode(__import__("os").urandom(75_000)).decode()
    bank.insert("task", np.eye(8, dtype=np.float32)[2], big, attach="root")
except deltamem.Error as e:
    print("first:", type(e).__name__, isinstance(e, OSError), e.errno, e)
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
try:
    bank.insert("task", np.eye(8, dtype=np.float32)[3], "after", attach="root")
except deltamem.PoisonedError as e:
    print("second: PoisonedError", e)
print("query still works:", bank.query("task", np.eye(8, dtype=np.float32)[1])[0].id)
"""


def test_poisoned_after_a_failed_write(bank_path, tmp_path):
    """A WAL write that fails (file size limit reached) poisons the handle:
    the next write is refused with PoisonedError until the bank is
    reopened; what was acknowledged before is kept."""
    with deltamem.Bank.create(bank_path, DIM) as b:
        b.insert("task", unit(0), "kept", attach="root")
    script = tmp_path / "poison.py"
    script.write_text(POISON_SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), str(bank_path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    # EFBIG, as an OSError naming the WAL.
    assert lines[0].startswith("first: IoError True 27 ") and "wal.log" in lines[0], out.stdout
    assert lines[1].startswith("second: PoisonedError"), out.stdout
    assert lines[2] == "query still works: 1"
    with deltamem.Bank.open(bank_path) as b:
        assert [n.scenario for n in b.nodes()] == ["kept", "acknowledged"]
        assert b.verify().ok
