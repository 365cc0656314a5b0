"""What the engine needs of a drafter, and how it gets one.

The engine talks to its drafter with one call per step (`Drafter.step`): bring some sequences' draft contexts up to
date (`ContextSync`) and propose a block for others (`DraftWork`); a `DraftStep` comes back. Any object with that
surface will do: draft_service's DraftService in the engine's own process, or its DraftServiceProxy to a Ray actor.

The engine builds its drafter once its model is loaded, by calling a `DrafterFactory` with what a drafter may share
of the target (`DraftTarget`). Without one, `EngineConfig.drafter` names a drafter folder, loaded by the
implementation installed under the `dspark.drafters` entry point (draft_service's, see pyproject.toml): so the engine
never imports the packages built on top of it.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Protocol

import torch

from engine.penalties import DraftPenalties

ENTRY_POINT_GROUP = "dspark.drafters"
DEFAULT_IMPLEMENTATION = "dspark"


@dataclass
class ContextSync:
    key: str
    keep: int  # truncate the context to this many tokens first
    taps: torch.Tensor | None = None  # [n, n_taps * d] taps of the next n positions, appended after `keep`


@dataclass
class DraftWork:
    key: str
    anchor_token: int
    anchor_pos: int  # the context must hold exactly the positions before it
    temperature: float = 0.0
    seed: int | None = None  # seeds this sequence's draft sampling on first use
    # Copy hints, for a drafter that asks for them (Drafter.copy_hint_ngram): prompt lookup's proposal for the tokens
    # at anchor_pos + 1, ... from the sequence so far ([] or None where no n-gram matches).
    hint: list[int] | None = None
    # The request's penalties (engine/penalties.py), for the drafter to apply to its own logits; None: it has none.
    penalties: DraftPenalties | None = None


@dataclass
class DraftStep:
    tokens: list[list[int]]  # per work item, gamma target-vocabulary ids
    confidences: list[list[float]]  # per work item, calibrated c_1..c_gamma
    probs: torch.Tensor | None  # [n_sampled, gamma, V_draft] p_d of the sampled work items, in order
    sampled: list[int]  # which work items those rows belong to
    draft_vocab: torch.Tensor | None  # draft index -> target id (None: the full vocabulary)
    seconds: float = 0.0  # time spent in the service
    append_seconds: float = 0.0  # of which bringing the contexts up to date (the syncs' appends)


class Drafter(Protocol):
    """Exactly what the engine calls. Sequences are named by the engine's request ids; a drafter creates a context
    on a key's first sync and frees it on `release`. `step` raises when it lost a context the engine expects (e.g. a
    restarted actor): the engine then decodes plainly for a while and rebuilds every context from its taps."""

    @property
    def gamma(self) -> int:
        """Draft tokens proposed per sequence per step."""

    @property
    def tap_layers(self) -> list[int]:
        """The target's decoder layers whose outputs the drafter reads (the engine taps them)."""

    @property
    def copy_hint_ngram(self) -> tuple[int, int] | None:
        """(min_n, max_n): the drafter reads prompt lookup's proposal by n-grams of these sizes (engine/ngram.py)
        in its block, so the engine fills `DraftWork.hint`; None: it reads no hints (none are computed). A drafter
        without this property reads none."""

    def step(self, syncs: list[ContextSync], work: list[DraftWork]) -> DraftStep | None:
        """Apply the syncs, then propose a block per work item (None when there is no work)."""

    def release(self, keys: list[str]) -> None:
        """Free these sequences' contexts."""

    def stats(self) -> dict:
        """Plain numbers for the engine's stats (e.g. live_contexts)."""


@dataclass
class DraftTarget:
    """What a drafter may take from the engine's target: tensors it shares rather than copies, and where it runs."""

    embed: torch.Tensor  # the target's input embedding [vocab, hidden]
    lm_head: torch.Tensor  # the target's lm_head weight (the embedding itself when tied)
    dtype: torch.dtype
    device: torch.device
    max_context_tokens: int  # the context tokens of all sequences at once: the KV cache's, plus a page per sequence


DrafterFactory = Callable[[DraftTarget], Drafter]


def installed_drafter(path: str | os.PathLike, name: str = DEFAULT_IMPLEMENTATION) -> DrafterFactory:
    """The factory of the drafter in folder `path`, by the implementation installed as entry point `name` of group
    `dspark.drafters`: a function (path, DraftTarget) -> Drafter."""
    found = entry_points(group=ENTRY_POINT_GROUP, name=name)
    if not found:
        raise LookupError(f"no drafter implementation {name!r} is installed (entry point group {ENTRY_POINT_GROUP!r}; "
                          "`pip install -e .` registers draft_service's)")
    return functools.partial(found[name].load(), path)
