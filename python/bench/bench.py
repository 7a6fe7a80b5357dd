#!/usr/bin/env python3
"""Benchmark of the Python package against its targets (issue 12).

Not a test: figures depend on the machine. Everything is measured in the
same run, peers interleaved round by round with deltamem, medians quoted.

    .venv/bin/pip install faiss-cpu           # optional peer
    cargo build --release --example bench_scan  # the Rust-library side
    .venv/bin/python python/bench/bench.py [--rows 1000000] [--dir /tmp]

Targets:
  query 1M x 768 f32 from Python within 1.05x of the Rust library (the
    same bank, the same queries, `bench_scan scan`), with faiss
    IndexFlatIP (1 thread) and numpy (1 thread) for scale;
  query_batch of 256: at least 2.5x faster per query than 256 query calls;
  insert_many sync="batch": >= 100k nodes/s at dim 768 and >= 2x sqlite3
    committing per 1,000 rows (WAL, synchronous=FULL);
  insert sync="always": >= sqlite3 committing per row;
  load 1M x 768 from numpy: >= 250k rows/s.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

# One thread for every peer's BLAS/OpenMP, set before numpy is imported.
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = "1"

import numpy as np  # noqa: E402

import deltamem  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
DIM = 768
K = 10


def median(xs):
    return statistics.median(xs)


def load_avg() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def written_bytes() -> int:
    """Bytes this process has passed to write calls so far (/proc/self/io
    wchar, every thread): what a peer must write to match a run."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no wchar line")


def rows_matrix(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, DIM), dtype=np.float32)


# ---------------------------------------------------------------- load

def raw_write_rate(rows: np.ndarray, workdir: pathlib.Path, total_bytes: int | None = None) -> float:
    """Rows/s of writing the matrix's bytes (or `total_bytes`: what the
    load wrote, rows, vectors and payloads) to one file in 4 MiB writes
    and fsyncing it once: the disk's bound for any load."""
    path = workdir / "raw.bin"
    data = memoryview(rows).cast("B")
    total = total_bytes if total_bytes is not None else len(data)
    chunk = 4 << 20
    t = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        done = 0
        while done < total:
            n = min(chunk, total - done)
            start = done % max(len(data) - chunk, 1)
            f.write(data[start:start + n])
            done += n
        os.fsync(f.fileno())
    rate = len(rows) / (time.perf_counter() - t)
    path.unlink()
    return rate


def bench_load(rows: np.ndarray, workdir: pathlib.Path, rounds: int) -> tuple[float, float, pathlib.Path]:
    rates = []
    raw = []
    path = None
    for r in range(rounds):
        if path is not None:
            shutil.rmtree(path)
        path = workdir / f"load-{r}"
        with deltamem.Bank.create(path, DIM, trees={"all": -1.0}, eps=0.0) as bank:
            before = written_bytes()
            t = time.perf_counter()
            bank.load("all", rows)
            rates.append(len(rows) / (time.perf_counter() - t))
            wrote = written_bytes() - before
        raw.append(raw_write_rate(rows, workdir, wrote))
        print(
            f"  load round {r}: {rates[-1]:,.0f} rows/s ({wrote / len(rows):,.0f} bytes/row written);"
            f" raw write+fsync of the same bytes {raw[-1]:,.0f} rows/s = {rates[-1] / raw[-1]:.2f}x"
            f" (load avg {load_avg()})",
            flush=True,
        )
    return median(rates), median(raw), path


# ---------------------------------------------------------------- queries

def rust_scan(bench_scan: pathlib.Path, bank: pathlib.Path, queries_npy: pathlib.Path, batch: int = 0) -> dict:
    out = subprocess.run(
        [str(bench_scan), "scan", str(bank), str(queries_npy), str(K), "1", "1", str(batch)],
        capture_output=True, text=True, check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_queries(bank_path, rows, queries, workdir, bench_scan, rounds, single_n):
    """Per-query medians (ms) of deltamem from Python, the Rust library,
    faiss and numpy; query_batch of len(queries) vs single calls."""
    qfile = workdir / "queries.npy"
    np.save(qfile, queries[:single_n])
    results = {"python_ms": [], "rust_ms": [], "faiss_ms": [], "numpy_ms": []}
    try:
        import faiss

        faiss.omp_set_num_threads(1)
        index = faiss.IndexFlatIP(DIM)
        index.add(rows)
    except ImportError:
        faiss = None
        index = None
        print("  faiss not installed (pip install faiss-cpu): faiss column skipped")
    bank = deltamem.Bank.open(bank_path, read_only=True)
    bank.query("all", queries[0], k=K, tau=-1.0)  # maps and checks every segment
    same_answers = True
    for r in range(rounds):
        for q in queries[:single_n]:
            t = time.perf_counter()
            found = bank.query("all", q, k=K, tau=-1.0)
            results["python_ms"].append((time.perf_counter() - t) * 1e3)
        rust = rust_scan(bench_scan, bank_path, qfile)
        results["rust_ms"].append(rust["median_ms"])
        if r == 0:
            py_ids = [[m.id for m in bank.query("all", q, k=K, tau=-1.0)] for q in queries[:single_n]]
            same_answers = py_ids == rust["ids"]
        if index is not None:
            for q in queries[:single_n]:
                t = time.perf_counter()
                index.search(q.reshape(1, -1), K)
                results["faiss_ms"].append((time.perf_counter() - t) * 1e3)
        for q in queries[:single_n]:
            t = time.perf_counter()
            scores = rows @ q
            top = np.argpartition(scores, -K)[-K:]
            top[np.argsort(-scores[top])]
            results["numpy_ms"].append((time.perf_counter() - t) * 1e3)
        print(
            f"  query round {r}: python {median(results['python_ms']):.1f} ms, rust {rust['median_ms']:.1f} ms"
            f" (load avg {load_avg()})",
            flush=True,
        )
    del found
    # query_batch of all the queries vs single calls, per query
    batch_n = len(queries)
    singles = []
    for q in queries:
        t = time.perf_counter()
        bank.query("all", q, k=K, tau=-1.0)
        singles.append(time.perf_counter() - t)
    single_total = sum(singles)
    batch_times = []
    for _ in range(rounds):
        t = time.perf_counter()
        ids, _scores = bank.query_batch("all", queries, k=K, tau=-1.0)
        batch_times.append(time.perf_counter() - t)
    batch_ids_equal = ids[:single_n].tolist() == py_ids
    peers_batch = {}
    if index is not None:
        t = time.perf_counter()
        index.search(queries, K)
        peers_batch["faiss_batch_ms_per_query"] = (time.perf_counter() - t) * 1e3 / batch_n
    t = time.perf_counter()
    scores = queries @ rows.T
    np.argpartition(scores, -K, axis=1)[:, -K:]
    peers_batch["numpy_batch_ms_per_query"] = (time.perf_counter() - t) * 1e3 / batch_n
    del scores
    bank.close()
    return {
        "python_query_ms": median(results["python_ms"]),
        "rust_query_ms": median(results["rust_ms"]),
        "faiss_query_ms": median(results["faiss_ms"]) if results["faiss_ms"] else None,
        "numpy_query_ms": median(results["numpy_ms"]),
        "same_ids_python_rust": same_answers,
        "batch_size": batch_n,
        "singles_ms_per_query": single_total * 1e3 / batch_n,
        "batch_ms_per_query": median(batch_times) * 1e3 / batch_n,
        "batch_ids_equal_singles": batch_ids_equal,
        **peers_batch,
    }


# ---------------------------------------------------------------- inserts

def sqlite_db(path: pathlib.Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute(
        "CREATE TABLE nodes (id INTEGER PRIMARY KEY, tree TEXT, scenario TEXT, payload TEXT, label TEXT, embedding BLOB)"
    )
    return db


def sqlite_insert(path, rows, scenarios, payloads, per_commit) -> float:
    db = sqlite_db(path)
    t = time.perf_counter()
    for start in range(0, len(rows), per_commit):
        db.execute("BEGIN")
        db.executemany(
            "INSERT INTO nodes (tree, scenario, payload, label, embedding) VALUES (?, ?, ?, ?, ?)",
            [
                ("task", scenarios[i], payloads[i], "SUCCESS", rows[i].tobytes())
                for i in range(start, min(start + per_commit, len(rows)))
            ],
        )
        db.execute("COMMIT")
    rate = len(rows) / (time.perf_counter() - t)
    db.close()
    return rate


def deltamem_insert_many(path, rows, scenarios, payload_dicts, per_call, sync) -> tuple[float, int]:
    """Nodes/s, and the bytes written meanwhile (WAL records and the
    checkpoints the WAL's size triggered)."""
    with deltamem.Bank.create(path, DIM, sync=sync) as bank:
        before = written_bytes()
        t = time.perf_counter()
        for start in range(0, len(rows), per_call):
            end = min(start + per_call, len(rows))
            bank.insert_many("task", rows[start:end], scenarios[start:end], payloads=payload_dicts[start:end],
                             attach="root")
        bank.sync()
        return len(rows) / (time.perf_counter() - t), written_bytes() - before


def deltamem_insert_single(path, rows, scenarios, payload_dicts) -> tuple[float, int]:
    with deltamem.Bank.create(path, DIM, sync="always") as bank:
        before = written_bytes()
        t = time.perf_counter()
        for i in range(len(rows)):
            bank.insert("task", rows[i], scenarios[i], payload=payload_dicts[i], attach="root")
        return len(rows) / (time.perf_counter() - t), written_bytes() - before


def raw_appends(path, count, total_bytes, sync_every_s) -> float:
    """The disk's peer of a write path: `count` appends of equal size that
    add up to `total_bytes`, each followed by fdatasync (`sync_every_s`
    0), or fdatasync once that many seconds passed since the last, and
    once at the end (the "batch" policy's 100 ms). Returns appends/s."""
    size = max(total_bytes // count, 1)
    chunk = os.urandom(min(size, 1 << 20)) * (size // (1 << 20) + 1)
    chunk = memoryview(chunk)[:size]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        t = time.perf_counter()
        last_sync = t
        for _ in range(count):
            os.write(fd, chunk)
            now = time.perf_counter()
            if now - last_sync >= sync_every_s:
                os.fdatasync(fd)
                last_sync = now
        os.fdatasync(fd)
        return count / (time.perf_counter() - t)
    finally:
        os.close(fd)
        os.unlink(path)


def raw_overwrites(path, count, total_bytes) -> float:
    """As `raw_appends` with fdatasync after each write, into a file first
    filled with zeros and synced: the floor of one durable write per
    commit, which a preallocated log (SQLite's WAL, deltamem's) can reach."""
    size = max(total_bytes // count, 1)
    chunk = os.urandom(size)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, bytes(size * count))
        os.fsync(fd)
        t = time.perf_counter()
        for k in range(count):
            os.pwrite(fd, chunk, k * size)
            os.fdatasync(fd)
        return count / (time.perf_counter() - t)
    finally:
        os.close(fd)
        os.unlink(path)


def rust_build_rate(bench_scan, rows_npy: pathlib.Path, out: pathlib.Path) -> float:
    """Rows/s of the Rust library's insert_batch (1,000 rows a call, sync
    batch, attach root: `bench_scan build`), for the same rows, timed like
    the Python calls: the inserts and a final sync, not the bank's
    creation or its closing checkpoint."""
    done = subprocess.run([str(bench_scan), "build", str(rows_npy), str(out), "f32", "1000", "batch"],
                          capture_output=True, text=True, check=True)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return report["rows"] / report["insert_seconds"]


def bench_inserts(workdir, bench_scan, many_n, single_n, rounds):
    rows = rows_matrix(many_n, seed=7)
    rows_npy = workdir / "insert-rows.npy"
    np.save(rows_npy, rows)
    scenarios = [f"episode {i}: heat the water in the pot" for i in range(many_n)]
    payload_dicts = [{"execution_procedure": f"step {i}", "activation_condition": "water"} for i in range(many_n)]
    payloads = [json.dumps(p) for p in payload_dicts]
    keys = ("dm_many_batch", "raw_many_batch", "dm_many_always", "raw_many_always", "sqlite_1000",
            "rust_insert_batch", "dm_single_always", "raw_single_overwrite", "raw_single_append", "sqlite_1")
    out = {k: [] for k in keys}
    calls = -(-many_n // 1000)
    for r in range(rounds):
        d = workdir / f"ins-{r}"
        d.mkdir()
        rate, wrote = deltamem_insert_many(d / "b1", rows, scenarios, payload_dicts, 1000, "batch")
        out["dm_many_batch"].append(rate)
        # rows/s of the peer: the same bytes in as many writes, synced at the batch policy's interval
        out["raw_many_batch"].append(raw_appends(d / "raw", calls, wrote, 0.1) * many_n / calls)
        out["sqlite_1000"].append(sqlite_insert(d / "s1.db", rows, scenarios, payloads, 1000))
        rate, wrote = deltamem_insert_many(d / "b2", rows, scenarios, payload_dicts, 1000, "always")
        out["dm_many_always"].append(rate)
        out["raw_many_always"].append(raw_appends(d / "raw", calls, wrote, 0.0) * many_n / calls)
        out["rust_insert_batch"].append(rust_build_rate(bench_scan, rows_npy, d / "b4"))
        rate, wrote = deltamem_insert_single(d / "b3", rows[:single_n], scenarios[:single_n], payload_dicts[:single_n])
        out["dm_single_always"].append(rate)
        out["raw_single_overwrite"].append(raw_overwrites(d / "raw", single_n, wrote))
        out["raw_single_append"].append(raw_appends(d / "raw", single_n, wrote, 0.0))
        out["sqlite_1"].append(sqlite_insert(d / "s2.db", rows[:single_n], scenarios, payloads, 1))
        shutil.rmtree(d)
        print(
            "  insert round {}: {} (load avg {})".format(
                r, ", ".join(f"{k} {v[-1]:,.0f}/s" for k, v in out.items()), load_avg()
            ),
            flush=True,
        )
    return {k: median(v) for k, v in out.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--queries", type=int, default=256, help="query_batch size (and single calls compared)")
    p.add_argument("--single-queries", type=int, default=20, help="queries per round for the 1.05x comparison")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--insert-rows", type=int, default=50_000)
    p.add_argument("--single-insert-rows", type=int, default=2_000)
    p.add_argument("--dir", default=None, help="where the banks go (default: a temporary directory)")
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument("--only", choices=("inserts", "load", "all"), default="all",
                   help="inserts: the insert figures alone; load: the load alone (no queries)")
    args = p.parse_args()

    bench_scan = REPO / "target" / "release" / "examples" / "bench_scan"
    if not bench_scan.exists():
        sys.exit(f"{bench_scan} missing: cargo build --release --example bench_scan")
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="deltamem-bench-", dir=args.dir))
    print(f"machine: {os.cpu_count()} cores, load avg at start {load_avg()}; banks in {workdir}", flush=True)
    figures = {"rows": args.rows, "dim": DIM, "load_avg_start": load_avg()}
    try:
        if args.only in ("inserts", "all"):
            print("inserts (dim 768)", flush=True)
            figures.update(bench_inserts(workdir, bench_scan, args.insert_rows, args.single_insert_rows, args.rounds))
        if args.only in ("load", "all"):
            print(f"load of {args.rows:,} x {DIM} from numpy", flush=True)
            rows = rows_matrix(args.rows, seed=1)
            figures["load_rows_per_s"], figures["raw_write_rows_per_s"], bank_path = bench_load(
                rows, workdir, args.rounds)
        if args.only == "all":
            print("queries", flush=True)
            queries = rows_matrix(args.queries, seed=2)
            figures.update(bench_queries(bank_path, rows, queries, workdir, bench_scan, args.rounds,
                                         args.single_queries))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    figures["load_avg_end"] = load_avg()
    report(figures)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(figures, indent=2))


def report(f: dict) -> None:
    checks = []
    if "python_query_ms" in f:
        checks += query_checks(f)
    if "dm_many_batch" in f:
        checks += insert_checks(f)
    if "load_rows_per_s" in f:
        checks += load_checks(f)
    same = ""
    if "python_query_ms" in f:
        same = f"; same ids Python/Rust: {f['same_ids_python_rust']}, batch = singles: {f['batch_ids_equal_singles']}"
    print(f"\nload avg start {f['load_avg_start']}, end {f['load_avg_end']}{same}")
    for text, ok in checks:
        print(f"[{'met' if ok else 'NOT met'}] {text}")


def query_checks(f: dict) -> list:
    ratio = f["python_query_ms"] / f["rust_query_ms"]
    batch_gain = f["singles_ms_per_query"] / f["batch_ms_per_query"]
    return [
        (f"query {f['rows']:,} x 768 from Python: {f['python_query_ms']:.1f} ms vs Rust {f['rust_query_ms']:.1f} ms"
         f" = {ratio:.3f}x (target <= 1.05x); faiss 1 thread {f['faiss_query_ms'] or float('nan'):.1f} ms,"
         f" numpy 1 thread {f['numpy_query_ms']:.1f} ms", ratio <= 1.05),
        (f"query_batch of {f['batch_size']}: {f['batch_ms_per_query']:.2f} ms/query vs {f['singles_ms_per_query']:.1f}"
         f" ms/query for single calls = {batch_gain:.1f}x (target >= 2.5x); faiss batch"
         f" {f.get('faiss_batch_ms_per_query') or float('nan'):.2f} ms/query, numpy batch"
         f" {f['numpy_batch_ms_per_query']:.2f} ms/query", batch_gain >= 2.5),
    ]


def insert_checks(f: dict) -> list:
    return [
        (f"insert_many sync=batch: {f['dm_many_batch']:,.0f} nodes/s (target >= 100,000) and"
         f" {f['dm_many_batch'] / f['sqlite_1000']:.2f}x sqlite3 per-1000 commits {f['sqlite_1000']:,.0f} rows/s"
         f" (target >= 2x); disk peer (same bytes, same calls, fdatasync every 100 ms)"
         f" {f['raw_many_batch']:,.0f} rows/s: deltamem at {f['dm_many_batch'] / f['raw_many_batch']:.2f}x of it;"
         f" sync=always {f['dm_many_always']:,.0f} nodes/s = {f['dm_many_always'] / f['raw_many_always']:.2f}x its"
         f" peer (fdatasync per call) {f['raw_many_always']:,.0f}; the Rust library's insert_batch"
         f" (the same calls) {f['rust_insert_batch']:,.0f} nodes/s",
         f["dm_many_batch"] >= 100_000 and f["dm_many_batch"] >= 2 * f["sqlite_1000"]),
        (f"insert sync=always: {f['dm_single_always']:,.0f} nodes/s vs sqlite3 per-row commits"
         f" {f['sqlite_1']:,.0f} rows/s = {f['dm_single_always'] / f['sqlite_1']:.2f}x (target >= 1x); disk peer"
         f" (same bytes, one write + fdatasync per row) over a zero-filled file {f['raw_single_overwrite']:,.0f}/s"
         f" (deltamem at {f['dm_single_always'] / f['raw_single_overwrite']:.2f}x), appending"
         f" {f['raw_single_append']:,.0f}/s",
         f["dm_single_always"] >= f["sqlite_1"]),
    ]


def load_checks(f: dict) -> list:
    return [
        (f"load {f['rows']:,} x 768: {f['load_rows_per_s']:,.0f} rows/s (target >= 250,000); writing the same"
         f" bytes to one file and fsyncing: {f['raw_write_rows_per_s']:,.0f} rows/s"
         f" (load at {f['load_rows_per_s'] / f['raw_write_rows_per_s']:.2f}x of it)",
         f["load_rows_per_s"] >= 250_000),
    ]


if __name__ == "__main__":
    main()
