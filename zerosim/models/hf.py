"""Models given as Hugging Face `config.json` fields, inline or from a file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zerosim.errors import ScenarioError, clip
from zerosim.inputs import check_plausible, parse_json, read_input_text
from zerosim.models.spec import ModelSpec

LLAMA_TYPES = {"llama", "mistral", "qwen2", "gemma", "internlm2", "yi"}
GPT_TYPES = {"gpt2", "gpt_neox", "gptj", "gpt_bigcode", "opt", "bloom", "falcon", "gpt3"}

# Older GPT-style configs name the same fields differently.
ALIASES = {
    "n_embd": "hidden_size",
    "n_layer": "num_hidden_layers",
    "n_head": "num_attention_heads",
    "n_inner": "intermediate_size",
    "n_positions": "max_position_embeddings",
    "attn_pdrop": "attention_dropout",
    "resid_pdrop": "hidden_dropout",
}
REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
MAX_NAME_CHARS = 256
"""A config's `_name_or_path` is a label: longer ones are cut."""
INT_FIELDS = ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
              "num_key_value_heads", "vocab_size", "max_position_embeddings")


def _family(fields: dict[str, Any], source: str, key_path: str) -> str:
    if "family" in fields:
        family = fields["family"]
        if family not in ("llama", "gpt"):
            raise ScenarioError(source, f"{key_path}.family", "'llama' or 'gpt'", family)
        return family
    model_type = fields.get("model_type")
    if isinstance(model_type, str) and model_type in LLAMA_TYPES:
        return "llama"
    if isinstance(model_type, str) and model_type in GPT_TYPES:
        return "gpt"
    raise ScenarioError(
        source, f"{key_path}.family",
        "'family: llama|gpt', or a model_type zerosim knows "
        f"({', '.join(sorted(LLAMA_TYPES | GPT_TYPES))})",
        model_type,
    )


def _positive_int(fields: dict[str, Any], key: str, source: str, key_path: str) -> int:
    value = fields[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ScenarioError(source, f"{key_path}.{key}", "a positive integer", value)
    check_plausible(f"model.{key}", value, source=source, key_path=f"{key_path}.{key}")
    return value


def spec_from_hf_fields(fields: dict[str, Any], *, name: str, source: str = "<inline>",
                        key_path: str = "model") -> ModelSpec:
    """Build a ModelSpec from `config.json`-style fields; unknown HF fields are ignored."""
    fields = {ALIASES.get(k, k): v for k, v in fields.items()}
    for key in REQUIRED:
        if key not in fields:
            raise ScenarioError(source, f"{key_path}.{key}", "a positive integer", "nothing")
    family = _family(fields, source, key_path)
    h = _positive_int(fields, "hidden_size", source, key_path)
    fields.setdefault("intermediate_size", 4 * h)
    fields.setdefault("num_key_value_heads", fields["num_attention_heads"])
    fields.setdefault("max_position_embeddings", 4096)
    values = {key: _positive_int(fields, key, source, key_path) for key in INT_FIELDS}
    if h % values["num_attention_heads"]:
        raise ScenarioError(source, f"{key_path}.num_attention_heads",
                            f"a divisor of hidden_size={h}", values["num_attention_heads"])
    if values["num_attention_heads"] % values["num_key_value_heads"]:
        raise ScenarioError(source, f"{key_path}.num_key_value_heads",
                            f"a divisor of num_attention_heads={values['num_attention_heads']}",
                            values["num_key_value_heads"])
    tie = fields.get("tie_word_embeddings", family == "gpt")
    if not isinstance(tie, bool):
        raise ScenarioError(source, f"{key_path}.tie_word_embeddings", "true or false", tie)
    dropouts = {}
    for key in ("attention_dropout", "hidden_dropout"):
        value = fields.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
            raise ScenarioError(source, f"{key_path}.{key}", "a number in [0, 1)", value)
        dropouts[key] = float(value)
    return ModelSpec(name=name, family=family, tie_word_embeddings=tie, **values, **dropouts)


def spec_from_hf_file(path: Path, *, source: str, key_path: str) -> ModelSpec:
    text = read_input_text(path, referenced_from=source, key_path=key_path,
                           what="config.json file")
    fields = parse_json(text, str(path))
    if not isinstance(fields, dict):
        raise ScenarioError(str(path), "<root>", "a JSON object", type(fields).__name__)
    name = fields.get("_name_or_path") or path.parent.name or path.stem
    return spec_from_hf_fields(fields, name=clip(str(name), MAX_NAME_CHARS), source=str(path),
                               key_path="<root>")
