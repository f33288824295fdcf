"""Built-in models. Each entry cites the `config.json` it copies.

The Llama-2 entries and GPT-3 are written as `ModelSpec`s; the newer models as the fields of
their Hugging Face `config.json` that shape them (`HUB_CONFIGS`), read by
`spec_from_hf_fields` exactly as a user's own config.json is. A name is looked up as written
or as one of its Hub repositories (`meta-llama/Llama-3.1-70B`, or the instruction-tuned
`meta-llama/Llama-3.1-70B-Instruct` of the same shape), in any case (`catalog_model`); a name
that is neither gets the nearest ones to offer (`nearest_models`).
"""

from __future__ import annotations

import re
from difflib import get_close_matches
from typing import Any

from zerosim.errors import ScenarioError
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


def _qwen3(hidden: int, intermediate: int, layers: int, heads: int, *, tied: bool
           ) -> dict[str, Any]:
    """A dense Qwen3 config.json's shaping fields (`model_type` qwen3: Q and K normed per head,
    no biases): 8 KV heads of 128, a 151,936-token vocabulary, 40,960 positions; the models to
    4B tie the output layer to the embeddings."""
    return dict(model_type="qwen3", hidden_size=hidden, intermediate_size=intermediate,
                num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=8,
                head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                tie_word_embeddings=tied)


def _repositories(base: str, *tuned: str) -> tuple[str, ...]:
    """A model's Hub repository and its siblings named by a suffix (the instruction-tuned
    `-Instruct`, Qwen3's pre-trained `-Base`), which share its config.json's shape."""
    return (base, *(base + suffix for suffix in tuned))


HUB_CONFIGS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    # Each: the Hub repositories (the first the one whose config.json is copied, the others of
    # the same shape), then its config.json's fields that shape the model (rotary, norm
    # epsilon and token ids change nothing zerosim prices). The parameter counts they build
    # are the checkpoints' (tests/test_models.py).
    "llama3-8b": (_repositories("meta-llama/Meta-Llama-3-8B", "-Instruct"),
                  _llama3(4096, 14336, 32, 32, 8192)),
    "llama3-70b": (_repositories("meta-llama/Meta-Llama-3-70B", "-Instruct"),
                   _llama3(8192, 28672, 80, 64, 8192)),
    "llama3.1-8b": (_repositories("meta-llama/Llama-3.1-8B", "-Instruct")
                    + _repositories("meta-llama/Meta-Llama-3.1-8B", "-Instruct"),
                    _llama3(4096, 14336, 32, 32, 131072)),
    "llama3.1-70b": (_repositories("meta-llama/Llama-3.1-70B", "-Instruct")
                     + _repositories("meta-llama/Meta-Llama-3.1-70B", "-Instruct"),
                     _llama3(8192, 28672, 80, 64, 131072)),
    "llama3.1-405b": (_repositories("meta-llama/Llama-3.1-405B", "-Instruct")
                      + _repositories("meta-llama/Meta-Llama-3.1-405B", "-Instruct"),
                      _llama3(16384, 53248, 126, 128, 131072)),
    # 3.2's small models: head_dim 64 and the output layer tied to the embeddings
    "llama3.2-1b": (_repositories("meta-llama/Llama-3.2-1B", "-Instruct"),
                    {**_llama3(2048, 8192, 16, 32, 131072), "head_dim": 64,
                     "tie_word_embeddings": True}),
    "llama3.2-3b": (_repositories("meta-llama/Llama-3.2-3B", "-Instruct"),
                    {**_llama3(3072, 8192, 28, 24, 131072), "tie_word_embeddings": True}),
    # 3.3 shipped as an instruction-tuned 70B only, 3.1-70B's shape
    "llama3.3-70b": (("meta-llama/Llama-3.3-70B-Instruct",),
                     _llama3(8192, 28672, 80, 64, 131072)),
    # v0.3: a 32,768-token vocabulary and no sliding window (v0.1's 4,096-token window is
    # one zerosim would replay as full causal attention, with a warning)
    "mistral-7b-v0.3": (("mistralai/Mistral-7B-v0.3", "mistralai/Mistral-7B-Instruct-v0.3"), dict(
        model_type="mistral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=32768,
        max_position_embeddings=32768, sliding_window=None, tie_word_embeddings=False)),
    # 8 experts of 14,336, 2 routed a token; no sliding window (v0.1's config says null)
    "mixtral-8x7b": (("mistralai/Mixtral-8x7B-v0.1", "mistralai/Mixtral-8x7B-Instruct-v0.1"), dict(
        model_type="mixtral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, num_local_experts=8,
        num_experts_per_tok=2, vocab_size=32000, max_position_embeddings=32768,
        sliding_window=None, tie_word_embeddings=False)),
    # heads of 256, a 256,000-token vocabulary tied to the output layer (gemma's default)
    "gemma-7b": (_repositories("google/gemma-7b", "-it"), dict(
        model_type="gemma", hidden_size=3072, intermediate_size=24576, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=16, head_dim=256, vocab_size=256000,
        max_position_embeddings=8192)),
    "qwen2-7b": (_repositories("Qwen/Qwen2-7B", "-Instruct"), dict(
        model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
        max_position_embeddings=131072, use_sliding_window=False, tie_word_embeddings=False)),
    "qwen2.5-0.5b": (_repositories("Qwen/Qwen2.5-0.5B", "-Instruct"),
                     _qwen25(896, 4864, 24, 14, 2, small=True)),
    "qwen2.5-1.5b": (_repositories("Qwen/Qwen2.5-1.5B", "-Instruct"),
                     _qwen25(1536, 8960, 28, 12, 2, small=True)),
    "qwen2.5-3b": (_repositories("Qwen/Qwen2.5-3B", "-Instruct"),
                   _qwen25(2048, 11008, 36, 16, 2, small=True)),
    "qwen2.5-7b": (_repositories("Qwen/Qwen2.5-7B", "-Instruct"), _qwen25(3584, 18944, 28, 28, 4)),
    "qwen2.5-14b": (_repositories("Qwen/Qwen2.5-14B", "-Instruct"),
                    _qwen25(5120, 13824, 48, 40, 8)),
    "qwen2.5-32b": (_repositories("Qwen/Qwen2.5-32B", "-Instruct"),
                    _qwen25(5120, 27648, 64, 40, 8)),
    "qwen2.5-72b": (_repositories("Qwen/Qwen2.5-72B", "-Instruct"),
                    _qwen25(8192, 29568, 80, 64, 8)),
    # Qwen3's repositories hold the post-trained models, `-Base` the pre-trained ones
    "qwen3-0.6b": (_repositories("Qwen/Qwen3-0.6B", "-Base"),
                   _qwen3(1024, 3072, 28, 16, tied=True)),
    "qwen3-1.7b": (_repositories("Qwen/Qwen3-1.7B", "-Base"),
                   _qwen3(2048, 6144, 28, 16, tied=True)),
    "qwen3-4b": (_repositories("Qwen/Qwen3-4B", "-Base"), _qwen3(2560, 9728, 36, 32, tied=True)),
    "qwen3-8b": (_repositories("Qwen/Qwen3-8B", "-Base"), _qwen3(4096, 12288, 36, 32, tied=False)),
    "qwen3-14b": (_repositories("Qwen/Qwen3-14B", "-Base"),
                  _qwen3(5120, 17408, 40, 40, tied=False)),
    "qwen3-32b": (("Qwen/Qwen3-32B",), _qwen3(5120, 25600, 64, 64, tied=False)),
    # 128 experts of 768, 8 routed a token, in every layer; 4 KV heads
    "qwen3-30b-a3b": (_repositories("Qwen/Qwen3-30B-A3B", "-Base"), {
        **_qwen3(2048, 6144, 48, 32, tied=False), "model_type": "qwen3_moe",
        "num_key_value_heads": 4, "moe_intermediate_size": 768, "num_experts": 128,
        "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": []}),
    "tinyllama-1.1b": (("TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T",
                        "TinyLlama/TinyLlama-1.1B-Chat-v1.0"), dict(
        model_type="llama", hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
        num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
        max_position_embeddings=2048, tie_word_embeddings=False)),
}

CATALOG.update({name: spec_from_hf_fields(fields, name=name, source=f"{hubs[0]} config.json")
                for name, (hubs, fields) in HUB_CONFIGS.items()})

HUB_REPOSITORIES: dict[str, tuple[str, ...]] = {
    "llama2-7b": ("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-7b-chat-hf",
                    "meta-llama/Llama-2-7b"),
    "llama2-13b": ("meta-llama/Llama-2-13b-hf", "meta-llama/Llama-2-13b-chat-hf",
                     "meta-llama/Llama-2-13b"),
    "llama2-70b": ("meta-llama/Llama-2-70b-hf", "meta-llama/Llama-2-70b-chat-hf",
                     "meta-llama/Llama-2-70b"),
    **{name: hubs for name, (hubs, _) in HUB_CONFIGS.items()},
}
"""Each catalog model's Hub repositories: the one its shape is copied from first, then the
others of the same shape."""

HUB_NAMES = {hub.lower(): name for name, hubs in HUB_REPOSITORIES.items() for hub in hubs}
"""Each Hub repository, lower-cased, and its catalog name."""


def catalog_model(name: str) -> ModelSpec | None:
    """The catalog model named `name`, or whose Hub repository it is (any case); None if
    neither."""
    key = name.lower()
    return CATALOG.get(key) or CATALOG.get(HUB_NAMES.get(key, ""))


def catalog_names() -> list[str]:
    """The catalog's names, sizes in numeric order (`llama2-7b` before `llama2-13b`)."""
    return sorted(CATALOG, key=lambda name: [int(part) if part.isdigit() else part
                                             for part in re.split(r"(\d+)", name)])


def require_catalog_model(name: Any, *, source: str | None, key_path: str,
                          alternatives: str = "") -> ModelSpec:
    """The catalog model `name` gives (`catalog_model`), or a ScenarioError whose expected
    text offers the nearest names first, then the whole catalog, then `alternatives` (the
    other forms the key takes)."""
    spec = catalog_model(name) if isinstance(name, str) else None
    if spec is not None:
        return spec
    nearest = nearest_models(name) if isinstance(name, str) else []
    offer = f"did you mean {' or '.join(map(repr, nearest))}? " if nearest else ""
    raise ScenarioError(source, key_path,
                        f"a catalog model or its Hub repository ({offer}the catalog: "
                        f"{', '.join(catalog_names())}){alternatives}", name)


TUNED_SUFFIX = re.compile(r"(-(instruct|chat|it|base|hf))+$")
"""What a tuned or renamed checkpoint appends to its base model's name."""


def nearest_models(name: str, count: int = 3) -> list[str]:
    """The catalog names and Hub repositories closest to a `name` that is neither: first the
    one it names without a tuned suffix (`Qwen/Qwen3-8B-Instruct`, which the Hub does not
    have, offers `Qwen/Qwen3-8B`) and those it begins (`qwen3-30b`, `qwen3-30b-a3b`), then the
    most alike (a version left out, a size mistyped): what an error offers instead."""
    known = {**{key: key for key in CATALOG},
             **{hub.lower(): hub for hubs in HUB_REPOSITORIES.values() for hub in hubs}}
    key = name.lower()
    first = [k for k in sorted(known)
             if k == TUNED_SUFFIX.sub("", key) or (len(key) >= 4 and k.startswith(key))]
    alike = get_close_matches(key, sorted(known), n=count, cutoff=0.75)
    return [known[k] for k in dict.fromkeys([*first, *alike])][:count]
