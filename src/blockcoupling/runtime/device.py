"""The device a job runs on, checked against what this torch sees."""

from __future__ import annotations


def resolve_device(device: str) -> str:
    """``auto``: ``cuda`` when a GPU is visible, else ``cpu``; any other name unchanged once
    torch knows it and, for ``cuda[:N]``, sees that GPU (else a one-line ValueError).
    """
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise ValueError(
            f"device {device!r} is not a torch device (auto, cpu, cuda[:N], mps)"
        ) from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else "no GPU visible"
        raise ValueError(f"device {device!r}: this torch sees no CUDA GPU ({build})")
    if parsed.type == "cuda" and (parsed.index or 0) >= torch.cuda.device_count():
        raise ValueError(
            f"device {device!r}: this torch sees {torch.cuda.device_count()} CUDA GPU(s)"
        )
    return device
