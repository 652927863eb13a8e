"""Moving a prompt's KV cache between engines (prefill/decode disaggregation).

The canonical transfer format (``payload.KVPayload``) is engine-neutral: per layer K and V as
``[tokens, kv_heads, head_dim]`` in the model dtype, with a frozen ``KVDescriptor``. Converters
translate it from and to the TT engine's paged layout (``tt_layout``) and vLLM-CPU's block layout
(``vllm_layout``). Pure torch, no Ray: the KV-connector actor moves payloads, this package shapes them.
"""
