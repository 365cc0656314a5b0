"""Engine configuration (pydantic, so a Serve config YAML can carry it unchanged)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from engine.spec_mode import parse_speculation


class EngineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str | None = Field(None, description="HF folder, .gguf file, or None for the default SmolLM2-135M-Instruct")
    dtype: str = Field("auto", description="auto | float32 | bfloat16 | float16 | float64")
    device: str = Field("auto", description="auto | cpu | cuda | cuda:N")
    block_size: int = Field(16, ge=1, le=256)
    kv_cache_memory_gb: float | None = Field(
        None, gt=0, description="KV cache budget; default 2 GiB on CPU, gpu_memory_utilization of free memory on GPU"
    )
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1)
    max_num_seqs: int = Field(64, ge=1, description="most sequences running in one step")
    max_num_batched_tokens: int = Field(1024, ge=16, description="token budget of one packed forward")
    max_model_len: int | None = Field(None, ge=2, description="default: the model's, capped at 8192 and the cache")
    max_waiting: int = Field(4096, ge=0, description="requests queued for admission before add_request refuses")
    enable_prefix_caching: bool = Field(True, description="share the K/V (and taps) of full blocks of tokens "
                                        "already computed, as vLLM's automatic prefix caching")
    tap_layers: list[int] = Field(default_factory=list, description="decoder layers whose outputs are tapped")
    seed: int = 0
    deterministic: bool | None = Field(None, description="batch-invariant kernels: a greedy answer is the same "
                                       "bits whatever else is in the batch, and speculation never changes it in any "
                                       "dtype. None: on wherever the CPU kernels run it (see docs/design.md); True: "
                                       "an error elsewhere; False: off")
    # Speculative decoding (DSpark).
    drafter: str | None = Field(None, description="'default', a drafter folder, or None for no speculation")
    speculation: str | None = Field(None, description="off | fixed:K | threshold:C | adaptive, the last three "
                                    "optionally +lookup; None: adaptive+lookup with a drafter")

    @field_validator("speculation")
    @classmethod
    def _valid_mode(cls, value: str | None) -> str | None:
        if value is not None:
            parse_speculation(value)
        return value
