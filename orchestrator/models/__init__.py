"""Model forge: local Hugging Face-format models (tokenizer + weights) with no hub access."""

from orchestrator.models.forge import (
    FORGE_VERSION,
    PRESETS,
    cache_root,
    cached_model,
    corpus_split,
    default_model,
    make_model,
)

__all__ = [
    "FORGE_VERSION",
    "PRESETS",
    "cache_root",
    "cached_model",
    "corpus_split",
    "default_model",
    "make_model",
]
