"""Fixed-size KV blocks: a free list and per-sequence block tables."""
from __future__ import annotations

from collections import deque

from engine.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_blocks: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    @property
    def usage(self) -> float:
        return self.num_used / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def missing_blocks(self, seq: Sequence, num_tokens: int) -> int:
        return max(0, self.blocks_for(num_tokens) - len(seq.block_table))

    def allocate(self, seq: Sequence, num_tokens: int) -> bool:
        """Grow `seq` to hold `num_tokens` tokens. All or nothing: False if the free list is too short."""
        need = self.missing_blocks(seq, num_tokens)
        if need > len(self.free_blocks):
            return False
        seq.block_table.extend(self.free_blocks.popleft() for _ in range(need))
        return True

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Keep the blocks holding the first `num_tokens` tokens; free the rest."""
        keep = self.blocks_for(num_tokens)
        while len(seq.block_table) > keep:
            self.free_blocks.append(seq.block_table.pop())

    def free(self, seq: Sequence) -> None:
        self.truncate(seq, 0)
