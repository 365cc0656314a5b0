"""A request's state inside the engine."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from engine.detokenizer import IncrementalDetokenizer
from engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class TapBuffer:
    """The tapped hidden states of every computed token, grown geometrically so appends stay cheap."""

    def __init__(self, width: int, dtype: torch.dtype, device: torch.device, capacity: int = 256):
        self.data = torch.empty(capacity, width, dtype=dtype, device=device)
        self.length = 0

    def write(self, start: int, rows: torch.Tensor) -> None:
        end = start + rows.shape[0]
        if end > self.data.shape[0]:
            grown = torch.empty(max(end, 2 * self.data.shape[0]), self.data.shape[1],
                                dtype=self.data.dtype, device=self.data.device)
            grown[: self.length] = self.data[: self.length]
            self.data = grown
        self.data[start:end] = rows
        self.length = end

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)

    def view(self) -> torch.Tensor:
        return self.data[: self.length]


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    detokenizer: IncrementalDetokenizer
    arrival_time: float = field(default_factory=time.monotonic)
    token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # prefix-cache hash chain of its full computed blocks
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache when it was last admitted
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None
    generator: torch.Generator | None = None
    taps: TapBuffer | None = None
    logprobs: list[dict[int, float]] | None = None  # per output token, when params.logprobs is set
    # Streaming bookkeeping.
    num_emitted_tokens: int = 0
    text: str = ""
    num_emitted_chars: int = 0
    first_scheduled_time: float | None = None  # when a step first ran any of its tokens
    first_token_time: float | None = None
    last_token_time: float | None = None  # when a step last gave it tokens
    finish_time: float | None = None
    num_preemptions: int = 0
    # Speculative decoding state, owned by the speculator.
    spec: object | None = None

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
