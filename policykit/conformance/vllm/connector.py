"""The KV connector that makes vLLM's scheduler behave as a prefill-only node.

In a disaggregated vLLM deployment the prefill instance finishes a request after its prefill
(one sampled token) and its KV connector answers ``request_finished`` with "delay the free":
the blocks stay allocated until the worker reports the transfer to decode as done
(``KVConnectorOutput.finished_sending``), and only then does the scheduler free them. This
connector is that contract and nothing else: no external prefix hits, no loads, no metadata.
The driver decides when each transfer "completes" (``kv_release_rounds`` after the finish) and
reports it through the hand-made ``ModelRunnerOutput``, so the freeing itself is vLLM's code.
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
)

#: what ``KVTransferConfig.kv_connector_module_path`` names to find :class:`HoldKVConnector`
MODULE_PATH = __name__


class HoldKVConnector(KVConnectorBase_V1):
    """Hold every finished request's blocks until the driver reports its transfer done."""

    # -- scheduler side: the only role the driver builds ---------------------------------------
    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int, bool]:
        return 0, False  # nothing cached outside this node

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        return None

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, None]:
        return True, None  # the blocks wait for finished_sending

    # -- worker side: there is no worker; vLLM's scheduler never calls these ------------------
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        raise NotImplementedError("HoldKVConnector has no worker side")

    def wait_for_layer_load(self, layer_name: str) -> None:
        raise NotImplementedError("HoldKVConnector has no worker side")

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kw: Any) -> None:
        raise NotImplementedError("HoldKVConnector has no worker side")

    def wait_for_save(self) -> None:
        raise NotImplementedError("HoldKVConnector has no worker side")
