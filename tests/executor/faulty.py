"""Unit functions that misbehave on purpose (and one that reports its worker's environment).

Workers import this module by name (``faulty:...``): spawned local workers inherit the test
process's ``sys.path``, and the Ray fixture puts this folder on the Ray workers' PYTHONPATH.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any


def raise_unit(args: dict[str, Any]) -> dict[str, Any]:
    raise ValueError(f"unit {args['tag']} refuses")


def exit_unit(args: dict[str, Any]) -> dict[str, Any]:
    os._exit(3)


def sigkill_unit(args: dict[str, Any]) -> dict[str, Any]:
    os.kill(os.getpid(), signal.SIGKILL)
    return {}


def sleep_unit(args: dict[str, Any]) -> dict[str, Any]:
    time.sleep(args["seconds"])
    return {"slept": args["seconds"]}


def flaky_unit(args: dict[str, Any]) -> dict[str, Any]:
    """Fails on its first attempt only: the marker file remembers across worker processes."""
    marker = Path(args["marker"])
    if not marker.exists():
        marker.write_text("failed once")
        raise RuntimeError("first attempt fails")
    return {"recovered": True}


def not_a_dict_unit(args: dict[str, Any]) -> list[int]:
    return [1, 2, 3]


def environment_unit(args: dict[str, Any]) -> dict[str, Any]:
    """What the worker was given: its GPU and its thread budget."""
    return {key: os.environ.get(key) for key in ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")}
