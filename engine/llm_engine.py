"""The continuous-batching engine: add requests, step, read new tokens, abort.

One step is: schedule, (draft), one packed forward, sample or verify, emit.
"""
from __future__ import annotations

import logging
import time
from bisect import bisect_left
from dataclasses import asdict, dataclass, field

import torch

from engine import device_io
from engine.attention import KVCache
from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.detokenizer import IncrementalDetokenizer, fast_decode
from engine.drafter import ContextSync, Drafter, DrafterFactory, DraftTarget, DraftWork, installed_drafter
from engine.load import LoadMonitor, StepLoad
from engine.loader import load_hf_model, resolve_device, resolve_drafter, resolve_dtype, resolve_model
from engine.model import DecoderLM
from engine.model_runner import ModelRunner
from engine.penalties import apply_penalties, has_penalties
from engine.sampler import SamplingBatch, sample
from engine.sampling_params import SamplingParams
from engine.scheduler import ScheduledSeq, Scheduler
from engine.sequence import Sequence, TapBuffer
from engine.spec_mode import DEFAULT_SPECULATION, parse_speculation
from engine.speculator import Speculator
from engine.step_cost import Curve, StepCostModel

log = logging.getLogger(__name__)

CPU_KV_CACHE_DEFAULT_GB = 2.0
MAX_CONTEXT_DEFAULT = 8192
TAP_RESERVE_LAYERS = 5  # taps budgeted per cached block before the drafter says how many it reads (DSpark's 5)


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
    logprobs: list[dict[int, float]] | None = None  # per output token so far


# Bucket bounds of the engine's histograms: vLLM's (so a server can publish vLLM's families exactly) and, for
# latencies, the millisecond range a small model on a CPU lives in.
INTER_TOKEN_LATENCY_BOUNDS_S = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
ITERATION_TOKENS_BOUNDS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


@dataclass
class Histogram:
    """Observations counted in fixed buckets, as Prometheus keeps them: counts[i] holds those in
    (bounds[i-1], bounds[i]], and a last count those above every bound."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    sum: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = self.counts or [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1


@dataclass
class EngineCounters:
    """Monotonic counters; rates are derived by whoever reads them."""

    steps: int = 0
    prompt_tokens: int = 0  # prompt (and recomputed) tokens run through the model
    generation_tokens: int = 0
    requests_finished: int = 0
    preemptions: int = 0
    prefix_cache_queries: int = 0  # tokens of admitted requests looked up in the prefix cache
    prefix_cache_hits: int = 0  # of them, found there
    step_time_s: float = 0.0
    # Per step that gives a request tokens, the time since the step that last gave it tokens (vLLM's inter-token
    # latency: with speculation, one observation however many tokens the step accepted).
    inter_token_latency_s: Histogram = field(default_factory=lambda: Histogram(INTER_TOKEN_LATENCY_BOUNDS_S))
    # Prompt tokens run plus tokens generated, per step (vLLM's iteration_tokens_total).
    iteration_tokens: Histogram = field(default_factory=lambda: Histogram(ITERATION_TOKENS_BOUNDS))


class LLMEngine:
    def __init__(self, config: EngineConfig | None = None, drafter_factory: DrafterFactory | None = None,
                 **overrides):
        """`drafter_factory`: builds the drafter once the model is loaded (engine/drafter.py; e.g. one that returns a
        proxy to a co-located Ray actor). Without one, the engine loads `config.drafter`, if set, through the
        installed drafter implementation. A drafter that cannot be loaded leaves `drafter_error` set and the engine
        serving without speculation."""
        config = (config or EngineConfig()).model_copy(update=overrides)
        self.config = config
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        path = resolve_model(config.model)
        hf_model, self.tokenizer = load_hf_model(path, self.dtype)
        self.decode = fast_decode(self.tokenizer)
        self.model_path = path
        self.model_name = config.model or "SmolLM2-135M-Instruct"
        hf_cfg = hf_model.config
        num_layers = hf_cfg.num_hidden_layers
        self.drafter_error: str | None = None  # why speculation is off although a drafter was asked for
        if drafter_factory is None and config.drafter and config.drafter != "none":
            try:
                drafter_factory = installed_drafter(resolve_drafter(config.drafter, hf_cfg))
            except (OSError, ValueError, LookupError) as exc:
                self.drafter_error = f"drafter {config.drafter!r} could not be loaded: {exc}"
                log.error("%s; serving without speculation", self.drafter_error)

        head_dim = getattr(hf_cfg, "head_dim", None) or hf_cfg.hidden_size // hf_cfg.num_attention_heads
        per_block = KVCache.bytes_per_block(num_layers, config.block_size, hf_cfg.num_key_value_heads, head_dim,
                                            self.dtype)
        if config.enable_prefix_caching:  # cached blocks keep their taps beside their K/V: budget for them
            tap_count = len(config.tap_layers) or (TAP_RESERVE_LAYERS if drafter_factory is not None else 0)
            per_block += config.block_size * tap_count * hf_cfg.hidden_size * torch.finfo(self.dtype).bits // 8
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
                               block_size=config.block_size, deterministic=config.deterministic)
        self.kv_cache = KVCache(num_layers, num_blocks, config.block_size, hf_cfg.num_key_value_heads, head_dim,
                                self.dtype, self.device, k_layout=self.model.ops.key_layout(self.dtype))
        del hf_model
        drafter = self._start_drafter(drafter_factory, num_blocks) if drafter_factory is not None else None
        tap_layers = list(drafter.tap_layers) if drafter is not None else list(config.tap_layers)
        for layer in tap_layers:
            if not 0 <= layer < num_layers:
                raise ValueError(f"tap layer {layer} out of range: the model has {num_layers} decoder layers")
        self.tap_layers = tuple(tap_layers)
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        # The taps of each cached block, kept with it so a sequence starting from a cached prefix gets them too.
        self.tap_cache = (torch.empty(num_blocks, config.block_size, len(self.tap_layers) * self.model.hidden_size,
                                      dtype=self.dtype, device=self.device)
                          if config.enable_prefix_caching and self.tap_layers else None)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens)
        self.runner = ModelRunner(self.model, self.kv_cache, self.tap_layers)
        self.eos_token_ids = _eos_ids(self.tokenizer, path)
        self.generator = torch.Generator(device=self.device).manual_seed(config.seed)
        self.requests: dict[str, Sequence] = {}
        self.counters = EngineCounters()
        self.load = LoadMonitor()
        self.speculator: Speculator | None = None
        if drafter is not None:
            self._init_speculation(drafter)
        log.info("engine ready: %s on %s/%s, %d KV blocks (%d tokens), max_model_len %d", self.model_name,
                 self.device, str(self.dtype).removeprefix("torch."), num_blocks, num_blocks * config.block_size,
                 max_len)

    def _start_drafter(self, factory: DrafterFactory, num_blocks: int) -> Drafter | None:
        cfg = self.config
        # Contexts hold at most the tokens the KV cache holds, plus one partial page per sequence.
        self.draft_context_tokens = num_blocks * cfg.block_size + cfg.max_num_seqs * 16
        target = DraftTarget(self.model.embed_tokens, self.model.lm_head_weight, self.dtype, self.device,
                             max_context_tokens=self.draft_context_tokens)
        try:
            return factory(target)
        except Exception as exc:  # keep serving without speculation, and say so
            self.drafter_error = f"drafter could not start: {exc}"
            log.error("%s; serving without speculation", self.drafter_error)
            return None

    def _init_speculation(self, service: Drafter) -> None:
        cfg = self.config
        try:
            mode = parse_speculation(cfg.speculation or DEFAULT_SPECULATION)
            cost = StepCostModel(Curve(*self._profile_forward()), Curve(*self._profile_draft(service)))
        except Exception as exc:  # keep serving without speculation, and say so
            self.drafter_error = f"drafter could not start: {exc}"
            log.error("%s; serving without speculation", self.drafter_error)
            return
        self.speculator = Speculator(service, mode, cost, cfg.max_num_batched_tokens, self.draft_context_tokens)
        log.info("speculation on (%s, gamma %d); SPS(B) %s", mode, service.gamma,
                 {b: round(v, 1) for b, v in cost.table().items()})

    def _scratch_seqs(self, n: int, context: int, q_len: int) -> list[ScheduledSeq]:
        """Throwaway sequences with `context` cached (garbage) tokens, for timing steps."""
        out = []
        for i in range(n):
            seq = Sequence(f"__profile{i}", [1] * (context + q_len), SamplingParams(), detokenizer=None)
            seq.num_computed_tokens = context
            if not self.block_manager.allocate(seq, context + q_len):
                break
            out.append(ScheduledSeq(seq, q_len))
        return out

    def _profile_forward(self, reps: int = 3) -> tuple[list[int], list[float]]:
        """The start-up sweep of SPS(B): time packed forwards of B decode/verify tokens."""
        cfg = self.config
        grid = [b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if b <= cfg.max_num_batched_tokens]
        seconds = []
        for b in grid:
            n = min(b, cfg.max_num_seqs)
            scratch = self._scratch_seqs(n, 64, max(1, b // n))
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                self.runner.execute(scratch)
                self._synchronize()
                times.append(time.perf_counter() - t0)
            for s in scratch:
                self.block_manager.free(s.seq)
            seconds.append(sorted(times)[len(times) // 2])
        return grid, seconds

    def _profile_draft(self, service: Drafter, reps: int = 3) -> tuple[list[int], list[float]]:
        width = len(self.tap_layers) * self.model.hidden_size
        grid = [n for n in (1, 4, 16, 64) if n <= self.config.max_num_seqs] or [1]
        seconds = []
        for n in grid:
            keys = [f"__profile{i}" for i in range(n)]
            taps = torch.zeros(64, width, dtype=self.dtype, device=self.device)
            service.step([ContextSync(k, 0, taps) for k in keys], [])
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                service.step([], [DraftWork(k, 1, 64) for k in keys])
                self._synchronize()
                times.append(time.perf_counter() - t0)
            service.release(keys)
            seconds.append(sorted(times)[len(times) // 2])
        return grid, seconds

    def _synchronize(self) -> None:
        """Wait for the device's queued work (a no-op on CPU, where every op has finished when it returns)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

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
        token_ids = self.encode(prompt)  # a bad prompt is a 400 even when the queue is full
        bad = [t for t in params.logit_bias or () if t >= self.model.vocab_size]
        if bad:
            raise ValueError(f"logit_bias token id {bad[0]} is outside the vocabulary [0, {self.model.vocab_size})")
        if len(self.scheduler.waiting) >= self.config.max_waiting:
            raise QueueFullError(f"the queue is full ({self.config.max_waiting} waiting requests); retry later")
        seq = Sequence(
            request_id=request_id,
            prompt_token_ids=token_ids,
            params=params,
            detokenizer=IncrementalDetokenizer(self.decode, token_ids, params.stop_strings),
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
        seq.num_computed_tokens = self.block_manager.truncate(seq, min(seq.num_computed_tokens, new_len - 1))
        if seq.taps is not None:
            seq.taps.truncate(seq.num_computed_tokens)
        # Re-derive the text from the kept tokens.
        seq.detokenizer = IncrementalDetokenizer(self.decode, seq.prompt_token_ids, seq.params.stop_strings)
        for t in seq.output_token_ids:
            seq.detokenizer.push(t)
        seq.text = seq.detokenizer.text
        seq.num_emitted_tokens = min(seq.num_emitted_tokens, seq.num_output_tokens)
        seq.num_emitted_chars = min(seq.num_emitted_chars, len(seq.text))

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def stats(self, service: bool = True) -> dict:
        """A snapshot of the engine's load and counters (plain numbers, for metrics and load signals).
        `service=False` skips asking the draft service (a Ray round trip when it is an actor)."""
        bm = self.block_manager
        out = {
            "num_running": len(self.scheduler.running),
            "num_waiting": len(self.scheduler.waiting),
            "max_num_seqs": self.config.max_num_seqs,
            "max_num_batched_tokens": self.config.max_num_batched_tokens,
            "kv_blocks_used": bm.num_used,
            "kv_blocks_total": bm.num_blocks,
            "kv_usage": bm.usage,
            **asdict(self.counters),
            "speculation": self.speculator is not None,
            "drafter_error": self.drafter_error,
            "load": self.load.signals(bm.usage),
        }
        if self.speculator is not None:
            spec = self.speculator
            out["spec"] = asdict(spec.counters)
            out["spec"]["last_verify_tokens"] = spec.last_verify_tokens
            out["spec"]["sps_table"] = spec.cost.table()
            if service:
                try:
                    out["spec"].update(spec.service.stats())
                except Exception as exc:  # a dead draft actor: report it, keep serving
                    out["spec"]["service_error"] = str(exc)
        return out

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    # ----- the step -----------------------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One engine step: schedule, draft, one packed forward (prefill chunks, decodes and verify segments
        together), accept, emit. Returns an output for every request that advanced."""
        if not self.scheduler.has_unfinished():
            return []
        t0 = time.perf_counter()
        sched = self.scheduler.schedule()
        self.counters.preemptions += len(sched.preempted)
        self.counters.prefix_cache_queries = self.scheduler.cache_queries
        self.counters.prefix_cache_hits = self.scheduler.cache_hits
        if not sched.scheduled:
            return []
        for seq in sched.cache_hits:
            self._restore_cached_taps(seq)
        load = StepLoad(running=len(self.scheduler.running), waiting=len(self.scheduler.waiting),
                        max_num_seqs=self.config.max_num_seqs, tokens=sched.num_tokens,
                        token_budget=self.config.max_num_batched_tokens,
                        decoding=sum(1 for s in sched.scheduled if s.samples),
                        kv_tokens=sum(s.seq.num_computed_tokens for s in sched.scheduled))
        now = time.monotonic()
        for s in sched.scheduled:
            if s.seq.first_scheduled_time is None:
                s.seq.first_scheduled_time = now
        if self.speculator is not None:
            self.speculator.prepare(sched, self.block_manager, self.max_model_len, load)
        self.load.observe(load)
        # On a GPU the forward only queues kernels: CUDA events time it, read once acceptance has synchronized.
        events = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if self.device.type == "cuda" else None
        t_fwd = time.perf_counter()
        if events:
            events[0].record()
        out = self.runner.execute(sched.scheduled)
        if events:
            events[1].record()
        forward_seconds = time.perf_counter() - t_fwd
        emitted = self._accept(out)  # order index -> emitted tokens, for the sequences that sample
        if events:
            events[1].synchronize()  # already done: acceptance read the forward's results
            forward_seconds = events[0].elapsed_time(events[1]) / 1e3
        if self.speculator is not None and load.base_tokens == load.decoding:
            # Decode and verify steps only, as the start-up sweep timed them. A prompt chunk is many queries of one
            # sequence, attending to each other; at one stream its steps taught the speed factor their pace, and the
            # 1-token point, seen every step, shrank to make up for it, leaving verify steps predicted far too dear.
            self.speculator.cost.forward.observe(sched.num_tokens, forward_seconds, load.kv_tokens)
        counted_before = self.counters.prompt_tokens + self.counters.generation_tokens
        touched = []
        for i, s in enumerate(out.order):
            seq = s.seq
            tokens = emitted.get(i, [])
            # K/V and taps stay valid for the known tokens and the accepted drafts; rejected drafts roll back.
            keep = s.num_new_tokens + max(0, len(tokens) - 1)
            if seq.taps is not None:
                seq.taps.write(seq.num_computed_tokens, out.taps[i][:keep])
            seq.num_computed_tokens += keep
            if seq.num_computed_tokens <= seq.num_prompt_tokens:
                self.counters.prompt_tokens += s.num_new_tokens
            if s.draft_tokens:
                self.block_manager.truncate(seq, seq.num_computed_tokens)  # never inside a cached block
            self._cache_full_blocks(seq, tokens[:-1])  # before a stop can free its blocks
            for token in tokens:
                if self._append_token(seq, token):
                    break  # a stop inside an accepted segment ends the sequence at exactly that token
            if seq.logprobs is not None:
                del seq.logprobs[seq.num_output_tokens:]
            if tokens:
                touched.append(seq)
        now = time.monotonic()
        for seq in touched:
            if seq.last_token_time is not None:
                self.counters.inter_token_latency_s.observe(now - seq.last_token_time)
            seq.last_token_time = now
        self.counters.iteration_tokens.observe(self.counters.prompt_tokens + self.counters.generation_tokens
                                               - counted_before)
        seconds = time.perf_counter() - t0
        if self.speculator is not None:
            self.speculator.observe_step(sum(map(len, emitted.values())), seconds, forward_seconds)
        self.counters.steps += 1
        self.counters.step_time_s += seconds
        return [self._output(seq) for seq in touched]

    def _restore_cached_taps(self, seq: Sequence) -> None:
        """A sequence admitted from the prefix cache: its taps for the cached tokens come from the blocks."""
        if seq.taps is not None:
            n = seq.num_computed_tokens
            blocks = torch.tensor(seq.block_table[:n // self.config.block_size], device=self.device)
            seq.taps.write(0, self.tap_cache[blocks].flatten(0, 1))

    def _cache_full_blocks(self, seq: Sequence, accepted: list[int]) -> None:
        bs = self.config.block_size
        for i, block in self.block_manager.cache_full_blocks(seq, accepted):
            if self.tap_cache is not None:
                self.tap_cache[block] = seq.taps.data[i * bs:(i + 1) * bs]

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (vLLM's reset_prefix_cache): later requests compute their prompts afresh."""
        self.block_manager.reset_cache()

    def _accept(self, out) -> dict[int, list[int]]:
        """Sample the plain rows and verify the drafted ones. Returns order index -> tokens to emit."""
        plain = [i for i in out.logit_rows if not out.order[i].draft_tokens]
        drafted = [i for i in out.logit_rows if out.order[i].draft_tokens]
        emitted: dict[int, list[int]] = {}
        rows_of = {}
        target_logits = self._penalised(out)
        reads, pending = [], None  # device results, read on the host at the step's one synchronization
        if plain:
            rows = [out.logit_rows[i][0] for i in plain]
            logits = target_logits if len(rows) == target_logits.shape[0] else target_logits[rows]
            batch = SamplingBatch.build([out.order[i].seq.params for i in plain],
                                        [out.order[i].seq.generator for i in plain], self.device)
            reads.append(sample(logits, batch, self.generator, self.model.ops.argmax))
        if drafted:
            rows = [r for i in drafted for r in range(out.logit_rows[i][0], sum(out.logit_rows[i]))]
            pending = self.speculator.verify([out.order[i] for i in drafted], target_logits[rows], self.generator,
                                             self.model.ops.argmax)
            reads.extend(pending.tensors)
        host = device_io.to_host(reads)
        if plain:
            for i, t in zip(plain, host.pop(0)):
                emitted[i] = [t]
                rows_of[i] = [out.logit_rows[i][0]]
        if pending is not None:
            for i, tokens in zip(drafted, pending.finish(host)):
                emitted[i] = tokens
                rows_of[i] = list(range(out.logit_rows[i][0], out.logit_rows[i][0] + len(tokens)))
        with_lp = [i for i in emitted if out.order[i].seq.params.logprobs is not None]
        if with_lp:
            self._record_logprobs(out.logits, [(out.order[i].seq, rows_of[i], emitted[i]) for i in with_lp])
        return emitted

    @staticmethod
    def _penalised(out) -> torch.Tensor:
        """The logits the target samples and verifies with: the model's, with each request's penalties applied
        (engine/penalties.py). A copy when any applies, so logprobs stay those of the model itself."""
        penalised = [i for i in out.logit_rows if has_penalties(out.order[i].seq.params)]
        if not penalised:
            return out.logits
        logits = out.logits.clone()
        for i in penalised:
            s = out.order[i]
            first, n = out.logit_rows[i]
            apply_penalties(logits[first:first + n], s.seq.params, s.seq.prompt_token_ids, s.seq.output_token_ids,
                            s.draft_tokens or [])
        return logits

    @staticmethod
    def _record_logprobs(logits: torch.Tensor, items: list[tuple[Sequence, list[int], list[int]]]) -> None:
        """Top-k log-probabilities of the raw model distribution for every emitted token (its logits row), plus
        the emitted token's own."""
        rows = [r for _, rs, _ in items for r in rs]
        toks = [t for _, _, ts in items for t in ts]
        k = max(seq.params.logprobs for seq, _, _ in items)
        lp = torch.log_softmax(logits[rows].float(), dim=-1)
        chosen = lp.gather(1, torch.tensor(toks, device=lp.device)[:, None])[:, 0].tolist()
        top_v, top_i = lp.topk(k, dim=-1) if k else (lp[:, :0], lp[:, :0].long())
        top_v, top_i = top_v.tolist(), top_i.tolist()
        j = 0
        for seq, rs, ts in items:
            n = seq.params.logprobs
            for t in ts:
                entry = dict(zip(top_i[j][:n], top_v[j][:n]))
                entry[t] = chosen[j]
                seq.logprobs.append(entry)
                j += 1

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
        if self.speculator is not None:
            self.speculator.finish([seq])
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
            logprobs=None if seq.logprobs is None else list(seq.logprobs),  # a snapshot: readers may be elsewhere
        )

    def _metrics(self, seq: Sequence) -> dict:
        m = {
            "num_prompt_tokens": seq.num_prompt_tokens,
            "num_output_tokens": seq.num_output_tokens,
            "num_preemptions": seq.num_preemptions,
            "num_cached_tokens": seq.num_cached_tokens,
        }
        if seq.first_token_time is not None:
            m["ttft_s"] = seq.first_token_time - seq.arrival_time
        if self.speculator is not None:
            m.update(Speculator.request_metrics(seq))
        if seq.finish_time is not None:
            m["e2e_s"] = seq.finish_time - seq.arrival_time
            if seq.first_token_time is not None and seq.num_output_tokens > 1:
                m["tpot_s"] = (seq.finish_time - seq.first_token_time) / (seq.num_output_tokens - 1)
            if seq.first_scheduled_time is not None:  # vLLM's phases: queued, prefill, decode (inference = both)
                m["queue_s"] = seq.first_scheduled_time - seq.arrival_time
                m["inference_s"] = seq.finish_time - seq.first_scheduled_time
                if seq.first_token_time is not None:
                    m["prefill_s"] = seq.first_token_time - seq.first_scheduled_time
                    m["decode_s"] = seq.finish_time - seq.first_token_time
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
