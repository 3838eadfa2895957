"""The compact plan table folds a repeated layer's blocks into one row per op and reshard."""

from __future__ import annotations

from autoshard.cli.report import Row, fold_layer_rows


def _block(layer: int, op_cost: int, gather_cost: int, ins: str = "SRRxRR") -> list[Row]:
    module = f"model.layers.{layer}.mlp.up_proj"
    return [Row(f"linear_{layer}", ins, "SRR", op_cost, True, False, module, "linear"),
            Row(f"|-{module}.weight", "RS", "RR", gather_cost, True, True, f"{module}.weight", "")]


def test_blocks_that_differ_only_in_layer_and_cost_fold_into_one_row_with_the_cost_range() -> None:
    rows = [r for layer, cost in enumerate([3, 2, 3, 3]) for r in _block(layer, cost, 5)]
    cells = fold_layer_rows(rows, str)
    assert cells == [("linear in model.layers.{0..3}.mlp.up_proj", "SRRxRR", "SRR", "4 x 2-3"),
                     ("|-model.layers.{0..3}.mlp.up_proj.weight", "RS", "RR", "4 x 5")]


def test_blocks_with_other_layouts_stay_apart_and_fewer_than_three_are_listed_one_by_one() -> None:
    rows = [r for layer in range(3) for r in _block(layer, 1, 1)] + _block(3, 1, 1, ins="RRRxRS")
    cells = fold_layer_rows(rows, str)
    assert cells[0] == ("linear in model.layers.{0..2}.mlp.up_proj", "SRRxRR", "SRR", "3 x 1")
    assert cells[2:] == [("linear_3", "RRRxRS", "SRR", "1"), ("|-model.layers.3.mlp.up_proj.weight", "RS", "RR", "1")]


def test_a_cost_range_names_its_unit_once() -> None:
    rows = [r for layer, cost in enumerate([3, 2, 3]) for r in _block(layer, cost, 5)]
    assert fold_layer_rows(rows, lambda t: f"{t}.5 ms")[0][3] == "3 x 2.5-3.5 ms"
    assert fold_layer_rows(rows, lambda t: f"{t}0 us" if t < 3 else "1 ms")[0][3] == "3 x 20 us-1 ms"
