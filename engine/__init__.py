"""dspark-serve engine: continuous batching with paged KV, hidden taps and DSpark speculation."""
from engine.config import EngineConfig
from engine.llm import LLM
from engine.llm_engine import LLMEngine, QueueFullError, RequestOutput
from engine.sampling_params import SamplingParams

__all__ = ["LLM", "LLMEngine", "EngineConfig", "SamplingParams", "RequestOutput", "QueueFullError"]
