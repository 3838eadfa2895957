"""What autoshard knows, as data: the op sharding rules, the device presets, and the JSON Schemas
that device files and plan files are checked against (specs/README.md says how to add an op or a
device).

The repository keeps these files in its top-level ``specs/`` folder; the build maps that folder to
this package, ``autoshard.specs`` (``package-dir`` in pyproject.toml), so an installed autoshard
and an editable checkout read the very same files.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Callable

import fastjsonschema

FOLDER = Path(__file__).parent
OPS = FOLDER / "ops.toml"
"""The sharding rules (read by ``autoshard/sharding/rules.py``)."""
DEVICES = FOLDER / "devices.toml"
"""The device presets (read by ``autoshard/cost/devices.py``), every figure with its source."""
PLAN_SCHEMA = "plan.schema.json"
"""What a plan file holds: a plan, or a pipelined plan of several."""
DEVICE_SCHEMA = "device.schema.json"
"""What a device preset file holds: one table per device."""


@functools.cache
def _validator(schema: str) -> Callable[[Any], Any]:
    """The compiled validator of one schema file of this folder (JSON Schema draft-07, compiled to
    Python by fastjsonschema: checking a plan takes less time than writing it as JSON)."""
    return fastjsonschema.compile(json.loads((FOLDER / schema).read_text()), use_default=False)


def problem(document: Any, schema: str) -> str | None:
    """What is wrong with ``document`` under ``schema`` (a file name in this folder), naming the
    field as one would write it in Python, e.g. ``nodes[1].in_specs is missing``; None when it
    conforms. The caller turns it into its own one-line error, with the fix that fits its file.
    """
    try:
        _validator(schema)(document)
    except fastjsonschema.JsonSchemaValueException as error:
        where = error.name.removeprefix("data").lstrip(".")  # fastjsonschema calls the document "data"

        def field(key: str) -> str:
            return f"{where}.{key}" if where else key

        if error.rule == "required":
            return f"{field(next(key for key in error.rule_definition if key not in error.value))} is missing"
        if error.rule == "additionalProperties" and isinstance(error.value, dict):
            known = error.definition.get("properties", {})
            if unknown := [key for key in error.value if key not in known]:
                return f"{field(unknown[0])} is not a field of this file"
        return (where or "the document") + error.message.removeprefix(error.name)
    return None
