"""The agent loop from Python: Python callables as embedder and LLM, the
built-in HTTP client against a loopback server, the built-in ONNX
embedder; a failing callable fails the call with the bank unchanged."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading

import numpy as np
import pytest

import deltamem
from conftest import REPO, require_assets

DIM = 32

REPLY = json.dumps(
    {
        "activation_condition": "when the task asks to heat something",
        "execution_procedure": "1. find the stove 2. heat it",
        "termination_condition": "it is hot",
        "content": "the stove is in the kitchen",
    }
)


def toy_embed(texts, role):
    """Bag of words hashed into DIM buckets: texts sharing words are close."""
    out = np.zeros((len(texts), DIM), dtype=np.float32)
    for i, text in enumerate(texts):
        for word in text.lower().split():
            out[i, hashlib.md5(word.encode()).digest()[0] % DIM] += 1.0
    return out


class ScriptedChat:
    def __init__(self, reply: str = REPLY):
        self.reply = reply
        self.calls: list[list[dict]] = []

    def __call__(self, messages):
        self.calls.append(messages)
        return self.reply


EPISODE = {
    "task_text": "heat the water in the pot",
    "env_text": "a kitchen with a stove and a sink",
    "trajectory": "go to kitchen\nturn on stove\nput pot on stove",
    "success": True,
    "steps": 3,
}


@pytest.fixture
def agent_bank(tmp_path):
    path = tmp_path / "bank"
    deltamem.Bank.create(path, DIM).close()
    return path


def test_loop_with_python_callables(agent_bank):
    chat = ScriptedChat()
    loop = deltamem.MemoryLoop(agent_bank, profile="alfworld", embedder=toy_embed, llm=chat)
    first = loop.retrieve(EPISODE["task_text"], EPISODE["env_text"])
    assert first == {"context": "", "task": None, "env": None}
    outcome = loop.record(EPISODE, retrieval=first)
    assert outcome["task"]["action"] == "root" and outcome["env"]["action"] == "root"
    assert len(chat.calls) == 2 and chat.calls[0][0]["role"] == "system"
    assert any("heat the water" in m["content"] for m in chat.calls[0])

    with deltamem.Bank.open(agent_bank, read_only=True) as bank:
        task = bank.node(outcome["task"]["node"])
        assert task.tree == "task" and task.payload["execution_procedure"] == "1. find the stove 2. heat it"
        assert bank.node(outcome["env"]["node"]).payload["content"] == "the stove is in the kitchen"
        # the stored vector is the callable's, normalised
        want = toy_embed([task.scenario], "passage")[0]
        got = bank.embeddings("task")[1][0]
        np.testing.assert_allclose(got, want / np.linalg.norm(want), atol=1e-6)

    second = loop.retrieve(EPISODE["task_text"], EPISODE["env_text"])
    assert second["task"]["node"] == outcome["task"]["node"] and second["task"]["score"] > 0.9
    assert "find the stove" in second["context"]
    again = loop.record(dict(EPISODE, trajectory="done again"), retrieval=second)
    assert again["task"]["matched"] == outcome["task"]["node"]
    assert sorted(again["retrievals_counted"]) == sorted([outcome["task"]["node"], outcome["env"]["node"]])
    assert {h["node"] for h in again["success_hits"]} >= {outcome["task"]["node"]}


@pytest.mark.parametrize("culprit", ["embedder", "llm"])
def test_a_raising_callable_fails_the_call_and_leaves_the_bank_unchanged(agent_bank, culprit):
    def broken(*_args):
        raise RuntimeError(f"{culprit} is down")

    loop = deltamem.MemoryLoop(
        agent_bank,
        embedder=broken if culprit == "embedder" else toy_embed,
        llm=broken if culprit == "llm" else ScriptedChat(),
    )
    with pytest.raises(deltamem.AgentError) as e:
        loop.record(EPISODE)
    assert isinstance(e.value.__cause__, RuntimeError) and f"{culprit} is down" in str(e.value)
    with deltamem.Bank.open(agent_bank, read_only=True) as bank:
        assert len(bank) == 0 and bank.stats()["wal_bytes"] <= 64


def test_bad_callable_results_are_named(agent_bank):
    wrong_dim = lambda texts, role: np.ones((len(texts), DIM + 1), dtype=np.float32)  # noqa: E731
    loop = deltamem.MemoryLoop(agent_bank, embedder=wrong_dim, llm=ScriptedChat())
    with pytest.raises(deltamem.AgentError, match=f"shape \\[1, {DIM + 1}\\]"):
        loop.retrieve("a task", "an env")
    # NaN from the embedder is the embedder's fault, not bad input.
    nan_embed = lambda texts, role: np.full((len(texts), DIM), np.nan, dtype=np.float32)  # noqa: E731
    loop = deltamem.MemoryLoop(agent_bank, embedder=nan_embed, llm=ScriptedChat())
    for call in (lambda: loop.retrieve("a task", "an env"), lambda: loop.record(EPISODE)):
        with pytest.raises(deltamem.AgentError, match="non-finite"):
            call()
    loop = deltamem.MemoryLoop(agent_bank, embedder=toy_embed, llm=lambda messages: 42)
    with pytest.raises(deltamem.AgentError, match="not a str"):
        loop.record(EPISODE)
    loop = deltamem.MemoryLoop(agent_bank, embedder=toy_embed, llm=ScriptedChat("no json here"))
    with pytest.raises(deltamem.AgentError, match="reply"):
        loop.record(EPISODE)
    with deltamem.Bank.open(agent_bank, read_only=True) as bank:
        assert len(bank) == 0
    with pytest.raises(deltamem.InvalidInputError, match="trajectory"):
        loop.record({"task_text": "t", "env_text": "e", "success": True})
    with pytest.raises(deltamem.InvalidInputError, match="unknown profile"):
        deltamem.MemoryLoop(agent_bank, profile="chess", embedder=toy_embed, llm=ScriptedChat())


class ChatHandler(http.server.BaseHTTPRequestHandler):
    """Answers POST /v1/chat/completions like an OpenAI-compatible server."""

    requests: list[dict] = []
    status = 200

    def do_POST(self):  # noqa: N802 - http.server's name
        size = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(min(size, 1 << 20)))
        type(self).requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
        if type(self).status != 200:
            self.send_response(type(self).status)
            self.end_headers()
            self.wfile.write(b"overloaded")
            return
        answer = {"choices": [{"message": {"role": "assistant", "content": REPLY}, "finish_reason": "stop"}]}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args):
        pass


@pytest.fixture
def chat_server():
    ChatHandler.requests = []
    ChatHandler.status = 200
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ChatHandler)
    server.timeout = 5
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def test_builtin_http_client_against_a_loopback_server(agent_bank, chat_server):
    llm = {"base_url": chat_server, "model": "toy-model", "api_key": "secret", "timeout_s": 10, "max_attempts": 1}
    loop = deltamem.MemoryLoop(agent_bank, embedder=toy_embed, llm=llm)
    outcome = loop.record(EPISODE)
    assert outcome["task"]["action"] == "root"
    assert len(ChatHandler.requests) == 2
    first = ChatHandler.requests[0]
    assert first["path"] == "/v1/chat/completions" and first["body"]["model"] == "toy-model"
    assert first["auth"] == "Bearer secret" and first["body"]["messages"][0]["role"] == "system"
    with deltamem.Bank.open(agent_bank, read_only=True) as bank:
        assert len(bank) == 2

    ChatHandler.status = 503
    with pytest.raises(deltamem.AgentError, match="503"):
        loop.record(dict(EPISODE, task_text="something else entirely"))
    with deltamem.Bank.open(agent_bank, read_only=True) as bank:
        assert len(bank) == 2  # nothing written by the failed call
    with pytest.raises(deltamem.InvalidInputError, match="unknown llm setting"):
        deltamem.MemoryLoop(agent_bank, embedder=toy_embed, llm={"base_url": "x", "model": "m", "tmeout": 1})


def test_builtin_onnx_embedder(tmp_path, chat_server):
    assets = REPO / "assets"
    if not (assets / "minilm" / "model.onnx").exists():
        if require_assets():
            pytest.fail("agent assets missing: run tools/setup-agent-assets.sh")
        pytest.skip("agent assets not installed")
    path = tmp_path / "bank"
    deltamem.Bank.create(path, 384).close()
    loop = deltamem.MemoryLoop(path, assets=assets, llm={"base_url": chat_server, "model": "m", "max_attempts": 1})
    loop.record(EPISODE)
    found = loop.retrieve("heat the water in the pot", "a kitchen with a stove")
    assert found["task"] is not None and found["task"]["score"] > 0.8
    assert loop.retrieve("sort the library books by author", "a library")["task"] is None
