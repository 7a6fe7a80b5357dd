#!/usr/bin/env python3
"""The memory loop around an agent, from Python: `retrieve` before each
episode, `record` after it.

The environment is a scripted toy (a few kitchen and garden tasks whose
success depends on knowing the right first step); the embedder and the LLM
are Python callables, so this runs anywhere, offline. To use real models,
pass `embedder=my_sentence_transformer_fn` and `llm=my_openai_fn`, or the
built-ins: `embedder="onnx"` (assets from tools/setup-agent-assets.sh) and
`llm={"base_url": ..., "model": ...}` for any OpenAI-compatible server.

    .venv/bin/python python/examples/agent_loop.py [bank-dir]
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile

import numpy as np

import deltamem

DIM = 64

TASKS = [
    ("heat the soup", "a kitchen with a stove", "turn on the stove"),
    ("water the roses", "a garden with a hose", "open the tap"),
    ("heat the milk", "a kitchen with a stove", "turn on the stove"),
    ("water the tulips", "a garden with a hose", "open the tap"),
] * 3


def embed(texts: list[str], role: str) -> np.ndarray:
    """Toy embedder: bag of words hashed into DIM buckets."""
    out = np.zeros((len(texts), DIM), dtype=np.float32)
    for i, text in enumerate(texts):
        for word in text.lower().replace(",", " ").split():
            out[i, hashlib.sha1(word.encode()).digest()[0] % DIM] += 1.0
    return out


def llm(messages: list[dict]) -> str:
    """Toy LLM: 'extracts' the episode's task and environment lines and its
    first action (a real model writes these from the whole episode)."""
    prompt = messages[-1]["content"]
    field = lambda name: next((l.split(": ", 1)[1] for l in prompt.splitlines() if l.startswith(name + ": ")), "")  # noqa: E731
    first_action = next((l[2:] for l in prompt.splitlines() if l.startswith("> ")), "look around")
    return json.dumps(
        {
            "activation_condition": f"tasks like: {field('Task')}",
            "execution_procedure": f"1. {first_action}",
            "termination_condition": "the goal is reached",
            "content": f"in {field('Environment')}, first step tried: {first_action}",
        }
    )


STEPS = ["look around", "open the tap", "turn on the stove"]


def act(n: int, right_step: str, memory: str) -> tuple[str, bool]:
    """Toy agent: follows the first step its memory names (checking the
    successful ones first), else explores one step per episode."""
    remembered = [s for s in STEPS if f"1. {s}" in memory]
    step = right_step if right_step in remembered else STEPS[n % len(STEPS)]
    return f"> {step}\n> finish the task", step == right_step


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="deltamem-agent-") + "/bank"
    deltamem.Bank.create(path, DIM, trees={"task": 0.6, "env": 0.6}).close()
    loop = deltamem.MemoryLoop(path, profile="alfworld", embedder=embed, llm=llm)
    for n, (task, env, right_step) in enumerate(TASKS):
        found = loop.retrieve(task, env)  # before the episode
        trajectory, success = act(n, right_step, found["context"])
        outcome = loop.record(  # after it
            {"task_text": task, "env_text": env, "trajectory": trajectory, "success": success},
            retrieval=found,
        )
        hit = found["task"]["node"] if found["task"] else None
        print(
            f"episode {n:2}: {task!r:20} memory hit {hit!s:4} success {success!s:5}"
            f" -> task tree {outcome['task']['action']}, env tree {outcome['env']['action']}"
        )
    with deltamem.Bank.open(path, read_only=True) as bank:
        stats = bank.stats()
        print(f"bank {path}: {stats['nodes']} nodes, trees {json.dumps({k: v['nodes'] for k, v in stats['trees'].items()})}")


if __name__ == "__main__":
    main()
