#!/usr/bin/env python3
"""deltamem's exact scan side by side with faiss, numpy and usearch.

Run through tools/bench-vs-peers.sh (it makes the venv and builds the Rust
harness). Builds the same N x D f32 matrix (fixed seed, unit rows) as .npy,
deltamem banks of it (f32, and optionally f16 and int8), then times the
same queries, one at a time and single-threaded, in interleaved rounds:

  deltamem   examples/bench_scan.rs (a Bank opened read-only, query())
  faiss      IndexFlatIP (the matrix added from an np.memmap), 1 OpenMP thread
  numpy      memmap @ query (single-threaded BLAS) + argpartition
  usearch    usearch.index.search(..., exact=True, threads=1)

and the single-core read bandwidth (a streaming sum over a hot heap buffer,
in the Rust harness). Prints median ms/query, the ratio to faiss, the scan
rate as % of that bandwidth, and whether each tool's top-10 ids equal
faiss's.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
    os.environ[var] = "1"

import numpy as np  # noqa: E402  (after the thread settings)


def make_data(path, rows, dim, seed, chunk=65536):
    if os.path.exists(path):
        return
    rng = np.random.default_rng(seed)
    out = np.lib.format.open_memmap(path + ".tmp.npy", mode="w+", dtype=np.float32, shape=(rows, dim))
    for start in range(0, rows, chunk):
        x = rng.standard_normal((min(chunk, rows - start), dim), dtype=np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        out[start:start + len(x)] = x
    out.flush()
    del out
    os.rename(path + ".tmp.npy", path)


def make_queries(path, data, count, seed):
    """Near-duplicates of random rows (a real retrieval's shape: one clear
    best match, then the crowd)."""
    rng = np.random.default_rng(seed + 1)
    picks = rng.choice(len(data), size=count, replace=False)
    q = np.array(data[picks], dtype=np.float32) + 0.5 * rng.standard_normal((count, data.shape[1]), dtype=np.float32) / np.sqrt(data.shape[1])
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    np.save(path, q.astype(np.float32))
    return q


def harness(binary, *args):
    out = subprocess.run([binary, *map(str, args)], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def timed(fn, queries):
    ms, ids = [], []
    for q in queries:
        t = time.perf_counter()
        found = fn(q)
        ms.append((time.perf_counter() - t) * 1e3)
        ids.append([int(i) for i in found])
    return ms, ids


def peers(data, queries, k):
    tools = {}
    try:
        import faiss
        faiss.omp_set_num_threads(1)
        index = faiss.IndexFlatIP(data.shape[1])
        index.add(data)  # copies the memmap into the index
        index.search(queries[:1], k)
        tools["faiss IndexFlatIP"] = lambda q: index.search(q[None, :], k)[1][0]
    except ImportError as e:
        print(f"faiss not available: {e}", file=sys.stderr)

    def numpy_scan(q):
        s = data @ q
        top = np.argpartition(-s, k)[:k]
        return top[np.lexsort((top, -s[top]))]
    tools["numpy matmul"] = numpy_scan
    try:
        from usearch.index import MetricKind, search

        def usearch_scan(q):
            return search(data, q, k, MetricKind.IP, exact=True, threads=1).keys
        usearch_scan(queries[0])
        tools["usearch exact"] = usearch_scan
    except ImportError as e:
        print(f"usearch not available: {e}", file=sys.stderr)
    return tools


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--seed", type=int, default=20240607)
    ap.add_argument("--precisions", default="f32", help="deltamem banks to time, e.g. f32,f16,int8")
    ap.add_argument("--work", default="target/bench-peers")
    ap.add_argument("--harness", default="target/release/examples/bench_scan")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    data_path = os.path.join(a.work, f"data-{a.rows}x{a.dim}-s{a.seed}.npy")
    query_path = os.path.join(a.work, f"queries-{a.queries}-s{a.seed}.npy")
    t = time.time()
    make_data(data_path, a.rows, a.dim, a.seed)
    data = np.load(data_path, mmap_mode="r")
    queries = make_queries(query_path, data, a.queries, a.seed)
    print(f"data {data.shape} ready in {time.time() - t:.0f} s", file=sys.stderr)
    banks = {}
    for p in a.precisions.split(","):
        bank = os.path.join(a.work, f"bank-{a.rows}x{a.dim}-s{a.seed}-{p}")
        if not os.path.exists(os.path.join(bank, "MANIFEST")):
            print(f"building the {p} bank: {harness(a.harness, 'build', data_path, bank, p)}", file=sys.stderr)
        banks[f"deltamem {p}"] = bank
    tools = peers(data, queries, a.k)
    ms = {name: [] for name in list(banks) + list(tools)}
    ids, gbps, column = {}, [], {}
    for r in range(a.rounds):
        gbps.append(harness(a.harness, "bandwidth", 2, 5)["median_gbps"])
        for name, bank in banks.items():
            res = harness(a.harness, "scan", bank, query_path, a.k, 1, 1)
            ms[name].append(res["median_ms"])
            ids[name], column[name] = res["ids"], res["column_bytes"]
        for name, fn in tools.items():
            times, found = timed(fn, queries)
            ms[name].append(statistics.median(times))
            ids[name] = found
        print(f"round {r + 1}/{a.rounds}: " + ", ".join(f"{n} {v[-1]:.1f}" for n, v in ms.items()), file=sys.stderr)
    report(a, ms, ids, gbps, column)


def report(a, ms, ids, gbps, column):
    """Ratios are medians of the per-round ratios: each round runs every
    tool back to back, so a round's ratio compares like with like even when
    the machine's memory bandwidth drifts between rounds."""
    bw = statistics.median(gbps)
    ref = "faiss IndexFlatIP" if "faiss IndexFlatIP" in ms else "numpy matmul"
    base = "deltamem f32" if "deltamem f32" in ms else ref
    f32_bytes = a.rows * a.dim * 4
    rows = []
    for name, values in ms.items():
        med = statistics.median(values)
        same = sum(1 for x, y in zip(ids[name], ids[ref]) if list(x) == list(y))
        scanned = column.get(name, f32_bytes)
        rate = [scanned / v / 1e6 for v in values]
        rows.append({
            "tool": name,
            "median_ms": round(med, 2),
            "rounds_ms": [round(v, 2) for v in values],
            "speed_vs_ref": round(statistics.median(r / v for r, v in zip(ms[ref], values)), 3),
            "speed_vs_base": round(statistics.median(b / v for b, v in zip(ms[base], values)), 3),
            "gbps": round(statistics.median(rate), 1),
            "pct_of_bandwidth": round(100 * statistics.median(r / g for r, g in zip(rate, gbps)), 1),
            "top10_equal_to_ref": f"{same}/{len(ids[ref])}",
        })
    print(f"\n{a.rows} x {a.dim} f32, {a.queries} queries, k={a.k}, one thread, {a.rounds} interleaved rounds")
    print(f"single-core read bandwidth (streaming sum, hot 2 GB huge-page buffer): median {bw:.1f} GB/s "
          f"(rounds: {', '.join(f'{g:.1f}' for g in gbps)})")
    print(f"| tool | median ms/query | speed vs {ref} | speed vs {base} | column GB/s | % of bandwidth "
          f"| top-10 = {ref} |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['tool']} | {r['median_ms']:.1f} | {r['speed_vs_ref']:.2f}x | {r['speed_vs_base']:.2f}x "
              f"| {r['gbps']} | {r['pct_of_bandwidth']}% | {r['top10_equal_to_ref']} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"reference": ref, "base": base, "bandwidth_gbps": gbps, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
