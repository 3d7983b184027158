"""Choosing an executor by name, as the ``--executor`` option of every command does."""

from __future__ import annotations

import importlib.util

from policykit.errors import PolicykitError
from policykit.executor.base import Executor, ExecutorUnavailable

EXECUTORS = ("local", "ray")


def require_ray() -> None:
    """Fail with the install command when the optional ``ray`` extra is missing."""
    if importlib.util.find_spec("ray") is None:
        raise ExecutorUnavailable(
            "--executor ray needs Ray, which is an optional extra of policykit and is not "
            "installed in this environment. Install it with: pip install 'policykit[ray]' "
            "(it must be installed on every node of the cluster as well)."
        )


def open_executor(
    name: str,
    *,
    workers: int | None = None,
    ray_address: str | None = None,
    timeout: float | None = None,
) -> Executor:
    """A ready executor; close it (or use it as a context manager) when the sweep ends."""
    if name == "local":
        if ray_address is not None:
            raise PolicykitError("--ray-address only applies with --executor ray.")
        from policykit.executor.local import LocalExecutor

        return LocalExecutor(workers, timeout=timeout)
    if name == "ray":
        if workers is not None:
            raise PolicykitError(
                "--workers applies to the local executor; with --executor ray the cluster's "
                "CPUs and GPUs decide how many units run at once."
            )
        require_ray()
        from policykit.executor.ray_cluster import RayExecutor

        return RayExecutor(ray_address, timeout=timeout)
    raise PolicykitError(f"There is no executor {name!r}; choose one of {', '.join(EXECUTORS)}.")
