"""A zerosim scenario for one run of ds_offload_probe.py: its model config, workload and ds_config
as the run recorded them, on the hardware profile you name.

    python3 ds_offload_scenario.py h200_ds_offload_2026-12-04.jsonl tinyllama_opt \
        --hardware h200-vm > tinyllama_opt.yaml
    zerosim run tinyllama_opt.yaml        # then compare its phases with the record's

The probe times the engine's forward, backward and step; zerosim's printed iteration adds the
HF Trainer's work between them (the stack's micro_batch_ms and step_ms), which the probe's
loop does not do: compare the phases. Needs PyYAML only.
"""

from __future__ import annotations

import argparse
import json
import sys

import yaml


def find_record(path: str, run: str) -> dict:
    """The last record of `run` in a ds_offload_probe.py JSONL file."""
    with open(path) as lines:
        found = [record for record in map(json.loads, lines) if record["run"] == run]
    if not found:
        raise SystemExit(f"{path}: no record of run {run!r}")
    return found[-1]


def scenario_for(record: dict, hardware: str) -> dict:
    """The scenario that replays `record` on `hardware` (transformers' SDPA, which the probe
    uses, runs its flash kernel there: no mask, grouped K/V passed as they are)."""
    deepspeed = dict(record["ds_config"])
    if not record.get("offload_optimizer", True) and "optimizer" not in deepspeed:
        # the probe hands DeepSpeed a client torch.optim.AdamW; this key makes DeepSpeed
        # build the same one (engine.py _configure_basic_optimizer)
        deepspeed["optimizer"] = {"type": "AdamW", "params": {"torch_adam": True}}
    return {
        "name": f"{hardware}-{record['run'].replace('_', '-')}",
        "model": {"model_type": "llama", **record["model_config"]},
        "sequence_length": record["seq"],
        "activation_checkpointing": False,
        "attention": "flash",
        "hardware": hardware,
        "data_parallel": 1,
        "deepspeed": deepspeed,
        "runtime": {"deepspeed_version": record["versions"]["deepspeed"],
                    "framework": "hf-transformers"},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", help="a ds_offload_probe.py JSONL file")
    parser.add_argument("run", help="the run's name (its records' `run` field)")
    parser.add_argument("--hardware", required=True, help="a zerosim hardware profile")
    args = parser.parse_args()
    scenario = scenario_for(find_record(args.records, args.run), args.hardware)
    yaml.safe_dump(scenario, sys.stdout, sort_keys=False, default_flow_style=None, width=100)
    return 0


if __name__ == "__main__":
    sys.exit(main())
