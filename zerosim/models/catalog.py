"""Built-in models. Each entry cites the `config.json` it copies."""

from __future__ import annotations

from zerosim.models.spec import GPT_LAYOUT, ModelSpec

CATALOG: dict[str, ModelSpec] = {
    # meta-llama/Llama-2-7b-hf config.json
    "llama2-7b": ModelSpec(
        name="llama2-7b",
        family="llama",
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


def catalog_names() -> list[str]:
    return sorted(CATALOG)
