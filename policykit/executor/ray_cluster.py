"""The Ray executor: one Ray task per unit attempt, on a local or an existing cluster.

Imported only when ``--executor ray`` is asked for, and only after :func:`require_ray` has
checked that the ``ray`` extra is installed, so the core install never needs Ray.

Ray's own task retries are switched off (``max_retries=0``): the driver retries, so every
failed attempt is recorded with its reason instead of being swallowed by a silent re-run.
Units are submitted only while the cluster has a free CPU (or GPU, for GPU units) for them;
a submitted task therefore starts at once, and the timeout, counted from submission, measures
the unit and not its time in Ray's queue.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import ray
from ray.util import get_node_ip_address

from policykit.executor.base import Executor, ExecutorUnavailable
from policykit.executor.work import Attempt, Unit, perform


@ray.remote(max_retries=0)
def _run_unit(unit: dict[str, Any]) -> dict[str, Any]:
    node = ray.get_runtime_context().get_node_id()
    return perform(unit, node=node, host=get_node_ip_address())


class RayExecutor(Executor):
    """Runs units as Ray tasks: ``num_gpus=1`` for GPU units, one CPU otherwise.

    Connects to ``address`` (``auto``, ``ray://host:10001``, ``host:6379``); without one,
    joins the cluster this process already started (a test's ``ray.init``), else follows
    ``RAY_ADDRESS``, else starts a local single-node cluster for the duration of the sweep.
    """

    name = "ray"

    def __init__(self, address: str | None = None, *, timeout: float | None = None) -> None:
        super().__init__(timeout=timeout)
        self.address = address
        self._owns_cluster = not ray.is_initialized()
        if self._owns_cluster:
            if address is not None:
                _check_reachable(address)
            try:
                ray.init(
                    address=address,
                    include_dashboard=False,
                    log_to_driver=False,
                    configure_logging=False,
                )
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise ExecutorUnavailable(
                    f"Could not connect to a Ray cluster at {address or 'a new local cluster'}: "
                    f"{exc}. Check the address (`ray status` on the head node prints it) or "
                    "leave --ray-address out to start a local cluster."
                ) from None
        resources = ray.cluster_resources()
        self.cpus = int(resources.get("CPU", 0))
        self.gpus = int(resources.get("GPU", 0))
        self.nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
        self._running: dict[ray.ObjectRef, tuple[Unit, float]] = {}

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "address": self.address,
            "nodes": self.nodes,
            "cpus": self.cpus,
            "gpus": self.gpus,
        }

    def has_room(self, unit: Unit) -> bool:
        if unit.gpu:
            if self.gpus == 0:
                raise ExecutorUnavailable(
                    f"The unit {unit.id!r} needs a GPU, and the Ray cluster has none."
                )
            return self._gpu_running < self.gpus and len(self._running) < self.cpus
        return len(self._running) < self.cpus

    @property
    def _gpu_running(self) -> int:
        return sum(unit.gpu for unit, _ in self._running.values())

    def busy(self) -> bool:
        return bool(self._running)

    def submit(self, unit: Unit) -> None:
        ref = _run_unit.options(num_cpus=1, num_gpus=1 if unit.gpu else 0).remote(unit.to_dict())
        self._running[ref] = (unit, time.monotonic())

    def collect(self, wait_seconds: float) -> list[Attempt]:
        if not self._running:
            return []
        refs = list(self._running)
        ray.wait(refs, num_returns=1, timeout=wait_seconds)
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        ended = [self._result(ref) for ref in ready]
        if self.timeout is not None:
            now = time.monotonic()
            for ref, (unit, started) in list(self._running.items()):
                if now - started > self.timeout:
                    ray.cancel(ref, force=True)
                    del self._running[ref]
                    reason = f"timed out after {self.timeout:g} s (task cancelled)"
                    ended.append(Attempt(unit.id, False, error=reason))
        return ended

    def _result(self, ref: ray.ObjectRef) -> Attempt:
        unit, _ = self._running.pop(ref)
        try:
            return Attempt.from_dict(ray.get(ref))
        except ray.exceptions.RayError as exc:
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return Attempt(unit.id, False, error=f"{type(exc).__name__}: {first_line}")

    def cancel(self) -> None:
        for ref in self._running:
            ray.cancel(ref, force=True)
        self._running.clear()

    def close(self) -> None:
        if self._owns_cluster:
            ray.shutdown()


def _check_reachable(address: str) -> None:
    """Fail in seconds on an address nobody listens at; ``ray.init`` retries for minutes."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto", "local": Ray resolves these itself
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        raise ExecutorUnavailable(
            f"Nothing answers at the Ray address {address!r} ({exc.strerror or exc}). Check the "
            "address (`ray status` on the head node prints it) and that this machine can reach "
            "the head node's port."
        ) from None
