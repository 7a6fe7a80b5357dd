"""Banks written by the `deltamem` command read from Python, and banks
written from Python read by the command: the same files, the same answers."""

from __future__ import annotations

import json
import subprocess

import numpy as np

import deltamem
from conftest import DIM, near, random_rows, unit


def run(cli, *args, stdin: str = "") -> list[dict]:
    out = subprocess.run(
        [str(cli), "--quiet", *map(str, args)], input=stdin, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def test_cli_bank_read_from_python_and_written_back(cli, tmp_path):
    path = tmp_path / "bank"
    run(cli, "init", "--dim", DIM, path)
    lines = [
        {"tree": "task", "embedding": unit(0).tolist(), "scenario": "cli root", "payload": {"k": "v"},
         "attach": "auto", "label": "SUCCESS", "id": "cli-a"},
        {"tree": "task", "embedding": near(0, 1).tolist(), "scenario": "cli child", "payload": {}, "attach": "auto",
         "label": "FAILURE"},
    ]
    acks = run(cli, "insert", path, stdin="\n".join(json.dumps(l) for l in lines) + "\n")
    assert [a["id"] for a in acks] == [0, 1]

    with deltamem.Bank.open(path) as bank:
        assert bank.node("cli-a").payload == {"k": "v"}
        assert bank.node(1).label == "FAILURE" and bank.chain(1) == [0, 1]
        m = bank.query("task", near(0, 1), k=2)
        py_ack = bank.insert("task", unit(4), "from python", payload={"p": "q"}, external_id="py-b")

    dump = run(cli, "dump", path)
    assert [d["scenario"] for d in dump] == ["cli root", "cli child", "from python"]
    assert dump[2]["payload"] == {"p": "q"} and dump[2]["external_id"] == "py-b" and dump[2]["id"] == py_ack.id
    answer = run(cli, "query", path, stdin=json.dumps({"tree": "task", "embedding": near(0, 1).tolist(), "k": 2}) + "\n")
    cli_matches = answer[0]["matches"]
    assert [c["id"] for c in cli_matches] == [x.id for x in m]
    for c, x in zip(cli_matches, m):
        assert abs(c["score"] - x.score) < 1e-6 and c["chain"] == x.chain
    verify = subprocess.run([str(cli), "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_npy_import_by_cli_equals_load_from_python(cli, tmp_path):
    rows = random_rows(500, seed=12)
    npy = tmp_path / "rows.npy"
    np.save(npy, rows)
    by_cli = tmp_path / "cli"
    run(cli, "init", "--dim", DIM, by_cli)
    run(cli, "import", by_cli, "--tree", "env", "--npy", npy)
    with deltamem.Bank.create(tmp_path / "py", DIM) as bank:
        bank.load("env", rows)
        with deltamem.Bank.open(by_cli, read_only=True) as other:
            np.testing.assert_array_equal(bank.embeddings("env")[1], other.embeddings("env")[1])
            assert [n.scenario for n in bank.nodes()] == [n.scenario for n in other.nodes()]
            q = rows[::50]
            a = bank.query_batch("env", q, k=3, tau=-1.0)
            b = other.query_batch("env", q, k=3, tau=-1.0)
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_array_equal(a[1], b[1])
