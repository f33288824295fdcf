"""Transformer descriptions and their per-module costs (pure: no SimPy, no hardware)."""

from zerosim.models.breakdown import (
    Module,
    Workload,
    build_modules,
    largest_layer_params,
    parameter_modules,
    total_params,
)
from zerosim.models.catalog import CATALOG, catalog_names
from zerosim.models.hf import ModelFieldWarning, fields_of, spec_from_hf_fields, spec_from_hf_file
from zerosim.models.spec import ModelSpec, MoESpec

__all__ = [
    "CATALOG",
    "MoESpec",
    "ModelFieldWarning",
    "ModelSpec",
    "Module",
    "Workload",
    "build_modules",
    "catalog_names",
    "fields_of",
    "largest_layer_params",
    "parameter_modules",
    "spec_from_hf_fields",
    "spec_from_hf_file",
    "total_params",
]
