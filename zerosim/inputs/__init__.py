"""The input boundary: every file, document and value a user gives passes through here first.

- `files`: reading a named file (explicit UTF-8, regular files only, bounded size);
- `documents`: YAML and JSON parsing with limits (duplicate keys, nesting, aliases, numbers);
- `plausible`: the plausible range of every number and text, in one table;
- `tables`: CSV tables, a header and rows of as many fields (`predict`'s runs, `calibrate`'s
  measurements).
"""

from zerosim.inputs.documents import parse_json, parse_yaml
from zerosim.inputs.files import read_input_text, referenced_path
from zerosim.inputs.plausible import PLAUSIBLE, check_plausible, check_section

__all__ = [
    "PLAUSIBLE",
    "check_plausible",
    "check_section",
    "parse_json",
    "parse_yaml",
    "read_input_text",
    "referenced_path",
]
