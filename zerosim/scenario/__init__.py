"""Scenario format: YAML + ds_config + HF config loading, validation and defaults."""

from zerosim.scenario.deepspeed import DeepSpeedConfig, OffloadSettings
from zerosim.scenario.loader import (
    AutoDefaultWarning,
    LegacyKeyWarning,
    Runtime,
    Scenario,
    UnmodelledKeysWarning,
    check_override_path,
    load_scenario,
    parse_overrides,
    scenario_from_dict,
)

__all__ = [
    "AutoDefaultWarning",
    "DeepSpeedConfig",
    "LegacyKeyWarning",
    "OffloadSettings",
    "Runtime",
    "Scenario",
    "UnmodelledKeysWarning",
    "check_override_path",
    "load_scenario",
    "parse_overrides",
    "scenario_from_dict",
]
