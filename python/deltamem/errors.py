"""The exceptions deltamem raises.

Every one derives from :class:`Error`, so ``except deltamem.Error`` catches
them all; the subclasses say what a caller can do about it. Details travel
as attributes (``file`` and ``offset_bytes`` of a corrupt file,
``position`` of the refused item of a batch) as well as in the message.
"""

from __future__ import annotations

from typing import Any


class Error(Exception):
    """Base class of every deltamem error."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        #: Position of the refused item in an insert_many / load batch.
        self.position: int | None = None
        for key, value in details.items():
            setattr(self, key, value)

    def __str__(self) -> str:
        # KeyError (a base of NotFoundError) would quote the message.
        return self.message


class IoError(Error, OSError):
    """An operating-system I/O call failed (also an :class:`OSError`).

    ``file`` names the file; ``errno`` is the OS error number when the
    system gave one (e.g. ``errno.ENOSPC`` for a full disk). When the call
    was a write or fsync of the bank's own log or checkpoint, the handle is
    also poisoned: later writes raise :class:`PoisonedError` until the bank
    is reopened.
    """

    file: str


class LockedError(Error):
    """Another process holds the bank's writer lock (worth retrying later)."""


class CorruptError(Error):
    """A bank file failed a checksum or structural check.

    ``file`` and ``offset_bytes`` say where.
    """

    file: str
    offset_bytes: int


class PoisonedError(Error):
    """A write or fsync failed earlier; the bank refuses writes until reopened."""


class ReadOnlyError(Error):
    """A write was attempted on a bank opened with ``read_only=True`` (or frozen)."""


class NotFoundError(Error, KeyError):
    """No such node, tree or bank (also a :class:`KeyError`)."""


class InvalidInputError(Error, ValueError):
    """The input was refused (also a :class:`ValueError`); nothing was written."""


class ClosedError(Error):
    """The bank was closed; open it again."""


class AgentError(Error):
    """The memory loop failed: an embedder, LLM or reply problem.

    When a Python embedder or LLM callable raised, its exception is this
    one's ``__cause__``. Nothing was written to the bank.
    """


__all__ = [
    "Error",
    "IoError",
    "LockedError",
    "CorruptError",
    "PoisonedError",
    "ReadOnlyError",
    "NotFoundError",
    "InvalidInputError",
    "ClosedError",
    "AgentError",
]
