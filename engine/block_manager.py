"""Fixed-size KV blocks: a free list, per-sequence block tables and, optionally, automatic prefix caching.

With caching, every full block whose tokens are all computed is content-addressed by a hash chain over the token
ids (its own tokens and its parent's hash), as vLLM does. A later sequence whose tokens start with the same blocks
takes them by reference instead of computing them. A block whose last user frees it stays in the cache, at the
tail of the free list, and is evicted (its hash forgotten) only when the free list hands it out again: least
recently freed first. A cached block is full and its tokens computed, so nobody writes into it: a sequence only
writes at positions past its computed tokens, and those lie in blocks that are not cached.
"""
from __future__ import annotations

from collections import OrderedDict

from engine.sequence import Sequence

ROOT_HASH = 0  # the parent hash of a sequence's first block


def block_hash(parent: int, tokens: tuple[int, ...]) -> int:
    """A full block's link in the hash chain: its parent's hash and its own token ids."""
    return hash((parent, tokens))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = False):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.free_blocks: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # eviction order
        self.ref_counts = [0] * num_blocks
        self.block_hash: dict[int, int] = {}  # cached block -> its hash
        self.cached: dict[int, int] = {}  # hash -> cached block
        self.block_tokens: dict[int, tuple[int, ...]] = {}  # cached block -> its tokens (a hash collision check)

    @property
    def num_free(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    @property
    def usage(self) -> float:
        return self.num_used / self.num_blocks

    @property
    def num_cached(self) -> int:
        return len(self.cached)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def missing_blocks(self, seq: Sequence, num_tokens: int) -> int:
        return max(0, self.blocks_for(num_tokens) - len(seq.block_table))

    def allocate(self, seq: Sequence, num_tokens: int) -> bool:
        """Grow `seq` to hold `num_tokens` tokens. All or nothing: False if the free list is too short."""
        need = self.missing_blocks(seq, num_tokens)
        if need > len(self.free_blocks):
            return False
        for _ in range(need):
            block, _ = self.free_blocks.popitem(last=False)
            self._evict(block)
            self.ref_counts[block] = 1
            seq.block_table.append(block)
        return True

    def truncate(self, seq: Sequence, num_tokens: int) -> int:
        """Keep the blocks holding the first `num_tokens` tokens; free the rest. Returns how many tokens' K/V stay
        valid: `num_tokens`, or fewer where the last kept block is a cached one that others share, which the
        sequence must not rewrite: it gives that block back and recomputes its tokens into a block of its own."""
        keep = self.blocks_for(num_tokens)
        while len(seq.block_table) > keep:
            self._release(seq.block_table.pop())
        if num_tokens % self.block_size and keep <= len(seq.block_hashes):  # the partial last block was full
            block = seq.block_table[-1]
            if self.ref_counts[block] > 1:
                self._release(seq.block_table.pop())
                num_tokens = (keep - 1) * self.block_size
            else:
                self._evict(block)  # ours alone: its content is about to change
            keep -= 1
        del seq.block_hashes[keep:]
        return num_tokens

    def free(self, seq: Sequence) -> None:
        self.truncate(seq, 0)

    def _release(self, block: int) -> None:
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.free_blocks[block] = None  # at the tail: evicted last

    def _evict(self, block: int) -> None:
        h = self.block_hash.pop(block, None)
        if h is not None:
            del self.cached[h]
            del self.block_tokens[block]

    # ----- prefix caching ---------------------------------------------------------------------------------------

    def _chain(self, token_ids: list[int], start_hash: int, first: int, count: int) -> list[int]:
        """Hashes of blocks first..first+count-1 of `token_ids`, chained from `start_hash` (block first-1's)."""
        out, h, bs = [], start_hash, self.block_size
        for i in range(first, first + count):
            h = block_hash(h, tuple(token_ids[i * bs:(i + 1) * bs]))
            out.append(h)
        return out

    def match_prefix(self, seq: Sequence) -> list[int]:
        """The cached blocks `seq` can start from: its longest run of leading full blocks found in the cache,
        leaving at least its last token to compute (the step must produce its next-token logits)."""
        if not self.enable_caching or seq.block_table:
            return []
        bs, hits, h = self.block_size, [], ROOT_HASH
        for i in range((seq.num_tokens - 1) // bs):
            tokens = tuple(seq.token_ids[i * bs:(i + 1) * bs])
            h = block_hash(h, tokens)
            block = self.cached.get(h)
            if block is None or self.block_tokens[block] != tokens:
                break
            hits.append(block)
        return hits

    def blocks_taken_from_free(self, hits: list[int]) -> int:
        """How many of the cached blocks `hits` are free (unreferenced), so taking them shrinks the free list."""
        return sum(1 for b in hits if self.ref_counts[b] == 0)

    def take_prefix(self, seq: Sequence, hits: list[int]) -> None:
        """Give `seq` (with no blocks yet) the cached blocks `hits` by reference: its first len(hits) blocks."""
        assert not seq.block_table
        for block in hits:
            if self.ref_counts[block] == 0:
                del self.free_blocks[block]
            self.ref_counts[block] += 1
            seq.block_table.append(block)
        seq.block_hashes = [self.block_hash[b] for b in hits]

    def cache_full_blocks(self, seq: Sequence, accepted: list[int] = ()) -> list[tuple[int, int]]:
        """Register the blocks of `seq` that became full of computed tokens; `accepted`: computed tokens not yet
        appended to its token ids (accepted drafts). Returns (block index in the sequence, block id) for each block
        newly cached, whose taps the caller keeps with it. A block whose content is already cached under another
        id stays private to `seq` (it is freed as usual)."""
        if not self.enable_caching:
            return []
        full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        done = len(seq.block_hashes)
        if full <= done:
            return []
        token_ids = seq.token_ids + list(accepted) if accepted else seq.token_ids
        hashes = self._chain(token_ids, seq.block_hashes[-1] if done else ROOT_HASH, done, full - done)
        new = []
        for i, h in enumerate(hashes, start=done):
            block = seq.block_table[i]
            seq.block_hashes.append(h)
            if h in self.cached or block in self.block_hash:
                continue
            self.cached[h] = block
            self.block_hash[block] = h
            self.block_tokens[block] = tuple(token_ids[i * self.block_size:(i + 1) * self.block_size])
            new.append((i, block))
        return new

    def reset_cache(self) -> None:
        """Forget every cached block (the blocks in use stay with their sequences)."""
        for block in list(self.block_hash):
            self._evict(block)
