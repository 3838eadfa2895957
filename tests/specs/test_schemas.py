"""specs/ holds what autoshard knows as data, and its schemas say exactly what the code reads and writes:
their enumerations are the code's, every plan the writer makes conforms (``Plan.save`` refuses one
that does not), plans written before the optional fields existed still conform, and no copy of the
rules or presets is left inside autoshard/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoshard import specs
from autoshard.cost.communication import COST_MODELS, make_cost_model
from autoshard.cost.devices import DTYPE_CLASSES, KERNEL_CLASSES
from autoshard.problem.baselines.megatron import megatron_choice
from autoshard.problem.build import MODES, BuildOptions, build_problem
from autoshard.problem.plan import Plan
from autoshard.problem.readback import make_plan
from autoshard.sharding.mesh import parse_mesh
from autoshard.sharding.reshard import COLLECTIVES, SLICE
from autoshard.sharding.rules import load_rules
from tests.graphs import mlp_graph

ROOT = Path(__file__).resolve().parents[2]
PLAN = json.loads((ROOT / "specs" / specs.PLAN_SCHEMA).read_text())["definitions"]
DEVICE = json.loads((ROOT / "specs" / specs.DEVICE_SCHEMA).read_text())["definitions"]["preset"]["properties"]
OPTIONAL = ("lower_bound", "proved_optimal", "param_specs", "frontend", "signature", "recompute", "recompute_kept",
            "capacity_factor", "expert_parallel")


def _plan(mode: str) -> Plan:
    mesh = parse_mesh("2x2")
    mp = build_problem(mlp_graph(8, 64, 64, 256), mesh, make_cost_model("alpha-beta", mesh), BuildOptions(mode=mode))
    return make_plan(mp, megatron_choice(mp), model="mlp")


def test_the_package_reads_the_top_level_folder_and_autoshard_keeps_no_copy() -> None:
    assert specs.FOLDER.resolve() == ROOT / "specs"  # editable checkout: the same files, not a copy
    assert load_rules.__wrapped__.__defaults__ == (specs.OPS,) and load_rules()["linear"].options["signature"]
    copies = [p for p in (ROOT / "autoshard").rglob("*") if p.suffix == ".toml" or p.name.endswith(".schema.json")]
    assert not copies, copies
    assert {p.name for p in (ROOT / "specs").iterdir() if p.is_file()} >= {
        "ops.toml", "devices.toml", "plan.schema.json", "device.schema.json", "README.md"}


def test_the_schemas_enumerate_what_the_code_knows() -> None:
    assert tuple(PLAN["plan"]["properties"]["mode"]["enum"]) == MODES
    assert tuple(PLAN["plan"]["properties"]["cost_model"]["enum"]) == COST_MODELS
    assert set(PLAN["step"]["properties"]["kind"]["enum"]) == {SLICE, *COLLECTIVES}
    assert tuple(DEVICE["peak_flops"]["required"]) == DTYPE_CLASSES
    assert tuple(DEVICE["achieved"]["required"]) == KERNEL_CLASSES
    assert set(DEVICE["by_flops"]["properties"]) == set(KERNEL_CLASSES)


@pytest.mark.parametrize("mode", MODES)
def test_a_written_plan_conforms_and_reads_back(tmp_path: Path, mode: str) -> None:
    plan = _plan(mode)
    plan.save(tmp_path / "plan.json")
    data = json.loads((tmp_path / "plan.json").read_text())
    assert specs.problem(data, specs.PLAN_SCHEMA) is None
    assert set(data) == set(PLAN["plan"]["properties"])  # the schema names every field the writer writes
    assert Plan.load(tmp_path / "plan.json").to_json() == data
    for key in OPTIONAL:  # a plan file from before these fields still loads
        data.pop(key)
    assert specs.problem(data, specs.PLAN_SCHEMA) is None and Plan.from_json(data).model == "mlp"


def test_save_refuses_a_plan_the_schema_rejects_and_writes_nothing(tmp_path: Path) -> None:
    plan = _plan("training")
    plan.mode = "serving"
    with pytest.raises(ValueError, match=r"breaks specs/plan\.schema\.json \(mode must be one of"):
        plan.save(tmp_path / "plan.json")
    assert not (tmp_path / "plan.json").exists()


def test_the_readme_worked_op_example_is_the_shipped_rule_and_its_test() -> None:
    readme = (ROOT / "specs" / "README.md").read_text()
    rule = readme.split("```toml\n")[1].split("```")[0]
    assert rule in (ROOT / "specs" / "ops.toml").read_text()
    test_line = readme.split("```python\n")[1].split("```")[0].strip()
    assert test_line in (ROOT / "tests" / "sharding" / "test_rules_numeric.py").read_text()
