"""DSpark drafter config, read and written in DeepSpec's config.json layout.

DeepSpec builds the drafter config by deep-copying the *target's* HF Qwen3Config
and adding DSpark fields (deepspec/modeling/dspark/qwen3/config.py), then saves it
with HF `save_pretrained`. So config.json is an ordinary Qwen3 config
(model_type "qwen3", architectures ["Qwen3DSparkModel"]) plus:
block_size, target_layer_ids, num_target_layers, mask_token_id, num_anchors,
enable_confidence_head, [confidence_head_with_markov], markov_rank, [markov_head_type].
Keys we do not model are kept in `extra` and written back unchanged.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from typing import Any

MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")


@dataclass
class DSparkConfig:
    # Backbone (Qwen3 field names; DeepSpec copies them from the target).
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768
    attention_bias: bool = False
    hidden_act: str = "silu"
    initializer_range: float = 0.02
    # DSpark fields.
    block_size: int = 7  # gamma: block = [anchor, mask x (block_size-1)] -> block_size drafts
    target_layer_ids: list[int] = field(default_factory=list)  # -1 = embedding output
    num_target_layers: int | None = None
    mask_token_id: int = 0
    num_anchors: int = 512  # training only
    markov_rank: int = 0  # 0 = no sequential head (plain parallel drafter)
    markov_head_type: str | None = None  # vanilla | gated | rnn
    enable_confidence_head: bool = False
    confidence_head_with_markov: bool = False
    # Our extension (absent from DeepSpec): truncated draft vocabulary size.
    # The index tensor itself is stored in the checkpoint as `draft_vocab`.
    draft_vocab_size: int | None = None
    # Our extension: copy hints. [min_n, max_n]: block position k >= 1 reads, instead of the mask token, what prompt
    # lookup (engine/ngram.py, n-grams of min_n..max_n tokens) proposes for the token before it, where it matches;
    # None: mask tokens only, as DeepSpec. No weights are added.
    copy_hint_ngram: list[int] | None = None
    # Everything else from config.json (bos/eos ids, dtype, transformers_version, ...).
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        self.target_layer_ids = [int(i) for i in self.target_layer_ids]
        ids = self.target_layer_ids
        if not ids or any(b <= a for a, b in zip(ids, ids[1:])) or ids[0] < -1:
            raise ValueError(f"target_layer_ids must be non-empty, strictly increasing, >= -1: {ids}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.markov_rank < 0:
            raise ValueError("markov_rank must be >= 0")
        if self.markov_rank > 0:
            self.markov_head_type = str(self.markov_head_type or "").lower()
            if self.markov_head_type not in MARKOV_HEAD_TYPES:
                raise ValueError(f"markov_head_type must be one of {MARKOV_HEAD_TYPES} when markov_rank > 0")
        if not self.enable_confidence_head:
            self.confidence_head_with_markov = False
        if self.confidence_head_with_markov and self.markov_rank == 0:
            raise ValueError("confidence_head_with_markov needs markov_rank > 0")
        if self.hidden_act != "silu":
            raise ValueError(f"only silu MLPs are supported, got {self.hidden_act!r}")
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        if self.copy_hint_ngram is not None:
            self.copy_hint_ngram = [int(n) for n in self.copy_hint_ngram]
            if len(self.copy_hint_ngram) != 2 or not 1 <= self.copy_hint_ngram[0] <= self.copy_hint_ngram[1]:
                raise ValueError(f"copy_hint_ngram must be [min_n, max_n] with 1 <= min_n <= max_n: "
                                 f"{self.copy_hint_ngram}")

    # -- derived -------------------------------------------------------------
    @property
    def num_taps(self) -> int:
        return len(self.target_layer_ids)

    @property
    def out_vocab_size(self) -> int:
        """Rows of lm_head / markov_w2 (the draft vocabulary)."""
        return self.draft_vocab_size or self.vocab_size

    # -- json ----------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DSparkConfig":
        d = dict(d)
        arch = d.get("architectures") or []
        if arch and not any("DSpark" in a for a in arch):
            raise ValueError(f"not a DSpark drafter config: architectures={arch}")
        # transformers 5 writes rope as rope_parameters={rope_theta, rope_type}; 4.x wrote rope_theta.
        rope = d.pop("rope_parameters", None) or d.pop("rope_scaling", None) or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"only default rope is supported, got rope_type={rope_type!r}")
        if "rope_theta" in rope:
            d["rope_theta"] = rope["rope_theta"]
        layer_types = d.pop("layer_types", None)
        if layer_types and any(t != "full_attention" for t in layer_types):
            raise ValueError(f"only full_attention draft layers are supported: {layer_types}")
        known = {f.name for f in fields(cls)} - {"extra"}
        kwargs = {k: d.pop(k) for k in list(d) if k in known}
        for k in ("architectures", "model_type", "tie_word_embeddings", "use_sliding_window",
                  "sliding_window", "max_window_layers", "attention_dropout"):
            d.pop(k, None)  # fixed values, rewritten by to_dict
        return cls(**kwargs, extra=d)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = dict(self.extra)
        d.update(
            architectures=["Qwen3DSparkModel"],
            model_type="qwen3",
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            rms_norm_eps=self.rms_norm_eps,
            rope_parameters={"rope_theta": self.rope_theta, "rope_type": "default"},
            max_position_embeddings=self.max_position_embeddings,
            attention_bias=self.attention_bias,
            attention_dropout=0.0,
            hidden_act=self.hidden_act,
            initializer_range=self.initializer_range,
            layer_types=["full_attention"] * self.num_hidden_layers,
            use_sliding_window=False,
            sliding_window=None,
            tie_word_embeddings=False,
            block_size=self.block_size,
            target_layer_ids=list(self.target_layer_ids),
            mask_token_id=self.mask_token_id,
            num_anchors=self.num_anchors,
            enable_confidence_head=self.enable_confidence_head,
            markov_rank=self.markov_rank,
        )
        if self.num_target_layers is not None:
            d["num_target_layers"] = self.num_target_layers
        # DeepSpec only writes these two when they are meaningful.
        if self.enable_confidence_head:
            d["confidence_head_with_markov"] = self.confidence_head_with_markov
        if self.markov_rank > 0:
            d["markov_head_type"] = self.markov_head_type
        if self.draft_vocab_size:
            d["draft_vocab_size"] = self.draft_vocab_size
        if self.copy_hint_ngram is not None:
            d["copy_hint_ngram"] = list(self.copy_hint_ngram)
        return dict(sorted(d.items()))

    @classmethod
    def from_json(cls, path: str) -> "DSparkConfig":
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))

    def to_json(self, path: str) -> None:
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=2)
            f.write("\n")
