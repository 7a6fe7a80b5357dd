"""Every Bank method against what it must return or change."""

from __future__ import annotations

import json

import numpy as np
import pytest

import deltamem
from conftest import DIM, near, random_rows, unit


def test_create_options_are_kept(tmp_path):
    path = tmp_path / "b"
    with deltamem.Bank.create(
        path, DIM, trees={"skills": 0.7, "scenes": 0.9}, eps=0.1, max_depth=3, consolidate_after=2, precision="f16"
    ) as b:
        assert b.trees == pytest.approx({"skills": 0.7, "scenes": 0.9})
        assert list(b.trees) == ["skills", "scenes"]
        assert b.dim == DIM and b.precision == "f16" and not b.read_only
        assert b.path == path
    with deltamem.Bank.open(path, read_only=True) as r:
        assert r.read_only and r.precision == "f16" and r.stats()["dim"] == DIM


def test_insert_auto_attaches_under_a_similar_node(bank):
    root = bank.insert("task", unit(0), "first", payload={"procedure": "do x"})
    assert (root.id, root.type, root.parent, root.depth, root.matched) == (0, "ROOT", None, 1, None)
    child = bank.insert("task", near(0, 1), "second", label="FAILURE")
    assert child.type == "RESIDUAL" and child.parent == 0 and child.depth == 2
    assert child.matched[0] == 0 and child.matched[1] == pytest.approx(0.995, abs=1e-3)
    other = bank.insert("task", unit(3), "unrelated")
    assert other.parent is None
    forced = bank.insert("task", unit(5), "under root 0", attach=0)
    assert forced.parent == 0
    new_root = bank.insert("task", unit(0), "forced root", attach="root")
    assert new_root.parent is None and new_root.type == "ROOT"
    assert child.lsn < other.lsn < forced.lsn < new_root.lsn
    assert len(bank) == 5


def test_node_payload_and_external_id(bank):
    bank.insert("env", unit(1), "kitchen", payload={"a": "1", "b": "two"}, external_id="ext-7")
    node = bank.node(0)
    assert node.scenario == "kitchen" and node.payload == {"a": "1", "b": "two"}
    assert node.external_id == "ext-7" and node.tree == "env" and node.label == "SUCCESS"
    assert bank.node("ext-7") == node
    assert bank.resolve_id("ext-7") == 0
    child = bank.insert("env", unit(2), "attached by external id", attach="ext-7")
    assert child.parent == 0


def test_query_ranks_penalises_failures_and_returns_chains(bank):
    bank.insert("task", unit(0), "root")
    bank.insert("task", near(0, 1), "child")
    bank.insert("task", near(0, 2, 0.05), "failed", label="FAILURE", attach="root")
    matches = bank.query("task", unit(0), k=3)
    assert [m.id for m in matches][0] == 0 and matches[0].score == pytest.approx(1.0)
    failed = [m for m in matches if m.id == 2][0]
    # cos(unit0, near(0,2,0.05)) = 0.99875, minus eps 0.05
    assert failed.label == "FAILURE" and failed.score == pytest.approx(0.99875 - 0.05, abs=1e-4)
    child = [m for m in matches if m.id == 1][0]
    assert child.chain == [0, 1] and child.depth == 2 and child.type == "RESIDUAL"
    assert bank.query("task", unit(0), k=3, eps=0.0)[1].id == 2
    assert bank.query("task", unit(7)) == []
    assert bank.query("task", unit(7), tau=-1.0)[0].score == pytest.approx(0.0, abs=1e-6)
    assert bank.query("env", unit(0)) == []


def test_query_batch_equals_single_queries(bank):
    rows = random_rows(300, seed=1)
    bank.insert_many("task", rows[:200], [f"s{i}" for i in range(200)], attach="root")
    queries = rows[150:300]
    ids, scores = bank.query_batch("task", queries, k=3, tau=-1.0)
    assert ids.shape == (150, 3) and scores.shape == (150, 3)
    assert ids.dtype == np.int64 and scores.dtype == np.float32
    for q in range(0, 150, 7):
        single = bank.query("task", queries[q], k=3, tau=-1.0)
        assert list(ids[q]) == [m.id for m in single]
        np.testing.assert_allclose(scores[q], [m.score for m in single], rtol=0, atol=0)
    ids, scores, chains = bank.query_batch("task", queries[:2], k=1, chains=True)
    assert chains[0] == [[int(ids[0, 0])]]


def test_query_batch_marks_missing_matches(bank):
    bank.insert("task", unit(0), "only")
    ids, scores = bank.query_batch("task", np.stack([unit(0), unit(4)]), k=2)
    assert ids.tolist() == [[0, -1], [-1, -1]]
    assert scores[0, 0] == pytest.approx(1.0) and np.isnan(scores[0, 1]) and np.isnan(scores[1]).all()


def test_insert_many_is_one_transaction(bank):
    rows = random_rows(50, seed=2)
    acks = bank.insert_many(
        "task",
        rows,
        [f"s{i}" for i in range(50)],
        payloads=[{"i": str(i)} for i in range(50)],
        labels=["SUCCESS", "FAILURE"] * 25,
        attach="root",
        external_ids=[f"e{i}" for i in range(50)],
    )
    assert [a.id for a in acks] == list(range(50))
    assert len({a.lsn for a in acks}) == 1
    assert bank.node(49).payload == {"i": "49"} and bank.node(49).label == "FAILURE"
    assert bank.node("e10").id == 10
    # A refused item refuses the lot, naming its position.
    bad = random_rows(3, seed=3)
    bad[2, 0] = np.nan
    with pytest.raises(deltamem.InvalidInputError) as e:
        bank.insert_many("task", bad, ["a", "b", "c"], attach="root")
    assert e.value.position == 2 and "component" in str(e.value)
    assert len(bank) == 50


def test_load_and_embeddings_round_trip(bank):
    rows = random_rows(1000, seed=4)
    ids = bank.load("env", rows, scenarios=[f"r{i}" for i in range(1000)])
    assert ids.dtype == np.int64 and ids.tolist() == list(range(1000))
    assert bank.stats()["checkpointed_nodes"] == 1000 and bank.stats()["wal_bytes"] < 1000
    got_ids, vectors = bank.embeddings("env")
    assert got_ids.tolist() == list(range(1000)) and vectors.shape == (1000, DIM)
    expected = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    np.testing.assert_allclose(vectors, expected, atol=1e-6)
    assert bank.node(5).scenario == "r5" and bank.node(5).type == "ROOT"
    # scenarios default to "row N", like `deltamem import --npy`
    more = bank.load("task", rows[:2])
    assert bank.node(int(more[1])).scenario == "row 1"
    assert bank.embeddings("task")[0].tolist() == more.tolist()


def test_nodes_iterates_by_tree(bank):
    bank.insert("task", unit(0), "t0")
    bank.insert("env", unit(1), "e0")
    bank.insert("task", unit(2), "t1")
    assert [n.scenario for n in bank.nodes("task")] == ["t0", "t1"]
    assert [n.id for n in bank.nodes()] == [0, 1, 2]
    it = bank.nodes("env")
    assert len(it) == 1 and next(it).scenario == "e0"
    with pytest.raises(StopIteration):
        next(it)


def test_chain_and_render_chain(bank):
    bank.insert("task", unit(0), "root scenario", payload={"procedure": "step one"})
    bank.insert("task", near(0, 1), "child scenario", payload={"procedure": "step two"})
    assert bank.chain(1) == [0, 1]
    text = bank.render_chain(1)
    assert "step one" in text and "step two" in text and text.index("step one") < text.index("step two")


def test_success_hits_due_and_consolidate(tmp_path):
    with deltamem.Bank.create(tmp_path / "b", DIM, consolidate_after=2) as bank:
        bank.insert("task", unit(0), "root")
        bank.insert("task", near(0, 1), "child")
        first = bank.success_hit(1)
        assert (first.id, first.success_hits, first.due) == (1, 1, False)
        second = bank.success_hit(1)
        assert second.success_hits == 2 and second.due and second.lsn > first.lsn
        assert bank.due("task") == [1] and bank.due("env") == [] and bank.due() == [1]
        ack = bank.consolidate(1, {"procedure": "merged"})
        assert ack.source == 1 and ack.new_root == 2
        assert bank.node(1).consolidated and bank.node(2).consolidated_root
        assert bank.node(2).payload["procedure"] == "merged"
        assert bank.due() == []
        # a consolidated node is skipped unless asked for
        ids = [m.id for m in bank.query("task", near(0, 1), k=5)]
        assert 1 not in ids
        assert 1 in [m.id for m in bank.query("task", near(0, 1), k=5, include_consolidated=True)]


def test_record_retrievals_counts_each_node_once(bank):
    bank.insert("task", unit(0), "a")
    bank.insert("task", unit(3), "b")
    lsn = bank.record_retrievals([0, 1, 1])
    assert lsn > 0
    assert bank.node(0).retrievals == 1 and bank.node(1).retrievals == 1


def test_checkpoint_sync_stats_verify(bank):
    bank.insert("task", unit(0), "a")
    assert bank.stats()["checkpointed_nodes"] == 0
    bank.sync()
    bank.checkpoint()
    stats = bank.stats()
    assert stats["checkpointed_nodes"] == 1 and stats["nodes"] == 1
    assert stats["trees"]["task"]["roots"] == 1 and stats["trees"]["task"]["depth_histogram"][0] == 1
    report = bank.verify()
    assert report.ok and bool(report) and report.nodes_checked == 1 and report.problems == []


def test_freeze_and_compact(bank, tmp_path):
    for i in range(4):
        bank.insert("task", unit(i), f"s{i}", attach="root")
    frozen = tmp_path / "frozen"
    report = bank.freeze(frozen)
    assert report["nodes"] == 4 and report["bytes_written"] > 0
    with deltamem.Bank.open(frozen, read_only=True) as f:
        assert len(f) == 4 and f.stats()["frozen"]
        assert f.query("task", unit(2))[0].id == 2
    with pytest.raises(deltamem.Error):
        bank.freeze(frozen)  # exists already
    compacted = bank.compact()
    assert compacted["nodes"] == 4 and compacted["bytes_after"] <= compacted["bytes_before"]
    assert bank.verify().ok


def test_context_manager_checkpoints_and_closes(bank_path):
    with deltamem.Bank.create(bank_path, DIM) as b:
        b.insert("task", unit(0), "a")
    assert b.closed
    with pytest.raises(deltamem.ClosedError):
        b.query("task", unit(0))
    b.close()  # a second close is a no-op
    with deltamem.Bank.open(bank_path, read_only=True) as r:
        assert r.stats()["checkpointed_nodes"] == 1  # closed with a checkpoint
    # also closed when the block raises
    with pytest.raises(RuntimeError):
        with deltamem.Bank.open(bank_path) as w:
            raise RuntimeError("boom")
    assert w.closed
    with deltamem.Bank.open(bank_path) as w2:  # the lock was released
        assert len(w2) == 1


def test_reader_refresh_sees_new_writes(bank, bank_path):
    bank.insert("task", unit(0), "a")
    reader = deltamem.Bank.open(bank_path, read_only=True)
    bank.insert("task", unit(3), "b")
    assert len(reader) == 1
    reader.refresh()
    assert len(reader) == 2 and reader.node(1).scenario == "b"
    reader.close()


def test_query_threads_gives_the_same_answers(bank):
    rows = random_rows(40_000, seed=5)
    bank.load("task", rows)
    single = bank.query("task", rows[7], k=5, tau=-1.0)
    bank.set_query_threads(2)
    assert bank.query_threads == 2
    assert bank.query("task", rows[7], k=5, tau=-1.0) == single


def test_sync_modes_are_accepted(bank_path):
    for mode in ("always", "batch", "none"):
        with (deltamem.Bank.open(bank_path, sync=mode) if bank_path.exists() else deltamem.Bank.create(bank_path, DIM, sync=mode)) as b:
            b.insert("task", unit(0), mode, attach="root", sync=mode)
    with deltamem.Bank.open(bank_path, read_only=True) as r:
        assert [n.scenario for n in r.nodes()] == ["always", "batch", "none"]


def test_reference_json_and_jsonl_round_trip(bank, tmp_path):
    bank.insert("task", unit(0), "root", payload={"procedure": "p"})
    bank.insert("task", near(0, 1), "child")
    out = tmp_path / "tree.json"
    assert bank.export_reference("task", out) == 2
    doc = json.loads(out.read_text())
    assert len(doc["nodes"]) == 3  # the reference's placeholder root, then ours
    lines = tmp_path / "tree.jsonl"
    bank.export_reference("task", lines, format="jsonl")
    assert [json.loads(l)["id"] for l in lines.read_text().splitlines()] == [0, 1]
    with deltamem.Bank.create(tmp_path / "copy", DIM) as copy:
        ids = copy.import_reference("task", out)
        assert len(ids) == 2
        assert [copy.node(i).scenario for i in ids] == ["root", "child"]
        assert copy.chain(ids[1]) == ids


def test_npy_round_trip(bank, tmp_path):
    rows = random_rows(20, seed=6)
    path = tmp_path / "m.npy"
    np.save(path, rows.astype(np.float16))
    ids = bank.import_npy("env", path)
    assert ids.tolist() == list(range(20))
    out = tmp_path / "out.npy"
    assert bank.export_npy("env", out).tolist() == list(range(20))
    back = np.load(out)
    assert back.dtype == np.float32 and back.shape == (20, DIM)
    expected = rows.astype(np.float16).astype(np.float32)
    np.testing.assert_allclose(back, expected / np.linalg.norm(expected, axis=1, keepdims=True), atol=1e-6)


def test_repr_is_readable(bank):
    ack = bank.insert("task", unit(0), "a")
    assert repr(ack).startswith("InsertAck(id=0") and "Bank(" in repr(bank)
    assert "Match(id=0" in repr(bank.query("task", unit(0))[0])
