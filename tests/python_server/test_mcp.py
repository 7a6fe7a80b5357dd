"""MCP tools of deltamem through the official Python `mcp` client, over
stdio (`deltamem mcp BANK`) and Streamable HTTP (`/mcp` on `deltamem
serve`), and four stdio servers sharing one bank.

Run by tools/test.sh with DELTAMEM_BIN pointing at the release binary.
"""

import asyncio
import json
import os
import random
import re
import signal
import subprocess
import tempfile
import time

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client

BIN = os.environ.get("DELTAMEM_BIN", "target/release/deltamem")
DIM = 8


def init_bank(root):
    path = os.path.join(root, "bank")
    subprocess.run([BIN, "init", path, "--dim", str(DIM), "--quiet"], check=True)
    return path


def vec(seed):
    rng = random.Random(seed)
    return [rng.uniform(-1, 1) for _ in range(DIM)]


def node(scenario, embedding, attach="root", tree="task"):
    return {"tree": tree, "attach": attach, "label": "SUCCESS", "scenario": scenario,
            "payload": {"execution_procedure": "steps for " + scenario}, "embedding": embedding}


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
    err, hit = await call(session, "count_success_hit", {"id": child["id"]})
    assert not err and hit["success_hits"] == 1, hit
    err, chain = await call(session, "show_chain", {"id": child["id"], "render": True})
    assert not err and chain["chain"] == [ack["id"], child["id"]] and "boil water faster" in chain["text"], chain
    err, stats = await call(session, "bank_stats", {})
    assert not err and stats["nodes"] == 2, stats
    err, message = await call(session, "query_memory", {"tree": "task", "embedding": [1, 2]})
    assert err and "dimensions" in message, message
    err, message = await call(session, "show_chain", {"id": 99})
    assert err and "unknown node" in message, message


def test_tools_over_stdio():
    with tempfile.TemporaryDirectory() as root:
        bank = init_bank(root)

        async def run():
            params = StdioServerParameters(command=BIN, args=["mcp", bank])
            async with stdio_client(params) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    await exercise(session)

        asyncio.run(run())


def start_server(bank):
    proc = subprocess.Popen([BIN, "serve", bank, "--listen", "127.0.0.1:0", "--threads", "2"],
                            stderr=subprocess.PIPE, text=True)
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
                        await session.initialize()
                        await exercise(session)

            asyncio.run(run())
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0


SECONDS = float(os.environ.get("DELTAMEM_MCP_SECONDS", "8"))


async def worker(bank, index, shared_id, deadline):
    """One client with its own `deltamem mcp` process: stores nodes and
    counts hits on a shared node until the deadline; returns what was
    acknowledged."""
    stored, hits = [], 0
    params = StdioServerParameters(command=BIN, args=["mcp", bank])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            i = 0
            while time.monotonic() < deadline and i < 500:
                scenario = f"client {index} episode {i}"
                err, ack = await call(session, "store_node", node(scenario, vec(index * 10_000 + i)))
                assert not err, ack
                stored.append((ack["id"], scenario))
                err, hit = await call(session, "count_success_hit", {"id": shared_id})
                assert not err, hit
                hits += 1
                # Each process sees the others' writes: the shared count
                # never goes below what this client alone acknowledged.
                assert hit["success_hits"] >= hits
                i += 1
    return stored, hits


def test_four_stdio_servers_share_one_bank():
    with tempfile.TemporaryDirectory() as root:
        bank = init_bank(root)

        async def seed():
            params = StdioServerParameters(command=BIN, args=["mcp", bank])
            async with stdio_client(params) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    err, ack = await call(session, "store_node", node("shared", vec(-1), tree="env"))
                    assert not err
                    return ack["id"]

        shared_id = asyncio.run(seed())

        async def run():
            deadline = time.monotonic() + SECONDS
            return await asyncio.gather(*(worker(bank, i, shared_id, deadline) for i in range(4)))

        results = asyncio.run(run())
        dump = subprocess.run([BIN, "dump", bank], check=True, capture_output=True, text=True).stdout
        nodes = {n["id"]: n for n in map(json.loads, dump.splitlines())}
        total_hits = 0
        for stored, hits in results:
            assert stored, "every client stored something"
            for node_id, scenario in stored:
                assert nodes[node_id]["scenario"] == scenario
            total_hits += hits
        ids = [i for stored, _ in results for i, _ in stored]
        assert len(ids) == len(set(ids)), "no id acknowledged twice"
        assert nodes[shared_id]["success_hits"] == total_hits
        verify = subprocess.run([BIN, "verify", bank], capture_output=True, text=True)
        assert verify.returncode == 0, verify.stderr
