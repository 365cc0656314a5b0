"""Speculation modes: off | fixed:K | threshold:C | adaptive."""
from __future__ import annotations

from dataclasses import dataclass

MODES = ("off", "fixed", "threshold", "adaptive")


@dataclass(frozen=True)
class SpecMode:
    kind: str  # one of MODES
    k: int = 0  # fixed:K
    threshold: float = 0.0  # threshold:C

    def __str__(self) -> str:
        if self.kind == "fixed":
            return f"fixed:{self.k}"
        if self.kind == "threshold":
            return f"threshold:{self.threshold:g}"
        return self.kind


def parse_speculation(text: str) -> SpecMode:
    if not isinstance(text, str):
        raise ValueError(f"speculation must be a string, got {type(text).__name__}")
    kind, _, arg = text.strip().lower().partition(":")
    if kind in ("off", "adaptive") and not arg:
        return SpecMode(kind)
    if kind == "fixed" and arg.isdigit():
        return SpecMode("fixed", k=int(arg))
    if kind == "threshold":
        try:
            c = float(arg)
        except ValueError:
            c = -1.0
        if 0.0 <= c <= 1.0:
            return SpecMode("threshold", threshold=c)
    raise ValueError(f"invalid speculation {text!r}: expected off, fixed:K (K >= 0), threshold:C (0 <= C <= 1) or adaptive")
