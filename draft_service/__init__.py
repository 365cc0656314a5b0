"""DSpark drafter (DeepSeek DSpark / DeepSpec-compatible) for dspark-serve."""

from .config import DSparkConfig
from .context import ContextPoolFull, DraftContextPool, DraftRequest
from .model import DraftProposal, DSparkDrafter

__all__ = [
    "ContextPoolFull",
    "DSparkConfig",
    "DSparkDrafter",
    "DraftContextPool",
    "DraftProposal",
    "DraftRequest",
]
