"""MCP tools of deltamem through the official Python `mcp` client, over
stdio (`deltamem mcp BANK`) and Streamable HTTP (`/mcp` on `deltamem
serve`), and four stdio servers sharing one bank, recording episodes and
counting hits at once.

Run by tools/test.sh with DELTAMEM_BIN pointing at the release binary
(built with the `agent` feature) and DELTAMEM_REQUIRE_ASSETS=1. The tools
that embed text or call the LLM (retrieve_memory, record_episode,
query_by_text) need the agent feature and the agent assets (assets/); the
tests of them skip, saying why, when either is missing, unless
DELTAMEM_REQUIRE_ASSETS is set. The LLM is chat_stub.ChatStub on 127.0.0.1.
"""

import asyncio
import base64
import contextlib
import json
import os
import queue
import random
import re
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client
from mcp.shared.exceptions import McpError

from chat_stub import ChatStub

BIN = os.environ.get("DELTAMEM_BIN", "target/release/deltamem")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIM = 8
AGENT_DIM = 384  # MiniLM, the agent's default embedder
AGENT_TOOLS = {"retrieve_memory", "record_episode", "query_by_text"}


def init_bank(root, dim=DIM):
    path = os.path.join(root, "bank")
    subprocess.run([BIN, "init", path, "--dim", str(dim), "--quiet"], check=True)
    return path


def vec(seed, dim=DIM):
    rng = random.Random(seed)
    return [rng.uniform(-1, 1) for _ in range(dim)]


def binary_has_agent():
    """Whether BIN was built with the `agent` feature (its /v1/bank says)."""
    with tempfile.TemporaryDirectory() as root:
        proc, base = start_server(init_bank(root))
        try:
            with urllib.request.urlopen(base + "/v1/bank", timeout=30) as answer:
                return json.load(answer)["agent"]
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)


def require_agent():
    """Skips (or, under DELTAMEM_REQUIRE_ASSETS, fails) without the agent
    feature in BIN or without the assets."""
    missing = []
    if not binary_has_agent():
        missing.append(BIN + " was built without the `agent` feature (cargo build --release --features agent)")
    if not os.path.exists(os.path.join(ROOT, "assets", "minilm", "model.onnx")):
        missing.append("assets/minilm is missing (tools/setup-agent-assets.sh)")
    if missing:
        reason = "; ".join(missing)
        if os.environ.get("DELTAMEM_REQUIRE_ASSETS"):
            pytest.fail("agent required (DELTAMEM_REQUIRE_ASSETS) but " + reason)
        pytest.skip(reason)


def agent_env(stub):
    """The environment of a deltamem process using `stub` as its LLM."""
    env = dict(os.environ)
    env.update(stub.env())
    return env


def episode(task, env_text, success, retrieved_task=None):
    return {"task_text": task, "env_text": env_text, "success": success,
            "trajectory": "> look around\nYou see a stove.\n> " + task,
            "retrieved_task": retrieved_task}


def node(scenario, embedding, attach="root", tree="task"):
    return {"tree": tree, "attach": attach, "label": "SUCCESS", "scenario": scenario,
            "payload": {"execution_procedure": "steps for " + scenario}, "embedding": embedding}


@contextlib.asynccontextmanager
async def stdio_session(bank, env=None):
    """An initialised client session with its own `deltamem mcp BANK`."""
    params = StdioServerParameters(command=BIN, args=["mcp", bank], env=env, cwd=ROOT)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            check_server_info(await session.initialize())
            yield session


def check_server_info(init):
    """The server names itself and its version (rmcp's own name and
    version were sent before)."""
    assert init.serverInfo.name == "deltamem", init.serverInfo
    version = subprocess.run([BIN, "--version"], check=True, capture_output=True, text=True).stdout.split()[-1]
    assert init.serverInfo.version == version, (init.serverInfo, version)


async def call(session, tool, args):
    result = await session.call_tool(tool, args)
    text = result.content[0].text
    return result.isError, (text if result.isError else json.loads(text))


async def exercise(session):
    """Every tool once, each answer checked."""
    tools = {t.name: t for t in (await session.list_tools()).tools}
    assert {"query_memory", "store_node", "count_success_hit", "show_chain", "bank_stats"} <= set(tools)
    assert "embedding" in tools["query_memory"].inputSchema["properties"]
    err, ack = await call(session, "store_node", node("boil water", [1, 0, 0, 0, 0, 0, 0, 0]))
    assert not err, ack
    near = [1, 0.1, 0, 0, 0, 0, 0, 0]
    err, child = await call(session, "store_node", node("boil water faster", near, attach="auto"))
    assert not err and child["parent"] == ack["id"], child
    err, found = await call(session, "query_memory", {"tree": "task", "embedding": near, "k": 2})
    assert not err and found["matches"][0]["id"] == child["id"], found
    # The same query with the embedding as base64 of little-endian f32.
    spelt = base64.b64encode(struct.pack("<8f", *near)).decode()
    err, by_base64 = await call(session, "query_memory", {"tree": "task", "embedding": spelt, "k": 2})
    assert not err and by_base64 == found, by_base64
    err, hit = await call(session, "count_success_hit", {"id": child["id"]})
    assert not err and hit["success_hits"] == 1, hit
    err, chain = await call(session, "show_chain", {"id": child["id"], "render": True})
    assert not err and chain["chain"] == [ack["id"], child["id"]] and "boil water faster" in chain["text"], chain
    err, stats = await call(session, "bank_stats", {})
    assert not err and stats["nodes"] == 2, stats
    err, message = await call(session, "query_memory", {"tree": "task", "embedding": [1, 2]})
    assert err and "dimensions" in message, message
    # k past the tools' limit is refused by name, not clamped (which would
    # return fewer matches than asked without saying so); the schema says it.
    assert tools["query_memory"].inputSchema["properties"]["k"]["maximum"] == 100
    err, message = await call(session, "query_memory", {"tree": "task", "embedding": near, "k": 101})
    assert err and "(field k)" in message and "1..=100, got 101" in message, message
    err, message = await call(session, "show_chain", {"id": 99})
    assert err and "unknown node" in message, message
    # Unknown arguments are refused by name: a misspelt K must not mean k = 1,
    # and a refused count_success_hit counts nothing.
    for tool, args, key in [("query_memory", {"tree": "task", "embedding": near, "K": 2}, "K"),
                            ("count_success_hit", {"id": child["id"], "count": 5}, "count"),
                            ("show_chain", {"id": child["id"], "rendr": True}, "rendr"),
                            ("bank_stats", {"deep": True}, "deep")]:
        message = await refused(session, tool, args)
        assert "unknown field `%s`" % key in message, message
    err, hit = await call(session, "count_success_hit", {"id": child["id"]})
    assert not err and hit["success_hits"] == 2, hit
    # An argument refused while it is read is named by its path.
    message = await refused(session, "store_node", node("x", near, attach={"parent": -1}))
    assert "(field attach.parent)" in message, message
    message = await refused(session, "query_memory", {"tree": "task", "embedding": ["1"]})
    assert "(field embedding" in message, message


async def refused(session, tool, args):
    """The message of a call refused for its arguments (rmcp answers a
    tool error; a JSON-RPC error would do as well)."""
    try:
        result = await session.call_tool(tool, args)
    except McpError as e:
        return str(e)
    assert result.isError, "%s %s was not refused: %s" % (tool, args, result)
    return result.content[0].text


def test_tools_over_stdio():
    with tempfile.TemporaryDirectory() as root:
        bank = init_bank(root)

        async def run():
            async with stdio_session(bank) as session:
                await exercise(session)

        asyncio.run(run())


INITIALIZE = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
              "params": {"protocolVersion": "2025-03-26", "capabilities": {},
                         "clientInfo": {"name": "raw", "version": "0"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def raw_stdio(bank):
    """A `deltamem mcp BANK` spoken to a line at a time, without the SDK's
    client (which neither sends malformed lines nor signals): the process
    and a function that sends it one message."""
    proc = subprocess.Popen([BIN, "mcp", bank], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT)

    def send(message):
        proc.stdin.write(json.dumps(message).encode() + b"\n")
        proc.stdin.flush()

    return proc, send


def test_stdio_answers_every_request_line_it_refuses():
    """A line nested too deep or too long for the stdio transport is answered
    with a JSON-RPC error carrying its id (rmcp alone dropped both without a
    word, and the client waited forever); a line longer than rmcp's own 16 MiB
    limit but within deltamem's is served."""
    with tempfile.TemporaryDirectory() as root:
        bank = init_bank(root)
        proc, send = raw_stdio(bank)
        try:

            lines = queue.Queue()
            threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()

            def answer():
                try:
                    return json.loads(lines.get(timeout=60))
                except queue.Empty:
                    raise AssertionError("no answer within 60 s")

            def store(request_id, payload):
                arguments = dict(node("big", vec(request_id)), payload=payload)
                send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                      "params": {"name": "store_node", "arguments": arguments}})
                return answer()

            send(INITIALIZE)
            assert answer()["id"] == 0
            send(INITIALIZED)
            deep = "x"
            for _ in range(40):
                deep = {"a": deep}
            refused = store("deep", {"k": deep})
            assert refused["id"] == "deep" and "deeper than 34 levels" in refused["error"]["message"], refused
            # 3 MiB of control characters: an 18 MiB line once JSON-escaped.
            stored = store(2, {"k": "\x01" * (3 << 20)})
            assert stored["id"] == 2 and not stored["result"].get("isError"), str(stored)[:300]
            too_long = store(3, {"k": "\x01" * (11 << 20)})
            assert too_long["id"] == 3 and "over the limit of 67108864 bytes" in too_long["error"]["message"], too_long
        finally:
            proc.stdin.close()
            assert proc.wait(timeout=60) == 0
        listed = subprocess.run([BIN, "dump", bank], check=True, capture_output=True, text=True).stdout
        assert len(listed.splitlines()) == 1, "only the line within the limits was stored"


def test_stdio_stops_on_sigterm_after_serving_what_it_read():
    """SIGTERM (what an MCP client sends a stdio server that does not exit
    when its stdin closes) with writes in flight and stdin still open: the
    server answers every request it had read, stores nothing it did not
    answer, and exits 0. Before, it died by the signal mid-write."""
    with tempfile.TemporaryDirectory() as root:
        bank = init_bank(root)
        proc, send = raw_stdio(bank)
        try:

            send(INITIALIZE)
            assert json.loads(proc.stdout.readline())["id"] == 0
            send(INITIALIZED)
            for i in range(1, 201):
                send({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                      "params": {"name": "store_node", "arguments": node("s%d" % i, vec(i))}})
            first = json.loads(proc.stdout.readline())
            proc.send_signal(signal.SIGTERM)
            rest = [json.loads(line) for line in proc.stdout.read().splitlines()]
            assert proc.wait(timeout=60) == 0, proc.stderr.read()
        finally:
            proc.kill()
            proc.wait()
        answers = [first] + rest
        assert all(not a["result"].get("isError") for a in answers), answers[:3]
        stored = {json.loads(line)["scenario"] for line in
                  subprocess.run([BIN, "dump", bank], check=True, capture_output=True, text=True).stdout.splitlines()}
        answered = {"s%d" % a["id"] for a in answers}
        assert stored == answered, (len(stored), len(answered))


def start_server(bank, env=None, extra=()):
    proc = subprocess.Popen([BIN, "serve", bank, "--listen", "127.0.0.1:0", "--threads", "2", *extra],
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    line = proc.stderr.readline()
    match = re.search(r"http://(\S+)", line)
    assert match, line
    return proc, "http://" + match.group(1)


def test_tools_over_streamable_http():
    with tempfile.TemporaryDirectory() as root:
        bank = init_bank(root)
        proc, base = start_server(bank)
        try:
            async def run():
                async with streamablehttp_client(base + "/mcp") as (read, write, _):
                    async with ClientSession(read, write) as session:
                        check_server_info(await session.initialize())
                        await exercise(session)

            asyncio.run(run())
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0


async def exercise_agent(session, stub):
    """record_episode, then retrieve_memory and query_by_text find what it
    wrote; bad input is refused before any LLM call."""
    tools = {t.name: t for t in (await session.list_tools()).tools}
    assert AGENT_TOOLS <= set(tools), sorted(tools)
    assert {"episode"} <= set(tools["record_episode"].inputSchema["properties"])
    assert {"task", "env"} <= set(tools["retrieve_memory"].inputSchema["properties"])
    assert {"tree", "text"} <= set(tools["query_by_text"].inputSchema["properties"])
    before = stub.requests
    err, outcome = await call(session, "record_episode",
                              {"episode": episode("boil water", "a kitchen with a stove", True)})
    assert not err, outcome
    assert outcome["task"]["action"] == "root" and outcome["env"]["action"] == "root", outcome
    assert stub.requests == before + 2, "one extraction per tree"
    task_node, env_node = outcome["task"]["node"], outcome["env"]["node"]

    err, retrieval = await call(session, "retrieve_memory",
                                {"task": "boil water", "env": "a kitchen with a stove"})
    assert not err, retrieval
    assert retrieval["task"]["node"] == task_node and retrieval["env"]["node"] == env_node, retrieval
    assert "do the obvious thing" in retrieval["context"], retrieval["context"]

    err, found = await call(session, "query_by_text", {"tree": "env", "text": "a kitchen with a stove", "k": 1})
    assert not err and found["matches"][0]["id"] == env_node, found

    # A second episode that used the retrieved chain: a residual under it.
    err, second = await call(session, "record_episode", {"episode": episode(
        "boil water", "a kitchen with a stove", True, retrieved_task=retrieval["task"]["chain"])})
    assert not err and second["task"]["parent"] == task_node, second
    assert second["success_hits"][0]["node"] == task_node, second

    before = stub.requests
    err, message = await call(session, "record_episode",
                              {"episode": dict(episode("x", "y", True), trajectory=" ")})
    assert err and "trajectory" in message, message
    err, message = await call(session, "record_episode",
                              {"episode": episode("x", "y", True, retrieved_task=[999])})
    assert err and "retrieved_task" in message, message
    err, message = await call(session, "query_by_text", {"tree": "nowhere", "text": "boil water"})
    assert err and "nowhere" in message, message
    assert stub.requests == before, "refused before any LLM call"


def test_agent_tools_over_stdio():
    require_agent()
    with tempfile.TemporaryDirectory() as root, ChatStub() as stub:
        bank = init_bank(root, AGENT_DIM)

        async def run():
            async with stdio_session(bank, agent_env(stub)) as session:
                await exercise_agent(session, stub)

        asyncio.run(run())


def test_agent_tools_over_streamable_http():
    require_agent()
    with tempfile.TemporaryDirectory() as root, ChatStub() as stub:
        bank = init_bank(root, AGENT_DIM)
        proc, base = start_server(bank, env=agent_env(stub))
        try:
            async def run():
                async with streamablehttp_client(base + "/mcp") as (read, write, _):
                    async with ClientSession(read, write) as session:
                        await session.initialize()
                        await exercise_agent(session, stub)

            asyncio.run(run())
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0


SECONDS = float(os.environ.get("DELTAMEM_MCP_SECONDS", "8"))


async def worker(bank, index, shared, deadline, stub):
    """One client with its own `deltamem mcp` process, until the deadline:
    records an episode that used the shared task root (the LLM call runs
    before the process takes the writer lock), stores a node and counts a
    success hit on the shared root. Returns its ledger of what was
    acknowledged."""
    ledger = {"nodes": [], "hits": 0, "records": 0}
    async with stdio_session(bank, agent_env(stub)) as session:
        i = 0
        while time.monotonic() < deadline and i < 200:
            task = f"client {index} episode {i}"
            env_text = f"room of client {index} episode {i}"
            # A failed episode: no success hit of its own, so the
            # shared root's hits are exactly the count_success_hit calls.
            err, outcome = await call(session, "record_episode",
                                      {"episode": episode(task, env_text, False, retrieved_task=[shared])})
            assert not err, outcome
            assert outcome["task"]["parent"] == shared, outcome
            ledger["nodes"] += [(outcome["task"]["node"], task), (outcome["env"]["node"], env_text)]
            ledger["records"] += 1
            scenario = f"client {index} note {i}"
            err, ack = await call(session, "store_node", node(scenario, vec(index * 10_000 + i, AGENT_DIM)))
            assert not err, ack
            ledger["nodes"].append((ack["id"], scenario))
            err, hit = await call(session, "count_success_hit", {"id": shared})
            assert not err, hit
            ledger["hits"] += 1
            # Each process sees the others' writes: the shared count
            # never goes below what this client alone acknowledged.
            assert hit["success_hits"] >= ledger["hits"]
            i += 1
    return ledger


def test_four_stdio_servers_share_one_bank():
    """Four `deltamem mcp` processes on one bank, each driven by its own
    client, record episodes (LLM calls included) and count hits at once
    for a bounded time: no write refused for a lock, every acknowledged
    node present with its text, every counter equal to the ledger."""
    require_agent()
    with tempfile.TemporaryDirectory() as root, ChatStub() as stub:
        bank = init_bank(root, AGENT_DIM)

        async def seed():
            async with stdio_session(bank, agent_env(stub)) as session:
                err, ack = await call(session, "store_node", node("shared", vec(-1, AGENT_DIM)))
                assert not err
                return ack["id"]

        shared = asyncio.run(seed())

        async def run():
            deadline = time.monotonic() + SECONDS
            return await asyncio.gather(*(worker(bank, i, shared, deadline, stub) for i in range(4)))

        ledgers = asyncio.run(run())
        dump = subprocess.run([BIN, "dump", bank], check=True, capture_output=True, text=True).stdout
        nodes = {n["id"]: n for n in map(json.loads, dump.splitlines())}
        for ledger in ledgers:
            assert ledger["records"] > 0, "every client recorded an episode"
            for node_id, scenario in ledger["nodes"]:
                assert nodes[node_id]["scenario"] == scenario
        ids = [i for ledger in ledgers for i, _ in ledger["nodes"]]
        assert len(ids) == len(set(ids)), "no id acknowledged twice"
        assert len(nodes) == len(ids) + 1, "nothing stored that was not acknowledged"
        assert nodes[shared]["success_hits"] == sum(ledger["hits"] for ledger in ledgers)
        assert nodes[shared]["retrievals"] == sum(ledger["records"] for ledger in ledgers)
        assert stub.requests == 2 * sum(ledger["records"] for ledger in ledgers)
        verify = subprocess.run([BIN, "verify", bank], capture_output=True, text=True)
        assert verify.returncode == 0, verify.stderr
        print("four stdio servers: %d records, %d hits, %d nodes in %.0f s" % (
            sum(ledger["records"] for ledger in ledgers), sum(ledger["hits"] for ledger in ledgers),
            len(nodes), SECONDS))


def test_record_on_a_read_only_server_is_refused_before_the_llm():
    """Over MCP as over HTTP: a read-only server refuses record_episode
    without spending an LLM call on an episode it cannot store."""
    require_agent()
    with tempfile.TemporaryDirectory() as root, ChatStub() as stub:
        bank = init_bank(root, AGENT_DIM)
        proc, base = start_server(bank, env=agent_env(stub), extra=["--read-only"])
        try:
            async def run():
                async with streamablehttp_client(base + "/mcp") as (read, write, _):
                    async with ClientSession(read, write) as session:
                        await session.initialize()
                        err, message = await call(session, "record_episode",
                                                  {"episode": episode("boil water", "a kitchen", True)})
                        assert err and "read-only" in message, message

            asyncio.run(run())
            assert stub.requests == 0
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
