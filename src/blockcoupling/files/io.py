"""Atomic NetCDF writes and the provenance attrs every file carries."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from blockcoupling.coupling.arguments import expect, expect_path
from blockcoupling.files.cf import SOURCE, label
from blockcoupling.files.cf import title as cf_title


def git_commit() -> str:
    """The commit of the checkout this package runs from (``-dirty`` when tracked files differ
    from it), or "unknown" outside a git checkout.
    """
    try:
        result = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=40"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return result.stdout.strip() or "unknown"


def versions() -> dict[str, str]:
    """Versions of blockcoupling, torch and transformers and the git commit (attrs of every
    file).
    """
    found = {"git_commit": git_commit()}
    for package in ("blockcoupling", "torch", "transformers"):
        try:
            found[f"{package}_version"] = version(package)
        except PackageNotFoundError:
            found[f"{package}_version"] = "not installed"
    return found


def provenance(config_section: dict[str, Any] | None = None, **attrs: Any) -> dict[str, Any]:
    """Attrs for a file: the given fields, the versions, and the config section as JSON."""
    result = {key: _attr_value(value) for key, value in attrs.items()}
    result.update(versions())
    if config_section is not None:
        result["config"] = json.dumps(config_section, sort_keys=True, default=str)
    return result


def _attr_value(value: Any) -> Any:
    """NetCDF attrs hold str, numbers and lists of them; None becomes ''."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (str, int, float)):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
        return list(value)
    return json.dumps(value, default=str)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def permissions(path: str | Path) -> None:
    """Give ``path`` the usual permissions of a new file: 0666 less the umask."""
    os.chmod(path, 0o666 & ~_umask())


def temp_files(target: Path) -> list[Path]:
    """Temp files ``atomic_write`` made for ``target`` (``.{name}.XXXXXXXX.tmp``), still there."""
    pattern = re.compile(rf"\.{re.escape(target.name)}\.[a-z0-9_]{{8}}\.tmp")
    if not target.parent.is_dir():
        return []
    return [p for p in target.parent.iterdir() if pattern.fullmatch(p.name)]


def atomic_write(path: str | Path, write: Callable[[str], Any]) -> Path:
    """Call ``write(temp_path)`` on a temp file in ``path``'s folder, then os.replace it into place,
    so an interrupted run never leaves a half-written file under the final name. The file gets
    the usual permissions (0666 less the umask), not mkstemp's private 0600. Temp files of the
    same target left by a killed writer (kill -9 runs no clean-up) are removed first: one job
    writes a target at a time.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    for stale in temp_files(target):
        stale.unlink(missing_ok=True)
    handle, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(handle)
    try:
        write(temp)
        permissions(temp)
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return target


def read_utf8(path: str | os.PathLike, name: str | None = None) -> str:
    """A file's text as UTF-8 (newlines as ``read_text`` gives them: CRLF becomes LF), or one
    ValueError naming it (``name``, default the path) and the first byte that is not UTF-8.
    """
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{name or path} is not UTF-8 text (byte {error.start}): re-save it as UTF-8"
        ) from None


def write_text(path: str | Path, text: str) -> Path:
    """Write UTF-8 text atomically (see ``atomic_write``)."""
    return atomic_write(path, lambda temp: Path(temp).write_text(text, encoding="utf-8"))


def replace_marked_block(text: str, source: str | Path, start: str, end: str, body: str) -> str:
    """``text`` (the content of ``source``, named in errors) with the block between its one pair
    of ``start`` / ``end`` markers replaced by ``body``; a ValueError names the file when the
    markers are absent or not one pair.
    """
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.DOTALL)
    if not pattern.search(text):
        raise ValueError(f"{source} has no {start} ... {end} block: add the two markers")
    if text.count(start) != 1 or text.count(end) != 1:
        raise ValueError(
            f"{source} has {text.count(start)} {start} and {text.count(end)} {end} markers: "
            "keep one pair (which block to replace is not clear)"
        )
    return pattern.sub(lambda _: f"{start}\n{body}{end}", text, count=1)


def command_line(argv: list[str] | None = None) -> str:
    """This process's command as a file's history names it: a Snakemake job's script by its
    name in scripts/ (Snakemake runs a temporary copy, ``.snakemake/scripts/tmpXXXX.NAME.py``),
    else the program's name and its arguments.
    """
    argv = list(sys.argv if argv is None else argv) or ["python"]
    script = re.fullmatch(r"tmp\w+\.(\w+\.py)", Path(argv[0]).name)
    if script:
        return f"Snakemake job: scripts/{script[1]}"
    return shlex.join([Path(argv[0]).name, *argv[1:]])


def global_attrs(attrs: dict[str, Any], path: str | Path) -> dict[str, str]:
    """The CF global attributes of a file written at ``path``: ``title`` (``cf.title``, where
    ``attrs`` has none), ``source`` (the measured model's, where ``attrs`` has one, else the
    package and version) and ``history``: ``attrs``'s
    history, then one line with this process's command and the code's commit.
    """
    package = versions()["blockcoupling_version"]
    line = f"{command_line()} (blockcoupling commit {git_commit()})"
    earlier = str(attrs.get("history", ""))
    return {
        "title": str(attrs.get("title") or cf_title(path)),
        # a measured model's own source (hub:REPO@REVISION, a path) stays what it says
        "source": str(attrs.get("source") or SOURCE.format(version=package)),
        "history": f"{earlier}\n{line}" if earlier and line not in earlier else earlier or line,
    }


def write_netcdf(dataset: xr.Dataset, path: str | Path) -> Path:
    """Write a dataset to NetCDF as the workflow does, atomically.

    zlib-compressed, labelled CF-style (``cf.label``: ``long_name`` and ``units`` on every
    variable and coordinate, ``Conventions``) and with its provenance (the versions and git
    commit, where the dataset does not carry those of the job that computed it; ``global_attrs``:
    title, source, history). Encodings
    inherited from files the data was read from are dropped: a string coord read with 8
    characters and concatenated with longer ones would otherwise be written truncated to 8.

    Parameters
    ----------
    dataset : xarray.Dataset
        What to write.
    path : str or pathlib.Path
        The file (its folder is created).

    Returns
    -------
    pathlib.Path
        The file written.

    Examples
    --------
    >>> import blockcoupling as bc
    >>> bc.write_netcdf(coupling, "coupling.nc")  # doctest: +SKIP
    """
    expect(dataset, xr.Dataset, "write_netcdf(dataset=...)")
    expect_path(path, "write_netcdf(path=...)")
    dataset = label(dataset)
    for key, value in versions().items():
        dataset.attrs.setdefault(key, value)
    dataset.attrs.update(global_attrs(dataset.attrs, path))
    dataset.attrs[NONFINITE] = nonfinite_count(dataset)
    for variable in dataset.variables.values():
        variable.encoding = {}
    encoding = {name: {"zlib": True, "complevel": 4} for name in dataset.data_vars}
    try:
        return atomic_write(
            path, lambda temp: dataset.to_netcdf(temp, engine="netcdf4", encoding=encoding)
        )
    except (OSError, RuntimeError) as error:
        # HDF5 reports a full disk as "Permission denied" or "NetCDF: HDF error": when there is
        # not room for the data (the partial file is removed by now), say so
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            raise
        free = shutil.disk_usage(Path(path).absolute().parent).free
        if free >= dataset.nbytes + (1 << 20):
            raise
        raise OSError(
            errno.ENOSPC,
            f"No space left on device: {free:,} bytes free for {dataset.nbytes:,} bytes of "
            f"data (netCDF said: {error})",
            str(path),
        ) from None


# The attr in which ``write_netcdf`` declares how many values of the file are NaN or Inf (the
# outer joins of combined files leave NaN where a model has fewer layers): ``read_netcdf``
# refuses a file holding other non-finite values than it declares.
NONFINITE = "nonfinite_values"


def nonfinite_count(dataset: xr.Dataset) -> int:
    """How many values of ``dataset``'s floating variables and coords are NaN or Inf."""
    return sum(
        int((~np.isfinite(variable.values)).sum())
        for variable in dataset.variables.values()
        if variable.dtype.kind in "fc"
    )


def read_netcdf(path: str | Path) -> xr.Dataset:
    """A NetCDF dataset read fully into memory (the file is closed afterwards).

    A file that cannot be read (truncated by a killed run, say) is one error naming it and the
    remedy, and so is one that holds other NaN/Inf values than its writer declared
    (``NONFINITE``: none where it declares nothing), e.g. values edited after its job wrote it.

    Parameters
    ----------
    path : str or pathlib.Path
        The file.

    Returns
    -------
    xarray.Dataset
        Its contents, loaded.

    Examples
    --------
    >>> import blockcoupling as bc
    >>> coupling = bc.read_netcdf("results/combined/coupling.nc")  # doctest: +SKIP
    """
    expect_path(path, "read_netcdf(path=...)")
    try:
        with xr.open_dataset(path, engine="netcdf4") as dataset:
            loaded = dataset.load()
    except (OSError, ValueError, RuntimeError) as error:
        if isinstance(error, FileNotFoundError):
            raise
        raise ValueError(
            f"{path} cannot be read "
            f"({str(error).splitlines()[0] if str(error) else type(error).__name__}); "
            "it may be truncated: delete it and run snakemake again to rebuild it"
        ) from None
    declared = loaded.attrs.pop(NONFINITE, None)
    found = nonfinite_count(loaded)
    if found != (declared or 0):
        names = [n for n, v in loaded.variables.items() if v.dtype.kind in "fc"]
        bad = [n for n in names if not np.isfinite(loaded[n].values).all()]
        said = "declares none" if declared is None else f"declares {declared}"
        raise ValueError(
            f"{path} holds {found} non-finite (NaN/Inf) values{f' (in {bad[0]})' if bad else ''} "
            f"where it {said}: it changed after its job wrote it, or an older version wrote "
            "it; delete it and run snakemake again to rebuild it"
        )
    return loaded


@contextmanager
def exclusive(side: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the side file ``side`` while the block runs: jobs of one
    run (also on Slurm nodes sharing the folder) that update one record take turns.
    A symlink at ``side`` is refused (OSError naming it), never followed: a planted link would
    make the lock create or lock its target.
    """
    side.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        handle = os.open(side, flags, 0o666)
    except OSError as error:
        if error.errno != errno.ELOOP:
            raise
        raise OSError(
            errno.ELOOP,
            f"the lock file {side} is a symlink (to {os.readlink(side)}), not followed: delete "
            "the link and rerun",
        ) from None
    with os.fdopen(handle, "a") as lock:
        if not stat.S_ISREG(os.fstat(lock.fileno()).st_mode):
            raise OSError(f"the lock file {side} is not a regular file: delete it and rerun")
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
