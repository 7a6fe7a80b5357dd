#!/usr/bin/env python3
"""kill -9 of `deltamem serve` under a durable write load from many
clients, repeated, with a ledger of acknowledged writes.

Each cycle starts the server on the bank, runs CLIENTS threads that insert
nodes (each with a unique external id) and count hits on one shared node,
kills the server with SIGKILL at a random moment, then checks with the CLI:
`verify` is clean, every acknowledged node is present with its scenario,
and the shared node's hit count is at least the acknowledged hits and at
most the attempted ones. Standard library only; loopback only; bounded in
cycles and time. `--dim 256 --checkpoint-wal-mib 2` makes the server
checkpoint every few thousand inserts, with vectors written ahead of each
checkpoint (`Bank::write_vectors_ahead`), so kills land inside those too.
"""

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

DIM = 8
LOCK = threading.Lock()


def post(base, path, body):
    request = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def start(binary, bank, checkpoint_wal_mib):
    proc = subprocess.Popen([binary, "serve", bank, "--listen", "127.0.0.1:0", "--threads", "2",
                             "--checkpoint-wal-mib", str(checkpoint_wal_mib)],
                            stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    match = re.search(r"http://(\S+)", line)
    if not match:
        proc.kill()
        sys.exit(f"server did not start: {line}{proc.stderr.read()}")
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    return proc, "http://" + match.group(1)


def client(base, cycle, index, shared, ledger, stop, rng):
    i = 0
    while not stop.is_set():
        ext = f"c{cycle}t{index}n{i}"
        scenario = f"cycle {cycle} client {index} node {i}"
        node = {"tree": "task", "attach": "auto", "label": "SUCCESS", "scenario": scenario,
                "payload": {}, "embedding": [rng.uniform(-1, 1) for _ in range(DIM)], "id": ext}
        try:
            post(base, "/v1/nodes", node)
            with LOCK:
                ledger["nodes"][ext] = scenario
                ledger["attempted_hits"] += 1
            post(base, f"/v1/nodes/{shared}/hit", None)
            with LOCK:
                ledger["acked_hits"] += 1
        except (urllib.error.URLError, ConnectionError, OSError):
            return  # the server is gone
        i += 1


def check(binary, bank, ledger, shared):
    verify = subprocess.run([binary, "verify", bank], capture_output=True, text=True)
    if verify.returncode != 0:
        sys.exit(f"verify failed: {verify.stderr}")
    dump = subprocess.run([binary, "dump", bank], check=True, capture_output=True, text=True).stdout
    nodes = [json.loads(line) for line in dump.splitlines()]
    by_ext = {n.get("external_id"): n for n in nodes}
    lost = [e for e, s in ledger["nodes"].items() if by_ext.get(e, {}).get("scenario") != s]
    hits = by_ext[shared]["success_hits"]
    if lost:
        sys.exit(f"{len(lost)} acknowledged nodes lost, e.g. {lost[:3]}")
    if not ledger["acked_hits"] <= hits <= ledger["attempted_hits"]:
        sys.exit(f"hits {hits} outside acknowledged {ledger['acked_hits']}..attempted {ledger['attempted_hits']}")
    return len(nodes), hits


def main():
    global DIM
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--bin", default="target/release/deltamem")
    parser.add_argument("--dim", type=int, default=DIM)
    parser.add_argument("--checkpoint-wal-mib", type=int, default=64)
    args = parser.parse_args()
    DIM = args.dim
    rng = random.Random(args.seed)
    ledger = {"nodes": {}, "acked_hits": 0, "attempted_hits": 0}
    with tempfile.TemporaryDirectory() as root:
        bank = os.path.join(root, "bank")
        subprocess.run([args.bin, "init", bank, "--dim", str(DIM), "--quiet"], check=True)
        proc, base = start(args.bin, bank, args.checkpoint_wal_mib)
        shared = "shared"
        post(base, "/v1/nodes", {"tree": "env", "attach": "root", "label": "SUCCESS", "scenario": "shared",
                                 "payload": {}, "embedding": [1] + [0] * (DIM - 1), "id": shared})
        ledger["nodes"][shared] = "shared"
        for cycle in range(args.cycles):
            stop = threading.Event()
            threads = [threading.Thread(target=client, args=(base, cycle, i, shared, ledger, stop,
                                                             random.Random(rng.random())))
                       for i in range(args.clients)]
            for t in threads:
                t.start()
            time.sleep(rng.uniform(0.3, 1.5))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            stop.set()
            for t in threads:
                t.join(timeout=60)
            count, hits = check(args.bin, bank, ledger, shared)
            print(f"cycle {cycle}: {count} nodes, {len(ledger['nodes'])} acknowledged, 0 lost; "
                  f"hits {hits} (acknowledged {ledger['acked_hits']}); verify clean", flush=True)
            proc, base = start(args.bin, bank, args.checkpoint_wal_mib)
        proc.send_signal(signal.SIGTERM)
        if proc.wait(timeout=60) != 0:
            sys.exit("server did not exit 0 on SIGTERM")
    print(f"kill -9: {args.cycles} cycles, {len(ledger['nodes'])} acknowledged nodes, 0 lost (seed {args.seed})")


if __name__ == "__main__":
    main()
