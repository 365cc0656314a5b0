"""The continuous-batching engine: add requests, step, read new tokens, abort.

One step is: schedule, (draft), one packed forward, sample or verify, emit.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch

from engine.attention import KVCache
from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.detokenizer import IncrementalDetokenizer
from engine.loader import load_hf_model, resolve_device, resolve_dtype, resolve_model
from engine.model import DecoderLM
from engine.model_runner import ModelRunner
from engine.sampler import SamplingBatch, sample
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence, SequenceStatus, TapBuffer

log = logging.getLogger(__name__)

CPU_KV_CACHE_DEFAULT_GB = 2.0
MAX_CONTEXT_DEFAULT = 8192


class QueueFullError(RuntimeError):
    """The engine's admission queue is full; the caller should retry later (HTTP 429)."""


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # every output token so far
    text: str  # every output character released so far
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None
    metrics: dict = field(default_factory=dict)
    logprobs: list[dict[int, float]] | None = None  # per output token so far (the sequence's live list)


@dataclass
class EngineCounters:
    """Monotonic counters; rates are derived by whoever reads them."""

    steps: int = 0
    prompt_tokens: int = 0  # prompt (and recomputed) tokens run through the model
    generation_tokens: int = 0
    requests_finished: int = 0
    preemptions: int = 0
    step_time_s: float = 0.0


class LLMEngine:
    def __init__(self, config: EngineConfig | None = None, **overrides):
        config = (config or EngineConfig()).model_copy(update=overrides)
        self.config = config
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        path = resolve_model(config.model)
        hf_model, self.tokenizer = load_hf_model(path, self.dtype)
        self.model_path = path
        self.model_name = config.model or "SmolLM2-135M-Instruct"
        hf_cfg = hf_model.config
        num_layers = hf_cfg.num_hidden_layers
        for layer in config.tap_layers:
            if not 0 <= layer < num_layers:
                raise ValueError(f"tap layer {layer} out of range: the model has {num_layers} decoder layers")
        self.tap_layers = tuple(config.tap_layers)

        head_dim = getattr(hf_cfg, "head_dim", None) or hf_cfg.hidden_size // hf_cfg.num_attention_heads
        per_block = KVCache.bytes_per_block(num_layers, config.block_size, hf_cfg.num_key_value_heads, head_dim,
                                            self.dtype)
        num_blocks = self._kv_budget_bytes(hf_model) // per_block
        model_max = getattr(hf_cfg, "max_position_embeddings", MAX_CONTEXT_DEFAULT)
        if config.max_model_len and config.max_model_len > model_max:
            raise ValueError(f"max_model_len {config.max_model_len} exceeds the model's {model_max} positions")
        max_len = min(config.max_model_len or min(model_max, MAX_CONTEXT_DEFAULT), num_blocks * config.block_size)
        window = getattr(hf_cfg, "sliding_window", None)
        if window and getattr(hf_cfg, "use_sliding_window", True):
            max_len = min(max_len, window)  # within the window, sliding attention equals full attention
        if max_len < 2:
            raise ValueError("the KV cache budget is too small for even one sequence")
        self.max_model_len = max_len

        self.model = DecoderLM(hf_model, self.device, self.dtype, max_positions=max_len + 64,
                               block_size=config.block_size)
        self.kv_cache = KVCache(num_layers, num_blocks, config.block_size, hf_cfg.num_key_value_heads, head_dim,
                                self.dtype, self.device, k_transposed=self.model.ops.fused)
        del hf_model
        self.block_manager = BlockManager(num_blocks, config.block_size)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens)
        self.runner = ModelRunner(self.model, self.kv_cache, self.tap_layers)
        self.eos_token_ids = _eos_ids(self.tokenizer, path)
        self.generator = torch.Generator(device=self.device).manual_seed(config.seed)
        self.requests: dict[str, Sequence] = {}
        self.counters = EngineCounters()
        log.info("engine ready: %s on %s/%s, %d KV blocks (%d tokens), max_model_len %d", self.model_name,
                 self.device, str(self.dtype).removeprefix("torch."), num_blocks, num_blocks * config.block_size,
                 max_len)

    def _kv_budget_bytes(self, hf_model) -> int:
        if self.config.kv_cache_memory_gb:
            return int(self.config.kv_cache_memory_gb * 2**30)
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            weights = sum(p.numel() for p in hf_model.parameters()) * torch.finfo(self.dtype).bits // 8
            return int((free - weights) * self.config.gpu_memory_utilization)
        return int(CPU_KV_CACHE_DEFAULT_GB * 2**30)

    # ----- requests -----------------------------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams | None = None,
                    arrival_time: float | None = None) -> None:
        params = params or SamplingParams()
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if len(self.scheduler.waiting) >= self.config.max_waiting:
            raise QueueFullError(f"the queue is full ({self.config.max_waiting} waiting requests); retry later")
        token_ids = self.encode(prompt)
        seq = Sequence(
            request_id=request_id,
            prompt_token_ids=token_ids,
            params=params,
            detokenizer=IncrementalDetokenizer(self.tokenizer, token_ids, params.stop_strings),
            arrival_time=arrival_time if arrival_time is not None else time.monotonic(),
            generator=None if params.seed is None else torch.Generator(self.device).manual_seed(params.seed),
        )
        if params.logprobs is not None:
            seq.logprobs = []
        if self.tap_layers:
            seq.taps = TapBuffer(len(self.tap_layers) * self.model.hidden_size, self.dtype, self.device)
        self.requests[request_id] = seq
        self.scheduler.add(seq)

    def encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            token_ids = self.tokenizer(prompt, add_special_tokens=True).input_ids
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            token_ids = list(prompt)
            bad = [t for t in token_ids if not 0 <= t < self.model.vocab_size]
            if bad:
                raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {self.model.vocab_size})")
        else:
            raise ValueError("prompt must be a string or a list of token ids")
        if not token_ids:
            raise ValueError("prompt is empty")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(token_ids)} tokens, but the context holds at most {self.max_model_len} tokens "
                "including at least one output token"
            )
        return token_ids

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now and free its KV blocks. Returns False if it was unknown or already finished."""
        seq = self.requests.pop(request_id, None)
        if seq is None:
            return False
        self._finish(seq, "abort")
        return True

    def truncate(self, request_id: str, new_len: int) -> None:
        """Roll a sequence back to its first `new_len` tokens, freeing the KV blocks past them."""
        seq = self.requests[request_id]
        if not seq.num_prompt_tokens <= new_len <= seq.num_tokens:
            raise ValueError(f"cannot truncate to {new_len}: prompt {seq.num_prompt_tokens}, length {seq.num_tokens}")
        del seq.token_ids[new_len:]
        seq.num_computed_tokens = min(seq.num_computed_tokens, new_len - 1)
        if seq.taps is not None:
            seq.taps.truncate(seq.num_computed_tokens)
        self.block_manager.truncate(seq, seq.num_computed_tokens)
        # Re-derive the text from the kept tokens.
        seq.detokenizer = IncrementalDetokenizer(self.tokenizer, seq.prompt_token_ids, seq.params.stop_strings)
        for t in seq.output_token_ids:
            seq.detokenizer.push(t)
        seq.text = seq.detokenizer.text
        seq.num_emitted_tokens = min(seq.num_emitted_tokens, seq.num_output_tokens)
        seq.num_emitted_chars = min(seq.num_emitted_chars, len(seq.text))

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    # ----- the step -----------------------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        if not self.scheduler.has_unfinished():
            return []
        t0 = time.perf_counter()
        sched = self.scheduler.schedule()
        self.counters.preemptions += len(sched.preempted)
        if not sched.scheduled:
            return []
        out = self.runner.execute(sched.scheduled)
        sampling = [out.order[i] for i in out.logit_rows]
        tokens: list[int] = []
        if sampling:
            batch = SamplingBatch.build([s.seq.params for s in sampling], [s.seq.generator for s in sampling],
                                        self.device)
            tokens = sample(out.logits, batch, self.generator, self.model.ops.argmax).tolist()
        touched = []
        for i, s in enumerate(out.order):
            seq = s.seq
            if seq.taps is not None:
                seq.taps.write(seq.num_computed_tokens, out.taps[i][: s.num_new_tokens])
            seq.num_computed_tokens += s.num_new_tokens
            if seq.num_computed_tokens <= seq.num_prompt_tokens:
                self.counters.prompt_tokens += s.num_new_tokens
        if any(s.seq.params.logprobs is not None for s in sampling):
            self._record_logprobs(out.logits, [s.seq for s in sampling], tokens)
        for s, token in zip(sampling, tokens):
            self._append_token(s.seq, token)
            touched.append(s.seq)
        self.counters.steps += 1
        self.counters.step_time_s += time.perf_counter() - t0
        return [self._output(seq) for seq in touched]

    @staticmethod
    def _record_logprobs(logits: torch.Tensor, seqs: list[Sequence], tokens: list[int]) -> None:
        """Top-k log-probabilities of the raw model distribution at each sampled row, plus the sampled token's."""
        rows = [i for i, s in enumerate(seqs) if s.params.logprobs is not None]
        k = max(seqs[i].params.logprobs for i in rows)
        lp = torch.log_softmax(logits[rows].float(), dim=-1)
        chosen = lp.gather(1, torch.tensor([tokens[i] for i in rows], device=lp.device)[:, None])[:, 0].tolist()
        top_v, top_i = lp.topk(k, dim=-1) if k else (lp[:, :0], lp[:, :0].long())
        top_v, top_i = top_v.tolist(), top_i.tolist()
        for j, i in enumerate(rows):
            n = seqs[i].params.logprobs
            entry = dict(zip(top_i[j][:n], top_v[j][:n]))
            entry[tokens[i]] = chosen[j]
            seqs[i].logprobs.append(entry)

    def _append_token(self, seq: Sequence, token: int) -> bool:
        """Append one output token and apply the stop rules; True if the sequence finished."""
        seq.token_ids.append(token)
        self.counters.generation_tokens += 1
        if seq.first_token_time is None:
            seq.first_token_time = time.monotonic()
        p = seq.params
        reason = None
        if (token in self.eos_token_ids and not p.ignore_eos) or token in p.stop_token_ids:
            reason = "stop"
        elif seq.detokenizer.push(token) is not None:
            reason = "stop"
        elif seq.num_output_tokens >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            reason = "length"
        seq.text = seq.detokenizer.text
        if reason:
            self._finish(seq, reason)
        return reason is not None

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.finish_time = time.monotonic()
        self.scheduler.finish(seq, reason)
        self.requests.pop(seq.request_id, None)
        self.counters.requests_finished += 1

    def _output(self, seq: Sequence) -> RequestOutput:
        out_ids = seq.output_token_ids
        new_ids = out_ids[seq.num_emitted_tokens:]
        seq.num_emitted_tokens = len(out_ids)
        end = seq.detokenizer.releasable(seq.finished)
        new_text = seq.text[seq.num_emitted_chars: end]
        seq.num_emitted_chars = max(seq.num_emitted_chars, end)
        return RequestOutput(
            request_id=seq.request_id,
            prompt_token_ids=seq.prompt_token_ids,
            token_ids=list(out_ids),
            text=seq.text[:seq.num_emitted_chars],
            new_token_ids=new_ids,
            new_text=new_text,
            finished=seq.finished,
            finish_reason=seq.finish_reason,
            metrics=self._metrics(seq),
            logprobs=seq.logprobs,
        )

    def _metrics(self, seq: Sequence) -> dict:
        m = {
            "num_prompt_tokens": seq.num_prompt_tokens,
            "num_output_tokens": seq.num_output_tokens,
            "num_preemptions": seq.num_preemptions,
        }
        if seq.first_token_time is not None:
            m["ttft_s"] = seq.first_token_time - seq.arrival_time
        if seq.finish_time is not None:
            m["e2e_s"] = seq.finish_time - seq.arrival_time
            if seq.first_token_time is not None and seq.num_output_tokens > 1:
                m["tpot_s"] = (seq.finish_time - seq.first_token_time) / (seq.num_output_tokens - 1)
        return m


def _eos_ids(tokenizer, path) -> set[int]:
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    try:
        from transformers import GenerationConfig

        eos = GenerationConfig.from_pretrained(path).eos_token_id
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    except OSError:
        pass
    return ids
