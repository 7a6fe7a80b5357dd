"""Shared fixtures: small banks in temporary directories, the CLI binary."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest

import deltamem

REPO = pathlib.Path(__file__).resolve().parents[2]
DIM = 8


def unit(i: int, dim: int = DIM) -> np.ndarray:
    """The i-th basis vector (float32)."""
    v = np.zeros(dim, dtype=np.float32)
    v[i % dim] = 1.0
    return v


def near(i: int, j: int, weight: float = 0.1, dim: int = DIM) -> np.ndarray:
    """Mostly basis vector i, a little of j: similar to unit(i) (cos ~0.995)."""
    v = unit(i, dim) + weight * unit(j, dim)
    return v.astype(np.float32)


def random_rows(n: int, dim: int = DIM, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, dim)).astype(np.float32)


@pytest.fixture
def bank_path(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "bank"


@pytest.fixture
def bank(bank_path: pathlib.Path):
    b = deltamem.Bank.create(bank_path, DIM)
    yield b
    b.close()


@pytest.fixture(scope="session")
def cli() -> pathlib.Path:
    """The release `deltamem` command (built by tools/setup.sh)."""
    path = REPO / "target" / "release" / "deltamem"
    if not path.exists():
        pytest.fail(f"{path} is missing: run tools/setup.sh (or cargo build --release)")
    return path


def require_assets() -> bool:
    return os.environ.get("DELTAMEM_REQUIRE_ASSETS") == "1"
