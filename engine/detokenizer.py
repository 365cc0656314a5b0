"""Incremental detokenization with stop strings.

Only a short window of tokens is decoded per new token (the prefix/read offsets of TGI and vLLM), and text is
released only once it no longer ends in an incomplete UTF-8 sequence. While stop strings are set, the last
`max(len(stop)) - 1` characters are held back, so streamed text never shows the start of a stop string.
"""
from __future__ import annotations

import re

PROMPT_CONTEXT_TOKENS = 6  # prompt tokens decoded with the output, so leading spaces come out right


def fast_decode(tokenizer):
    """`decode(ids)` with special tokens skipped. A fast tokenizer's Rust decoder is called directly where that is
    what transformers' decode would return (no space clean-up): its Python wrapper costs most of a call's time, and
    this runs twice per token of every sequence, every step."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return lambda ids: backend.decode(ids, skip_special_tokens=True)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


class IncrementalDetokenizer:
    def __init__(self, decode, prompt_token_ids: list[int], stop: list[str]):
        self.decode = decode  # fast_decode(tokenizer)
        self.ids = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""
        # One alternation finds the leftmost stop string in a single scan, even with a thousand of them.
        self.stop_re = re.compile("|".join(re.escape(s) for s in stop)) if stop else None
        self.hold_back = max((len(s) for s in stop), default=1) - 1

    def push(self, token_id: int) -> str | None:
        """Add one output token; return the stop string it completed (text is then cut before it), else None."""
        self.ids.append(token_id)
        prefix = self.decode(self.ids[self.prefix_offset: self.read_offset])
        full = self.decode(self.ids[self.prefix_offset:])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return None
        delta = full[len(prefix):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        search_from = max(0, len(self.text) - self.hold_back)
        self.text += delta
        if self.stop_re is None:
            return None
        match = self.stop_re.search(self.text, search_from)
        if match is None:
            return None
        self.text = self.text[: match.start()]
        return match.group()

    def releasable(self, finished: bool) -> int:
        """How many characters of `text` may be streamed now."""
        return len(self.text) if finished else max(0, len(self.text) - self.hold_back)
