"""Per-batch choice between sampling inside the mesh program and the host sampler.

Device sampling needs ``sample_on_device_mode == "all"`` (or ``"decode_only"`` on a decode step),
a model declaring ``supports_sample_on_device``, and no row needing something the device sampler
does not do: logit masks (structured outputs, allowed_token_ids, bad_words; the TT plugin's
``check_perform_device_sampling(is_decode, has_structured_outputs)``), logprobs, penalties
(on a prefill step, or where the class declares ``supports_device_penalties`` False), logit_bias,
min_tokens, min_p, or a
top-k wider than ``max_device_top_k`` when the model declares one. An intermediate
chunked-prefill row also forces the host, so the device RNG never advances for a row that emits
no token. One offending row sends the whole batch to the host (the host path takes logits for
every row).

Pure logic: no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from accel.contract import SamplingParams
from accel.tt.mesh_model import MAX_DEVICE_TOP_K, SUPPORTS_DEVICE_PENALTIES, SUPPORTS_SAMPLE_ON_DEVICE
from accel.tt.step_plan import RowPlan, StepPlan


@dataclass(frozen=True)
class SamplingPolicy:
    sample_on_device_mode: str | None
    always_compat_sampling: bool
    model_capabilities: Mapping[str, Any]
    # The widest ``logprobs`` the device sampler serves (``device_logprobs_limit``); None: host.
    max_device_logprobs: int | None = None
    # id(SamplingParams) -> (that object, its host reason); see params_host_reason.
    _reasons: dict[int, tuple[SamplingParams, str | None]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def use_device(self, plan: StepPlan) -> bool:
        """True when the whole batch of ``plan`` may be sampled on the device."""
        return self.host_reason(plan) is None

    def host_reason(self, plan: StepPlan) -> str | None:
        """Why ``plan`` samples on the host (None = on the device)."""
        if self.always_compat_sampling:
            return "always_compat_sampling"
        if self.sample_on_device_mode is None:
            return "sample_on_device_mode unset"
        if self.sample_on_device_mode == "decode_only" and not plan.is_decode:
            return "sample_on_device_mode=decode_only on a prefill step"
        if not self.model_capabilities.get(SUPPORTS_SAMPLE_ON_DEVICE, False):
            return "model does not declare supports_sample_on_device"
        for row in plan.rows:
            reason = self.row_host_reason(row)
            if reason is None and not plan.is_decode and row.sampling.has_penalties:
                reason = "penalties on a prefill step (no token histories sent with a prefill)"
            if reason is not None:
                return f"{row.req_id}: {reason}"
        return None

    def row_host_reason(self, row: RowPlan) -> str | None:
        if not row.samples:
            return "intermediate chunked-prefill row"
        return self.params_host_reason(row.sampling)

    def params_host_reason(self, sp: SamplingParams) -> str | None:
        # Cached per SamplingParams object (a request keeps its object for life); the entry keeps
        # the object alive so its id cannot be reused while cached.
        entry = self._reasons.get(id(sp))
        if entry is not None and entry[0] is sp:
            return entry[1]
        if len(self._reasons) > 8192:
            self._reasons.clear()
        reason = self._params_reason(sp)
        self._reasons[id(sp)] = (sp, reason)
        return reason

    def _params_reason(self, sp: SamplingParams) -> str | None:
        if sp.has_logit_constraints:
            return "structured outputs / allowed_token_ids / bad_words (host logit masks)"
        if sp.logprobs is not None and (self.max_device_logprobs is None or sp.logprobs > self.max_device_logprobs):
            return "logprobs"
        if sp.has_penalties and not self.model_capabilities.get(SUPPORTS_DEVICE_PENALTIES, True):
            return "penalties"
        if sp.logit_bias:
            return "logit_bias"
        if sp.min_tokens > 0:
            return "min_tokens"
        if sp.min_p > 0:
            return "min_p"
        max_top_k = self.model_capabilities.get(MAX_DEVICE_TOP_K)
        if max_top_k and not sp.is_greedy and (sp.top_k == 0 or sp.top_k > int(max_top_k)):
            return f"top_k wider than the device sampler's {max_top_k} candidates"
        return None


def device_logprobs_limit(num_devices: int, model_type: str) -> int | None:
    """vllm-tt-plugin e3fc849 ``check_perform_device_sampling``: log probs on the device only on
    8- or 32-device meshes (tt-metal#34077); there, the sampled token's log prob (``logprobs=0``)
    from every model, top-32 only from those returning the top-k pair (gpt_oss, by model type)."""
    if num_devices not in (8, 32):
        return None
    return 32 if model_type == "gpt_oss" else 0
