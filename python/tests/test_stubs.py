"""The type stubs name exactly what the native module has."""

from __future__ import annotations

import ast
import pathlib

import deltamem
from deltamem import _native

STUB = pathlib.Path(deltamem.__file__).with_name("_native.pyi")


def stub_classes() -> dict[str, set[str]]:
    tree = ast.parse(STUB.read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = {
                item.name if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) else item.target.id
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                or (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name))
            }
    return out


def test_every_stubbed_name_exists_and_every_public_method_is_stubbed():
    classes = stub_classes()
    assert set(classes) >= {"Bank", "MemoryLoop", "InsertAck", "Match", "Node", "VerifyReport"}
    for name, members in classes.items():
        runtime = getattr(_native, name)
        for member in members:
            assert hasattr(runtime, member), f"{name}.{member} is in the stub but not in the module"
        public = {m for m in dir(runtime) if not m.startswith("_")}
        assert public <= members, f"{name}: not in the stub: {sorted(public - members)}"
