"""deltamem: embedded, crash-safe experience memory for LLM agents.

The engine is the Rust library of this repository; this package is a thin
layer over it (see docs/PYTHON.md):

- :class:`Bank`: create/open a bank, insert and query with NumPy arrays,
  everything the ``deltamem`` command can do.
- :class:`MemoryLoop`: the online memory loop (``retrieve`` before an
  episode, ``record`` after it) with the built-in ONNX embedder and HTTP
  LLM client, or your own Python callables.
- :mod:`deltamem.errors`: the exceptions, all subclasses of :class:`Error`.
"""

from ._native import (
    Bank,
    ConsolidateAck,
    HitAck,
    InsertAck,
    Match,
    MemoryLoop,
    Node,
    Problem,
    VerifyReport,
    __version__,
)
from . import errors
from .errors import *  # noqa: F403 - the exception classes, listed in errors.__all__

__all__ = [
    "Bank",
    "MemoryLoop",
    "InsertAck",
    "Match",
    "Node",
    "HitAck",
    "ConsolidateAck",
    "Problem",
    "VerifyReport",
    "__version__",
    *errors.__all__,
]
