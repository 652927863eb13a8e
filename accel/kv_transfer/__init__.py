"""Moving a prompt's KV cache between engines (prefill/decode disaggregation).

The canonical transfer format (``payload.KVPayload``) is engine-neutral: per layer K and V as
``[tokens, kv_heads, head_dim]`` in the model dtype, with a frozen ``KVDescriptor``. Converters
translate it from and to the TT engine's paged layout (``tt_layout``) and vLLM-CPU's block layout
(``vllm_layout``). ``shm_store`` (with ``shm_ledger``, ``shm_format``) is the same-node data path:
a shared-memory store producers and consumers use directly, no RPC per hand-off. Pure torch and
stdlib, no Ray: the KV-connector actor (``deployments``) is the control plane.
"""
