"""Prompt lookup: draft by copying what followed the latest earlier occurrence of the text's last n tokens.

The DSpark drafter rarely copies: where the next tokens repeat earlier text verbatim, lookup's acceptance length is
several times the drafter's (bench/drafter_report.py). So the engine drafts by lookup wherever an n-gram of at least
`min_n` tokens matches, and with the drafter elsewhere.
"""
from __future__ import annotations


class NgramIndex:
    """The latest earlier occurrence of every n-gram (min_n <= n <= max_n) of one sequence's growing token list,
    indexed incrementally: a lookup costs O(max_n) whatever the length. Tokens are only ever appended (rejected
    drafts never enter a sequence's token list), so the index never needs to roll back."""

    def __init__(self, min_n: int = 2, max_n: int = 3):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self.next_pos: dict[tuple[int, ...], int] = {}  # n-gram -> the position just after its latest occurrence
        self.indexed = 0  # n-grams ending before this position are in next_pos

    def propose(self, tokens: list[int], gamma: int) -> tuple[list[int], int]:
        """`gamma` tokens that followed the latest earlier occurrence of the longest matching suffix n-gram, and
        that n (([], 0) if none matches). Where the copy runs into the text's end, the text is read as repeating
        itself (a loop of period end - occurrence), as it will if the copy goes on."""
        end = len(tokens) - 1  # the suffix n-gram ends here; only n-grams ending before it may match it
        for e in range(self.indexed, end):
            for n in range(self.min_n, min(self.max_n, e + 1) + 1):
                self.next_pos[tuple(tokens[e - n + 1: e + 1])] = e + 1
        self.indexed = max(self.indexed, end)
        for n in range(min(self.max_n, len(tokens)), self.min_n - 1, -1):
            p = self.next_pos.get(tuple(tokens[-n:]))
            if p is not None:
                draft = tokens[p: p + gamma]
                period = len(tokens) - p
                while len(draft) < gamma:
                    draft.append(draft[len(draft) - period])
                return draft, n
        return [], 0


def lookup_table(tokens: list[int], gamma: int, min_n: int = 2, max_n: int = 3, start: int = 0) -> list[list[int]]:
    """What `NgramIndex.propose` answers for every prefix tokens[:p + 1], p = start .. len(tokens) - 1 (an empty
    list where nothing matches): the copy hints a drafter was trained with, computed as the engine computes them."""
    index = NgramIndex(min_n, max_n)
    return [index.propose(tokens[: p + 1], gamma)[0] for p in range(start, len(tokens))]
