"""Image sets of the ViT sweep, torch-free: scikit-learn's bundled digits (no download) and
CIFAR-10 (downloaded once into a data folder, read from its python pickle batches).

``prepare(dataset, ...)`` returns a ``Prepared`` set: ``uint8`` images ``(N, C, H, W)`` and
``int64`` labels of a fixed train/test split, with the training set's per-channel mean and
standard deviation; ``write_prepared``/``read_prepared`` keep it as one ``.npz`` file that every
training and extraction job reads, and ``normalized`` turns images into model inputs.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
import shutil
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from blockcoupling.files.io import atomic_write

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
CIFAR10_FOLDER = "cifar-10-batches-py"
# MD5 of each python batch of the official archive, as torchvision lists them
# (pytorch/vision, torchvision/datasets/cifar.py: CIFAR10.train_list and test_list).
CIFAR10_BATCHES = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
}
# What a batch pickle may build: dicts, lists, bytes and ints need no global; numpy arrays
# need these (numpy 1 and 2 spell the module differently). Nothing else is ever imported.
_PICKLE_GLOBALS = frozenset(
    {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),
    }
)
DIGITS_SCALE, CIFAR10_SCALE = 16.0, 255.0  # the largest pixel value of each set


@dataclass(frozen=True)
class Prepared:
    """A split image set: ``x_* (N, C, H, W) uint8``, ``y_* (N,) int64``; ``scale``: the pixel
    value of full intensity; ``mean``/``std`` ``(C,)``: of the training images in [0, 1] units.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    scale: float
    mean: np.ndarray
    std: np.ndarray

    def normalized(self, images: np.ndarray) -> np.ndarray:
        """``(x / scale - mean) / std`` per channel, float32 ``(N, C, H, W)``."""
        x = images.astype(np.float32) / np.float32(self.scale)
        return (x - self.mean[None, :, None, None]) / self.std[None, :, None, None]


def _stats(x_train: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and standard deviation of training images in [0, 1] units (float32)."""
    x = x_train.astype(np.float64) / scale
    return x.mean(axis=(0, 2, 3)).astype(np.float32), x.std(axis=(0, 2, 3)).astype(np.float32)


def digits(split_seed: int = 0, test_fraction: float = 0.2) -> Prepared:
    """scikit-learn's bundled 8 x 8 digits (1,797 images, 10 classes, pixel values 0..16), split
    by a seeded stratified shuffle (``test_fraction`` of each class held out).
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    images = data.images.astype(np.uint8)[:, None]  # (1797, 1, 8, 8), integer values 0..16
    labels = data.target.astype(np.int64)
    train, test = train_test_split(
        np.arange(len(labels)), test_size=test_fraction, stratify=labels, random_state=split_seed
    )
    mean, std = _stats(images[train], DIGITS_SCALE)
    return Prepared(
        images[train], labels[train], images[test], labels[test], DIGITS_SCALE, mean, std
    )


def download_cifar10(data_dir: str | Path, url: str = CIFAR10_URL, md5: str = CIFAR10_MD5) -> Path:
    """The folder of CIFAR-10's python batches under ``data_dir``, downloading and unpacking the
    archive once (checked against its MD5 ``md5``) when it is not there yet. The batches are
    checked, each against its own MD5, by ``read_cifar10`` before it reads them.
    """
    data_dir = Path(data_dir)
    folder = data_dir / CIFAR10_FOLDER
    if not (folder / "test_batch").is_file():
        _unpack(data_dir, url, md5)
    return folder


def _unpack(data_dir: Path, url: str, md5: str) -> None:
    """Download the archive (unless a copy with MD5 ``md5`` is there) and unpack its folder."""
    folder = data_dir / CIFAR10_FOLDER
    archive = data_dir / Path(url).name
    if not archive.is_file() or _md5(archive) != md5:
        logging.info("downloading %s to %s", url, archive)
        data_dir.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(url) as response:  # noqa: S310 (a fixed https/file URL)
            atomic_write(archive, lambda temp: _copy_stream(response, temp))
    if _md5(archive) != md5:
        raise ValueError(f"{archive} does not have the MD5 of CIFAR-10 ({md5}); delete it")
    partial = data_dir / f"{CIFAR10_FOLDER}.tmp"
    shutil.rmtree(partial, ignore_errors=True)
    with tarfile.open(archive, "r:gz") as tar:
        tar.extractall(partial, filter="data")
    shutil.rmtree(folder, ignore_errors=True)
    (partial / CIFAR10_FOLDER).rename(folder)
    shutil.rmtree(partial)


def check_batches(folder: str | Path, batches: dict[str, str] = CIFAR10_BATCHES) -> None:
    """Refuse (one line naming the file) any batch of ``folder`` missing or whose MD5 is not
    the official one in ``batches``.
    """
    for name, md5 in batches.items():
        path = Path(folder) / name
        if not path.is_file():
            raise ValueError(f"{path} is missing; delete {folder} to unpack CIFAR-10 again")
        if _md5(path) != md5:
            raise ValueError(
                f"{path} does not have the MD5 of CIFAR-10's {name} ({md5}): not read; "
                f"delete {folder} to unpack CIFAR-10 again"
            )


def _copy_stream(response: object, path: str) -> None:
    with open(path, "wb") as handle:
        shutil.copyfileobj(response, handle)  # type: ignore[arg-type]


def _md5(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class _BatchUnpickler(pickle.Unpickler):
    """An unpickler that builds only what a CIFAR-10 batch holds (see ``_PICKLE_GLOBALS``)."""

    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in _PICKLE_GLOBALS:
            raise pickle.UnpicklingError(f"{module}.{name} is not in a CIFAR-10 batch")
        return super().find_class(module, name)


def _read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One pickle batch: images ``(n, 3, 32, 32) uint8`` and labels ``(n,) int64``; a file that
    asks for anything but numpy arrays, dicts, lists, bytes and numbers is refused unread.
    """
    try:
        with open(path, "rb") as handle:
            batch = _BatchUnpickler(handle, encoding="bytes").load()
        images = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
        labels = np.asarray(batch[b"labels"], dtype=np.int64)
    except (pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{path} is not a CIFAR-10 batch ({error}); not read") from None
    return images, labels


def read_cifar10(folder: str | Path, batches: dict[str, str] = CIFAR10_BATCHES) -> Prepared:
    """CIFAR-10 from its python batches (``data_batch_1..5`` train, ``test_batch`` test), each
    checked against its MD5 in ``batches`` before it is read.
    """
    folder = Path(folder)
    check_batches(folder, batches)
    train = [_read_batch(folder / f"data_batch_{i}") for i in range(1, 6)]
    x_train = np.concatenate([x for x, _ in train])
    y_train = np.concatenate([y for _, y in train])
    x_test, y_test = _read_batch(folder / "test_batch")
    mean, std = _stats(x_train, CIFAR10_SCALE)
    return Prepared(x_train, y_train, x_test, y_test, CIFAR10_SCALE, mean, std)


def prepare(
    dataset: str, split_seed: int = 0, test_fraction: float = 0.2, data_dir: str | Path = "data"
) -> Prepared:
    """The split set of ``dataset`` (``digits``: bundled; ``cifar10``: from ``data_dir``,
    downloaded there when missing).
    """
    if dataset == "digits":
        return digits(split_seed, test_fraction)
    if dataset == "cifar10":
        return read_cifar10(download_cifar10(data_dir))
    raise ValueError(f"unknown dataset {dataset!r}; digits or cifar10")


FIELDS = ("x_train", "y_train", "x_test", "y_test", "scale", "mean", "std")


def write_prepared(prepared: Prepared, path: str | Path) -> Path:
    """Write a prepared set as one ``.npz`` (atomically)."""
    arrays = {name: np.asarray(getattr(prepared, name)) for name in FIELDS}

    def write(temp: str) -> None:
        with open(temp, "wb") as handle:
            np.savez(handle, **arrays)

    return atomic_write(path, write)


def read_prepared(path: str | Path) -> Prepared:
    """A set written by ``write_prepared``."""
    with np.load(path) as data:
        values = {name: data[name] for name in FIELDS}
    values["scale"] = float(values["scale"])
    return Prepared(**values)
