"""A numpy client of `deltamem serve`: embeddings sent as base64 of their
little-endian f32 bytes (numpy's own `tobytes`) arrive bit for bit, alike
to the same vector sent as JSON numbers. Run by tools/test.sh."""
import base64
import json
import os
import signal
import sys
import tempfile
import urllib.error
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_mcp import init_bank, start_server  # noqa: E402

DIM = 8


def b64(vector):
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()


def post(base, path, body):
    request = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)


def get(base, path):
    with urllib.request.urlopen(base + path, timeout=30) as answer:
        return json.load(answer)


def insert(base, scenario, embedding):
    return post(base, "/v1/nodes", {"tree": "task", "attach": "root", "label": "SUCCESS",
                                    "scenario": scenario, "payload": {}, "embedding": embedding})


def test_numpy_vectors_travel_as_base64():
    rng = np.random.default_rng(5)
    vectors = rng.standard_normal((5, DIM)).astype(np.float32)
    with tempfile.TemporaryDirectory() as root:
        proc, base = start_server(init_bank(root, DIM))
        try:
            pairs = [(insert(base, "numbers", [float(x) for x in v])["id"], insert(base, "base64", b64(v))["id"])
                     for v in vectors]
            for (as_numbers, as_base64), v in zip(pairs, vectors):
                a = get(base, f"/v1/nodes/{as_numbers}?embedding=true")["embedding"]
                b = get(base, f"/v1/nodes/{as_base64}?embedding=true")["embedding"]
                assert a == b
                expected = v / np.linalg.norm(v.astype(np.float64))
                assert np.allclose(np.asarray(b), expected, atol=1e-6)
            found = post(base, "/v1/trees/task/query", {"embedding": b64(vectors[3]), "k": 2})
            assert {m["id"] for m in found["matches"]} == set(pairs[3]), found
            # A big-endian spelling is other bytes: other values, not refused.
            swapped = base64.b64encode(vectors[3].astype(">f4").tobytes()).decode()
            other = post(base, "/v1/trees/task/query", {"embedding": swapped, "k": 1, "tau": -1})
            assert other["matches"][0]["score"] < 0.999, other
            try:
                post(base, "/v1/trees/task/query", {"embedding": b64(vectors[0][:3])})
                raise AssertionError("a 3-value embedding was accepted")
            except urllib.error.HTTPError as e:
                assert e.code == 400 and json.load(e)["field"] == "embedding"
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0


def flip_stray_bits(text):
    """The same bytes with one of the last character's unused bits set: a
    decoder that ignored stray bits would take it, the server refuses it."""
    data = text.rstrip("=")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    last = alphabet[alphabet.index(data[-1]) | 1]
    return data[:-1] + last + "=" * (len(text) - len(data))


def test_the_documented_base64_pattern_is_what_the_server_decodes():
    """For each length left over after whole 3-byte groups (dims 3, 4, 5 are
    12, 16, 20 bytes), the pattern in /openapi.json matches numpy's
    base64 and not the same bytes with stray bits, and the server agrees:
    the first is stored, the second refused naming the field."""
    import re

    rng = np.random.default_rng(11)
    for dim in (3, 4, 5):
        with tempfile.TemporaryDirectory() as root:
            proc, base = start_server(init_bank(root, dim))
            try:
                schema = get(base, "/openapi.json")["components"]["schemas"]["InsertRequest"]
                spelling = schema["properties"]["embedding"]["anyOf"][1]
                pattern = re.compile(spelling["pattern"])
                for i in range(20):
                    good = b64(rng.standard_normal(dim).astype(np.float32))
                    bad = flip_stray_bits(good)
                    assert len(good) == spelling["maxLength"] == spelling["minLength"], (dim, good)
                    assert pattern.search(good), (dim, good, spelling["pattern"])
                    insert(base, f"good {dim} {i}", good)
                    if dim % 3 == 0:
                        continue  # no padding: the last character's bits are all data
                    assert bad != good and not pattern.search(bad), (dim, bad)
                    try:
                        insert(base, f"bad {dim} {i}", bad)
                        raise AssertionError(f"stray bits accepted at dim {dim}: {bad}")
                    except urllib.error.HTTPError as e:
                        assert e.code == 400 and json.load(e)["field"] == "embedding", e
            finally:
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(timeout=60) == 0
