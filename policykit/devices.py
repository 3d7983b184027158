"""Choosing the torch device the KV pool (and the model) live on."""

from __future__ import annotations

import torch

from policykit.errors import PolicykitError


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when present; asking for CUDA without it is a usage error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise PolicykitError(f"{name!r} is not a device; use auto, cpu or cuda.") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise PolicykitError(
            f"The device {name!r} was asked for, but this torch build sees no CUDA device "
            f"(torch {torch.__version__}). Use --device cpu, or run on a machine with a GPU."
        )
    if device.type not in ("cpu", "cuda"):
        raise PolicykitError(f"The device {name!r} is not supported; use auto, cpu or cuda.")
    return device
