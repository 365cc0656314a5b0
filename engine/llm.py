"""vLLM-style offline API: LLM(model=...).generate(prompts, params)."""
from __future__ import annotations

import itertools

from tqdm import tqdm

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine, RequestOutput
from engine.sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str | None = None, dtype: str = "auto", device: str = "auto", **engine_args):
        self.engine = LLMEngine(EngineConfig(model=model, dtype=dtype, device=device, **engine_args))
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def generate(
        self,
        prompts: str | list[str] | list[list[int]],
        params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Run all prompts to completion under continuous batching; one output per prompt, in order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = params or SamplingParams()
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(params_list)} SamplingParams for {len(prompts)} prompts")
        ids = [f"gen-{next(self._ids)}" for _ in prompts]
        for i, (rid, prompt, p) in enumerate(zip(ids, prompts, params_list)):
            try:
                self.engine.add_request(rid, prompt, p)
            except Exception:
                for added in ids[:i]:
                    self.engine.abort_request(added)
                raise
        results: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(prompts), disable=not use_tqdm, desc="generate")
        while len(results) < len(ids):
            for out in self.engine.step():
                if out.finished:
                    results[out.request_id] = out
                    bar.update(1)
        bar.close()
        return [results[rid] for rid in ids]

    def chat(self, messages: list[dict] | list[list[dict]], params: SamplingParams | None = None,
             use_tqdm: bool = False) -> list[RequestOutput]:
        """Generate replies to one conversation or a list of them, through the model's chat template."""
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [self.apply_chat_template(c) for c in convs]
        return self.generate(prompts, params, use_tqdm=use_tqdm)

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        return list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                       return_dict=True)["input_ids"])
