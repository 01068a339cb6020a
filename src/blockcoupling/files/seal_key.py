"""The key that seals run records (``run_record``): 32 random bytes kept outside every results
folder, so that someone who can rewrite a results folder (its files, their records and the run
record) but not the key cannot reseal it consistently.

Where: ``$BLOCKCOUPLING_SEAL_KEY`` (a file path) when set, else
``$XDG_CONFIG_HOME/blockcoupling/seal.key`` (``~/.config/blockcoupling/seal.key`` when
``XDG_CONFIG_HOME`` is unset). The first job that records a result creates it (mode 0600, its
folder 0700); ``verify`` only reads it. On a cluster it must sit on a filesystem the nodes share
(a home folder usually is), or every node seals with its own key.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

ENV = "BLOCKCOUPLING_SEAL_KEY"
SIZE = 32  # bytes of key


class SealKeyError(OSError):
    """A seal key that is not a private regular file of the right form."""


def location() -> Path:
    """Where the seal key is (or will be created)."""
    given = os.environ.get(ENV)
    if given:
        return Path(given).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "blockcoupling" / "seal.key"


def _read(path: Path) -> bytes:
    """The key in ``path`` (hex text), opened without following a symlink nor blocking on a
    FIFO; SealKeyError in one line when it is not a regular file holding one.
    """
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        if isinstance(error, FileNotFoundError):
            raise
        raise SealKeyError(
            f"the seal key {path} cannot be opened ({error.strerror}; a symlink is refused): "
            f"make it a regular file, or set {ENV} to the key's file"
        ) from None
    with os.fdopen(handle, "rb") as key_file:
        if not stat.S_ISREG(os.fstat(key_file.fileno()).st_mode):
            raise SealKeyError(f"the seal key {path} is not a regular file: set {ENV} to the key")
        text = key_file.read(4 * SIZE).decode("ascii", errors="replace").strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != SIZE:
        raise SealKeyError(
            f"the seal key {path} is not {2 * SIZE} hex digits: restore the key that sealed the "
            f"run records (or set {ENV} to it)"
        )
    return key


def load(create: bool = False) -> bytes | None:
    """The seal key; None where there is none and ``create`` is False. With ``create`` a missing
    key is made (written beside its place, then hard-linked into it, so jobs that start at once
    all read the one key the first of them linked).
    """
    path = location()
    try:
        return _read(path)
    except FileNotFoundError:
        if not create:
            return None
    temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        handle = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as error:
        raise SealKeyError(
            f"cannot create the seal key {path} ({error.strerror}): set {ENV} to a file path "
            "you can write, on a filesystem every node of the run shares"
        ) from None
    try:
        with os.fdopen(handle, "w", encoding="ascii") as out:
            out.write(secrets.token_hex(SIZE) + "\n")
        try:
            os.link(temp, path)
        except FileExistsError:  # another job made it first: its key is the key
            pass
    finally:
        temp.unlink(missing_ok=True)
    return _read(path)


def key_id(key: bytes) -> str:
    """A short name of ``key`` (it tells keys apart, and gives nothing about the key)."""
    return hashlib.sha256(b"blockcoupling seal key id\0" + key).hexdigest()[:16]


def mac(key: bytes, text: str) -> str:
    """HMAC-SHA256 of ``text`` under ``key``, hex."""
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).hexdigest()
