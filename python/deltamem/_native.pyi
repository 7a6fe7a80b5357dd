"""Type stubs of the native module (python/src); see docs/PYTHON.md."""

from __future__ import annotations

import os
import pathlib
from typing import Any, Callable, Iterator, Literal, Mapping, Sequence, Union, overload

import numpy as np
import numpy.typing as npt

__version__: str

NodeId = Union[int, str]
"""An int is a node's index, a str its external id."""
Attach = Union[Literal["auto", "root"], int, str]
Label = Literal["SUCCESS", "FAILURE"]
Sync = Literal["always", "batch", "none"]
Vector = Union[npt.NDArray[np.floating[Any]], Sequence[float]]
Matrix = Union[npt.NDArray[np.floating[Any]], Sequence[Sequence[float]]]
PathLike = Union[str, os.PathLike[str]]

class InsertAck:
    id: int
    tree: str
    type: Literal["ROOT", "RESIDUAL"]
    parent: int | None
    depth: int
    matched: tuple[int, float] | None
    lsn: int

class Match:
    id: int
    score: float
    depth: int
    type: Literal["ROOT", "RESIDUAL"]
    label: Label
    chain: list[int]

class Node:
    id: int
    tree: str
    type: Literal["ROOT", "RESIDUAL"]
    label: Label
    depth: int
    parent: int | None
    external_id: str | None
    scenario: str
    payload: dict[str, str]
    success_hits: int
    retrievals: int
    consolidated: bool
    consolidated_root: bool
    link: int | None
    created_unix_ms: int

class HitAck:
    id: int
    success_hits: int
    due: bool
    lsn: int

class ConsolidateAck:
    source: int
    new_root: int
    lsn: int

class Problem:
    file: str
    offset_bytes: int
    detail: str

class VerifyReport:
    ok: bool
    nodes_checked: int
    wal_records: int
    problems: list[Problem]
    def __bool__(self) -> bool: ...

class NodeIter(Iterator[Node]):
    def __iter__(self) -> NodeIter: ...
    def __next__(self) -> Node: ...
    def __len__(self) -> int: ...

class Bank:
    @staticmethod
    def create(
        path: PathLike,
        dim: int,
        trees: Mapping[str, float] | None = None,
        eps: float = 0.05,
        max_depth: int = 5,
        consolidate_after: int = 3,
        precision: Literal["f32", "f16", "int8"] = "f32",
        sync: Sync = "always",
        rows_per_segment: int | None = None,
    ) -> Bank: ...
    @staticmethod
    def open(
        path: PathLike, read_only: bool = False, sync: Sync = "always", query_threads: int = 1, lock_wait_s: float = 0.0
    ) -> Bank: ...
    def __enter__(self) -> Bank: ...
    def __exit__(self, *exc: object) -> bool: ...
    def close(self) -> None: ...
    def refresh(self) -> None: ...
    @property
    def path(self) -> pathlib.Path: ...
    @property
    def dim(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    @property
    def read_only(self) -> bool: ...
    @property
    def precision(self) -> Literal["f32", "f16", "int8"]: ...
    @property
    def trees(self) -> dict[str, float]: ...
    @property
    def query_threads(self) -> int: ...
    def set_query_threads(self, threads: int) -> None: ...
    def __len__(self) -> int: ...
    def insert(
        self,
        tree: str,
        embedding: Vector,
        scenario: str,
        payload: Mapping[str, str] | None = None,
        label: Label = "SUCCESS",
        attach: Attach | None = None,
        external_id: str | None = None,
        sync: Sync | None = None,
    ) -> InsertAck: ...
    def insert_many(
        self,
        tree: str,
        embeddings: Matrix,
        scenarios: Sequence[str] | str,
        payloads: Sequence[Mapping[str, str]] | Mapping[str, str] | None = None,
        labels: Sequence[Label] | Label | None = None,
        attach: Sequence[Attach] | Attach | None = None,
        external_ids: Sequence[str | None] | None = None,
        sync: Sync | None = None,
    ) -> list[InsertAck]: ...
    def load(
        self,
        tree: str,
        embeddings: Matrix,
        scenarios: Sequence[str] | str | None = None,
        payloads: Sequence[Mapping[str, str]] | Mapping[str, str] | None = None,
        labels: Sequence[Label] | Label | None = None,
        attach: Sequence[Attach] | Attach | None = None,
        external_ids: Sequence[str | None] | None = None,
    ) -> npt.NDArray[np.int64]: ...
    def query(
        self,
        tree: str,
        embedding: Vector,
        k: int = 1,
        tau: float | None = None,
        eps: float | None = None,
        include_consolidated: bool = False,
    ) -> list[Match]: ...
    @overload
    def query_batch(
        self,
        tree: str,
        queries: Matrix,
        k: int = 1,
        tau: float | None = None,
        eps: float | None = None,
        include_consolidated: bool = False,
        chains: Literal[False] = False,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]: ...
    @overload
    def query_batch(
        self,
        tree: str,
        queries: Matrix,
        k: int = 1,
        tau: float | None = None,
        eps: float | None = None,
        include_consolidated: bool = False,
        *,
        chains: Literal[True],
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32], list[list[list[int]]]]: ...
    def node(self, id: NodeId) -> Node: ...
    def resolve_id(self, external_id: NodeId) -> int: ...
    def nodes(self, tree: str | None = None) -> NodeIter: ...
    def chain(self, id: NodeId) -> list[int]: ...
    def render_chain(self, id: NodeId) -> str: ...
    def embeddings(self, tree: str | None = None) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]: ...
    def success_hit(self, id: NodeId, sync: Sync | None = None) -> HitAck: ...
    def record_retrievals(self, ids: Sequence[NodeId]) -> int: ...
    def due(self, tree: str | None = None) -> list[int]: ...
    def consolidate(self, id: NodeId, payload: Mapping[str, str]) -> ConsolidateAck: ...
    def checkpoint(self) -> None: ...
    def sync(self) -> None: ...
    def stats(self) -> dict[str, Any]: ...
    def verify(self) -> VerifyReport: ...
    def freeze(self, out: PathLike) -> dict[str, Any]: ...
    def compact(self) -> dict[str, Any]: ...
    def import_reference(self, tree: str, path: PathLike, batch: int = 4096, sync: Sync | None = None) -> list[int]: ...
    def export_reference(
        self, tree: str, path: PathLike, format: Literal["reference-json", "jsonl"] = "reference-json"
    ) -> int: ...
    def import_npy(
        self,
        tree: str,
        path: PathLike,
        scenarios: Sequence[str] | None = None,
        payloads: Sequence[Mapping[str, str]] | Mapping[str, str] | None = None,
        labels: Sequence[Label] | Label | None = None,
        attach: Sequence[Attach] | Attach | None = None,
        external_ids: Sequence[str | None] | None = None,
    ) -> npt.NDArray[np.int64]: ...
    def export_npy(self, tree: str, path: PathLike) -> npt.NDArray[np.int64]: ...

Embedder = Callable[[list[str], Literal["query", "passage"]], npt.ArrayLike]
ChatFn = Callable[[list[dict[str, str]]], str]

class MemoryLoop:
    def __init__(
        self,
        bank_path: PathLike,
        profile: str | Mapping[str, Any] | None = None,
        embedder: Embedder | Literal["onnx"] | None = None,
        llm: ChatFn | Mapping[str, Any] | None = None,
        assets: PathLike | None = None,
        task_tree: str = "task",
        env_tree: str = "env",
        include_consolidated: bool = False,
        sync: Sync = "always",
        lock_wait_s: float = 30.0,
        max_steps: int | None = None,
    ) -> None: ...
    def retrieve(self, task: str, env: str) -> dict[str, Any]: ...
    def record(self, episode: Mapping[str, Any], retrieval: Mapping[str, Any] | None = None) -> dict[str, Any]: ...
    def consolidate_due(self) -> list[dict[str, Any]]: ...
