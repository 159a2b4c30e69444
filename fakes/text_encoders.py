"""Tiny text encoders and tokenizers of the transformers library, built offline.

A real diffusers pipeline declares its text encoders and tokenizers beside its DiT and VAE, and
its own `save_pretrained` writes them. These are the smallest real ones: transformers' own
classes with a few thousand parameters, and tokenizers built from a `tokenizers` vocabulary in
memory (no file, no download). They make a pipeline folder exactly as diffusers writes one,
whose encoders the loader under test loads (TE); `CLIPVisionModelWithProjection` is the image
encoder such pipelines declare. transformers is imported when something is built.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "BUILDERS",
    "SPECIAL",
    "VOCAB_SIZE",
    "WIDTH",
    "build",
    "clip_tokenizer",
    "word_tokenizer",
]

VOCAB_SIZE = 32
WIDTH = 32
"""Every encoder's hidden size: the width the tiny DiTs' text projections take."""
SPECIAL = ("<pad>", "</s>", "<unk>", "<s>")


def _transformers() -> Any:
    module = importlib.import_module("transformers")
    module.utils.logging.set_verbosity_error()
    return module


def _vocab() -> dict[str, int]:
    words = [*SPECIAL, *(f"w{i}" for i in range(VOCAB_SIZE - len(SPECIAL)))]
    return {word: i for i, word in enumerate(words)}


def word_tokenizer(class_name: str) -> Any:
    """A transformers tokenizer of class `class_name` over a word-level vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    backend = Tokenizer(models.WordLevel(_vocab(), unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    cls = getattr(_transformers(), class_name)
    return cls(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        bos_token="<s>",
    )


def clip_tokenizer() -> Any:
    """A `CLIPTokenizer` over a byte-pair vocabulary with CLIP's own start and end tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {**_vocab(), "<|startoftext|>": VOCAB_SIZE, "<|endoftext|>": VOCAB_SIZE + 1}
    backend = Tokenizer(
        models.BPE(vocab=vocab, merges=[], unk_token="<unk>", end_of_word_suffix="</w>")
    )
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return _transformers().CLIPTokenizer(
        tokenizer_object=backend,
        pad_token="<|endoftext|>",
        bos_token="<|startoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<unk>",
    )


def _t5(class_name: str) -> Any:
    t = _transformers()
    config_class = t.UMT5Config if class_name.startswith("UMT5") else t.T5Config
    config = config_class(
        vocab_size=VOCAB_SIZE,
        d_model=WIDTH,
        d_kv=8,
        d_ff=64,
        num_layers=1,
        num_heads=4,
        relative_attention_num_buckets=8,
    )
    return getattr(t, class_name)(config)


def _clip(class_name: str) -> Any:
    t = _transformers()
    config = t.CLIPTextConfig(
        vocab_size=VOCAB_SIZE + 2,
        hidden_size=WIDTH,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        max_position_embeddings=77,
        projection_dim=WIDTH,
        bos_token_id=VOCAB_SIZE,
        eos_token_id=VOCAB_SIZE + 1,
        pad_token_id=VOCAB_SIZE + 1,
    )
    return getattr(t, class_name)(config)


def _clip_vision() -> Any:
    t = _transformers()
    config = t.CLIPVisionConfig(
        hidden_size=WIDTH,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        image_size=8,
        patch_size=4,
        projection_dim=WIDTH,
    )
    return t.CLIPVisionModelWithProjection(config)


def _gemma2() -> Any:
    t = _transformers()
    config = t.Gemma2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=WIDTH,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=8,
    )
    return t.Gemma2Model(config)


_LANGUAGE_MODEL = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": WIDTH,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
}
"""The language model of the multimodal text encoders below, tiny (its own keys beside)."""


def _gemma3() -> Any:
    """LTX-2's text encoder class: Gemma 3 with its vision tower. transformers 5 saves it under
    its former layout (`language_model.model.*`) and renames on load."""
    t = _transformers()
    config = t.Gemma3Config(
        text_config={**_LANGUAGE_MODEL, "num_key_value_heads": 1, "head_dim": 8},
        vision_config={
            "hidden_size": WIDTH,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "image_size": 8,
            "patch_size": 4,
        },
        mm_tokens_per_image=4,
    )
    return t.Gemma3ForConditionalGeneration(config)


def _qwen2_5_vl() -> Any:
    """Qwen-Image's text encoder class: Qwen2.5-VL with its vision tower, also saved under its
    former layout (`model.*` for the language model's `model.language_model.*`)."""
    t = _transformers()
    config = t.Qwen2_5_VLConfig(
        text_config={
            **_LANGUAGE_MODEL,
            "num_key_value_heads": 2,
            "rope_scaling": {"type": "mrope", "mrope_section": [1, 1, 2]},
            "bos_token_id": 0,
            "eos_token_id": 1,
        },
        vision_config={
            "depth": 1,
            "hidden_size": WIDTH,
            "intermediate_size": 64,
            "num_heads": 4,
            "out_hidden_size": WIDTH,
            "patch_size": 2,
            "spatial_merge_size": 1,
            "temporal_patch_size": 1,
            "fullatt_block_indexes": [0],
            "window_size": 4,
        },
        bos_token_id=0,
        eos_token_id=1,
    )
    return t.Qwen2_5_VLForConditionalGeneration(config)


def _bert() -> Any:
    t = _transformers()
    config = t.BertConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=WIDTH,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
    )
    return t.BertModel(config)


BUILDERS: Mapping[str, Callable[[], Any]] = {
    "T5EncoderModel": lambda: _t5("T5EncoderModel"),
    "UMT5EncoderModel": lambda: _t5("UMT5EncoderModel"),
    "CLIPTextModel": lambda: _clip("CLIPTextModel"),
    "CLIPTextModelWithProjection": lambda: _clip("CLIPTextModelWithProjection"),
    "Gemma2Model": _gemma2,
    "BertModel": _bert,
    "Gemma3ForConditionalGeneration": _gemma3,
    "Qwen2_5_VLForConditionalGeneration": _qwen2_5_vl,
    "CLIPVisionModelWithProjection": _clip_vision,
    "T5Tokenizer": lambda: word_tokenizer("T5Tokenizer"),
    "GemmaTokenizer": lambda: word_tokenizer("GemmaTokenizer"),
    "Qwen2Tokenizer": lambda: word_tokenizer("Qwen2Tokenizer"),
    "BertTokenizer": lambda: word_tokenizer("BertTokenizer"),
    "CLIPTokenizer": clip_tokenizer,
}
"""Every text part a tiny pipeline uses (and an image encoder), by its transformers class name."""


def build(class_name: str) -> Any:
    """A tiny instance of transformers' `class_name` (one of BUILDERS)."""
    return BUILDERS[class_name]()
