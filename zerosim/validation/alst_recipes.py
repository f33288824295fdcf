"""Arctic Long Sequence Training's recipes for Llama-3.1-8B on H100 nodes
(data/alst_recipes.yaml): each a configuration its authors ran at the sequence length it
names, and the overrides that turn the ALST scenario into it.

Pure: the data; `zerosim.validation.validate` simulates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zerosim.shipped import shipped_root
from zerosim.validation.reference import reference_data

DATA_FILE = "alst_recipes.yaml"
SEQUENCE_MULTIPLE = 256
"""ArcticTraining's collator pads a packed sample to a multiple of 256 tokens
(`div_length`): the recipe's max_length rounded down to it is the longest step it trains."""


@dataclass(frozen=True)
class Recipe:
    name: str
    max_length: int
    note: str
    overrides: Mapping[str, Any]

    @property
    def sequence_length(self) -> int:
        return self.max_length - self.max_length % SEQUENCE_MULTIPLE


@dataclass(frozen=True)
class Recipes:
    group: str
    source: str
    scenario: Path
    recipes: tuple[Recipe, ...]
    common: Mapping[str, Any]

    def overrides(self, recipe: Recipe) -> dict[str, Any]:
        """The scenario overrides that make `recipe` at its length."""
        return {**self.common, **recipe.overrides, "sequence_length": recipe.sequence_length}


def load_recipes() -> Recipes:
    data = reference_data(DATA_FILE)
    recipes = tuple(Recipe(r["name"], r["max_length"], r["note"], dict(r["overrides"]))
                    for r in data["recipes"])
    return Recipes(data["group"], data["source"], shipped_root() / data["scenario"], recipes,
                   dict(data["common"]))
