"""Built-in models. Each entry cites the `config.json` it copies.

The Llama-2 entries and GPT-3 are written as `ModelSpec`s; the newer models as the fields of
their Hugging Face `config.json` that shape them (`HUB_CONFIGS`), read by
`spec_from_hf_fields` exactly as a user's own config.json is. A name is looked up as written
or as its Hub repository (`meta-llama/Llama-3.1-70B`), in any case (`catalog_model`).
"""

from __future__ import annotations

from typing import Any

from zerosim.models.hf import spec_from_hf_fields
from zerosim.models.spec import GPT_LAYOUT, ModelSpec

CATALOG: dict[str, ModelSpec] = {
    # meta-llama/Llama-2-7b-hf config.json
    "llama2-7b": ModelSpec(
        name="llama2-7b",
        family="llama",
        model_type="llama",
        hidden_size=4096,
        num_hidden_layers=32,
        intermediate_size=11008,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32000,
        max_position_embeddings=4096,
    ),
    # meta-llama/Llama-2-13b-hf config.json
    "llama2-13b": ModelSpec(
        name="llama2-13b",
        family="llama",
        model_type="llama",
        hidden_size=5120,
        num_hidden_layers=40,
        intermediate_size=13824,
        num_attention_heads=40,
        num_key_value_heads=40,
        vocab_size=32000,
        max_position_embeddings=4096,
    ),
    # meta-llama/Llama-2-70b-hf config.json (grouped-query attention, 8 KV heads)
    "llama2-70b": ModelSpec(
        name="llama2-70b",
        family="llama",
        model_type="llama",
        hidden_size=8192,
        num_hidden_layers=80,
        intermediate_size=28672,
        num_attention_heads=64,
        num_key_value_heads=8,
        vocab_size=32000,
        max_position_embeddings=4096,
    ),
    # GPT-3 175B as in Brown et al. 2020, Table 2.1 (d_model 12288, 96 layers, 96 heads,
    # d_ff = 4 d_model, context 2048), GPT-2 BPE vocabulary, tied input/output embeddings,
    # dropout 0.1 as in GPT-2's config.json.
    "gpt3-175b": ModelSpec(
        name="gpt3-175b",
        family="gpt",
        hidden_size=12288,
        num_hidden_layers=96,
        intermediate_size=4 * 12288,
        num_attention_heads=96,
        num_key_value_heads=96,
        vocab_size=50257,
        tie_word_embeddings=True,
        max_position_embeddings=2048,
        attention_dropout=0.1,
        hidden_dropout=0.1,
        **GPT_LAYOUT,
    ),
}


def _llama3(hidden: int, intermediate: int, layers: int, heads: int, positions: int
            ) -> dict[str, Any]:
    """A Llama 3 or 3.1 config.json's shaping fields: 8 KV heads, a 128,256-token vocabulary,
    untied embeddings."""
    return dict(model_type="llama", hidden_size=hidden, intermediate_size=intermediate,
                num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=8,
                vocab_size=128256, max_position_embeddings=positions, tie_word_embeddings=False)


def _qwen25(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, *,
            small: bool = False) -> dict[str, Any]:
    """A Qwen2.5 config.json's shaping fields (`model_type` qwen2: biases on Q, K and V;
    `use_sliding_window` false; from 7B a 152,064-token vocabulary and untied embeddings, the
    `small` models to 3B a 151,936-token one tied to the output layer, 32K positions)."""
    return dict(model_type="qwen2", hidden_size=hidden, intermediate_size=intermediate,
                num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv_heads, vocab_size=151936 if small else 152064,
                max_position_embeddings=32768 if small else 131072, use_sliding_window=False,
                tie_word_embeddings=small)


HUB_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    # Each: the Hub repository, then its config.json's fields that shape the model (rotary,
    # norm epsilon and token ids change nothing zerosim prices). The parameter counts they
    # build are the checkpoints' (tests/test_models.py).
    "llama3-8b": ("meta-llama/Meta-Llama-3-8B", _llama3(4096, 14336, 32, 32, 8192)),
    "llama3.1-8b": ("meta-llama/Llama-3.1-8B", _llama3(4096, 14336, 32, 32, 131072)),
    "llama3.1-70b": ("meta-llama/Llama-3.1-70B", _llama3(8192, 28672, 80, 64, 131072)),
    "llama3.1-405b": ("meta-llama/Llama-3.1-405B", _llama3(16384, 53248, 126, 128, 131072)),
    # v0.3: a 32,768-token vocabulary and no sliding window (v0.1's 4,096-token window is
    # one zerosim would replay as full causal attention, with a warning)
    "mistral-7b-v0.3": ("mistralai/Mistral-7B-v0.3", dict(
        model_type="mistral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=32768,
        max_position_embeddings=32768, sliding_window=None, tie_word_embeddings=False)),
    "qwen2.5-3b": ("Qwen/Qwen2.5-3B", _qwen25(2048, 11008, 36, 16, 2, small=True)),
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B", _qwen25(3584, 18944, 28, 28, 4)),
    "qwen2.5-14b": ("Qwen/Qwen2.5-14B", _qwen25(5120, 13824, 48, 40, 8)),
    "qwen2.5-32b": ("Qwen/Qwen2.5-32B", _qwen25(5120, 27648, 64, 40, 8)),
    "qwen2.5-72b": ("Qwen/Qwen2.5-72B", _qwen25(8192, 29568, 80, 64, 8)),
}

CATALOG.update({name: spec_from_hf_fields(fields, name=name, source=f"{hub} config.json")
                for name, (hub, fields) in HUB_CONFIGS.items()})

HUB_NAMES = {hub.lower(): name for name, (hub, _) in HUB_CONFIGS.items()}
"""Each Hub repository of `HUB_CONFIGS`, lower-cased, and its catalog name."""


def catalog_model(name: str) -> ModelSpec | None:
    """The catalog model named `name`, or whose Hub repository it is (any case); None if
    neither."""
    key = name.lower()
    return CATALOG.get(key) or CATALOG.get(HUB_NAMES.get(key, ""))


def catalog_names() -> list[str]:
    return sorted(CATALOG)
