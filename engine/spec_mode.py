"""Speculation modes: off | fixed:K | threshold:C | adaptive, each but off optionally with `+lookup`: prompt lookup
drafts wherever an n-gram of the text so far matches, and the DSpark drafter elsewhere (engine/ngram.py)."""
from __future__ import annotations

import functools
from dataclasses import dataclass

MODES = ("off", "fixed", "threshold", "adaptive")
# The engine's mode with a drafter when none is configured: the spec bench's winner (README, "Results").
DEFAULT_SPECULATION = "adaptive+lookup"


@dataclass(frozen=True)
class SpecMode:
    kind: str  # one of MODES
    k: int = 0  # fixed:K
    threshold: float = 0.0  # threshold:C
    lookup: bool = False  # +lookup

    def __str__(self) -> str:
        suffix = "+lookup" if self.lookup else ""
        if self.kind == "fixed":
            return f"fixed:{self.k}{suffix}"
        if self.kind == "threshold":
            return f"threshold:{self.threshold:g}{suffix}"
        return self.kind + suffix


def parse_speculation(text: str) -> SpecMode:
    if not isinstance(text, str):
        raise ValueError(f"speculation must be a string, got {type(text).__name__}")
    return _parse(text)


@functools.lru_cache(maxsize=256)  # read per sequence per step (SpecMode is frozen: sharing it is safe)
def _parse(text: str) -> SpecMode:
    base, plus, extra = text.strip().lower().partition("+")
    lookup = plus and extra == "lookup"
    kind, _, arg = base.partition(":")
    if not plus or (lookup and kind != "off"):
        if kind in ("off", "adaptive") and not arg:
            return SpecMode(kind, lookup=bool(lookup))
        if kind == "fixed" and arg.isdigit():
            return SpecMode("fixed", k=int(arg), lookup=bool(lookup))
        if kind == "threshold":
            try:
                c = float(arg)
            except ValueError:
                c = -1.0
            if 0.0 <= c <= 1.0:
                return SpecMode("threshold", threshold=c, lookup=bool(lookup))
    raise ValueError(f"invalid speculation {text!r}: expected off, fixed:K (K >= 0), threshold:C (0 <= C <= 1) or "
                     "adaptive, the last three optionally with +lookup")
