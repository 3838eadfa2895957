"""Render a :class:`NativeLayout` as torchtitan-style Python source.

The source defines ``build_mesh``, ``parallelize(model, mesh)`` (a short list of named steps, as
torchtitan's ``parallelize_llama``: ``apply_tp``, ``apply_sp``, ``apply_ac``, ``apply_fsdp``, each present only
when the plan needs it), ``loss_context()`` and ``loss_share(loss)``. Choices PyTorch has no API
for are comment lines at the top (``NativeLayout.notes``).
"""

from __future__ import annotations

import textwrap

from autoshard.lower.blocks import FULL, NONE, SELECTIVE
from autoshard.lower.roles import DP, SP, TP, NativeLayout
from autoshard.lower.sequence import HEADS, HEADS_IMPORTS, block_loop, sequence_lines
from autoshard.lower.tp_styles import style_arguments
from autoshard.problem.plan import Plan

SELECTIVE_POLICY = '''


_SAVED_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
}


def selective_context():
    """torchtitan's selective op policy: save fused attention and every other mm, recompute the rest."""
    counts = defaultdict(int)

    def policy(ctx, op, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if op == torch.ops.aten.mm.default:
            counts[mode] += 1
        keep = op in _SAVED_OPS and not (op == torch.ops.aten.mm.default and counts[mode] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)'''


def _tuple(values: tuple, indent: int) -> str:
    """``values`` as a Python tuple, wrapped to lines of at most 110 characters."""
    text = repr(tuple(values))
    if indent + len(text) <= 110:
        return text
    return "\n".join(textwrap.wrap(text, 110 - indent, subsequent_indent=" " * (indent + 1), break_on_hyphens=False,
                                   break_long_words=False))


def mesh_names(roles: list[str]) -> list[str]:
    """Each axis's mesh dim name: its role, numbered when several axes share it."""
    counts = {role: roles.count(role) for role in roles}
    seen: dict[str, int] = {}
    names = []
    for role in roles:
        seen[role] = seen.get(role, 0) + 1
        names.append(role if counts[role] == 1 else f"{role}{seen[role] - 1}")
    return names


def _sub_mesh(names: list[str], axes: list[int]) -> str:
    return f'mesh["{names[axes[0]]}"]' if len(axes) == 1 else f"mesh[({', '.join(repr(names[a]) for a in axes)})]"


def _tp_lines(layout: NativeLayout, names: list[str]) -> list[str]:
    lines = ["def apply_tp(model, mesh):",
             '    """Tensor parallelism: the modules the plan shards, each with its style."""',
             f'    parallelize_module(model, mesh["{names[layout.roles.index(TP)]}"], {{']
    lines += [f'        "{path}": {style.kind}({style_arguments(style, path)}),'
              for path, style in layout.styles.items()]
    lines.append("    })")
    if any(layout.sliced_inputs):
        comma = "," if len(layout.sliced_inputs) == 1 else ""
        whole = ", ".join("Replicate()" for _ in layout.sliced_inputs) + comma
        wanted = ", ".join("Shard(0)" if cut else "Replicate()" for cut in layout.sliced_inputs) + comma
        lines += ["    # the inputs the plan reads as each rank's batch slice (the labels of a batch-cut loss)",
                  f'    parallelize_module(model, mesh["{names[layout.roles.index(TP)]}"], PrepareModuleInput(',
                  f"        input_layouts=({whole}), desired_input_layouts=({wanted}), use_local_output=True))"]
    return lines


def _ac_lines(layout: NativeLayout) -> list[str]:
    units = layout.units
    lines = ["def apply_ac(model):",
             '    """Recompute the blocks the plan recomputes, in backward (checkpoint_wrapper)."""',
             f'    blocks = model.get_submodule("{units.container}")']
    for mode, extra in ((FULL, ""), (SELECTIVE, "context_fn=selective_context, ")):
        chosen = tuple(int(u.path.rpartition(".")[2]) for u in units.blocks if u.recompute == mode)
        if chosen:
            lines += [f"    for i in {_tuple(chosen, 13)}:",
                      "        blocks.register_module(str(i), checkpoint_wrapper(blocks[i], "
                      f"{extra}preserve_rng_state=False))"]
    return lines


def _fsdp_lines(layout: NativeLayout, names: list[str]) -> list[str]:
    units, seq = layout.units, layout.sequence
    shared_tp = TP in layout.roles and layout.roles.index(TP) in layout.fsdp_axes
    ignored = ", ignored_params=_ignored(module, styled)" if shared_tp else ""
    lines = ["def apply_fsdp(model, mesh):",
             '    """fully_shard per block and on the root; reshard_after_forward where the plan gathers again in '
             'backward."""']
    lines += [f"    dp = {_sub_mesh(names, layout.fsdp_axes)}"] if layout.fsdp_axes else []
    if seq is not None:
        axes = [*layout.fsdp_axes, layout.roles.index(SP)]
        along = _sub_mesh(names, axes) + (f'._flatten("{"_".join(names[a] for a in axes)}")' if len(axes) > 1 else "")
        lines.append(f"    along = {along}  # the blocks' parts on sequence slices: gradients summed over these")
    if shared_tp:
        mine = f' and p.device_mesh.mesh_dim_names == ("{names[layout.roles.index(TP)]}",)' if seq else ""
        lines.append(f"    styled = {{p for p in model.parameters() if isinstance(p, DTensor){mine}}}  "
                     "# left to their styles")
        others = [a for a in layout.fsdp_axes if layout.roles[a] == DP]
        if others:
            lines += [f"    for path in {tuple(layout.styles)!r}:",
                      f"        fully_shard(model.get_submodule(path), mesh={_sub_mesh(names, others)})"]
    apart = [path for unit in (*units.blocks, units.root) for path in unit.regathered]
    if apart and layout.fsdp_axes:
        lines += ["    # re-gathered for backward, unlike the rest of their block",
                  f"    for path in {_tuple(tuple(apart), 16)}:",
                  "        fully_shard(model.get_submodule(path), mesh=dp, reshard_after_forward=True)"]
    if units.container is not None:
        again = tuple(i for i, u in enumerate(units.blocks) if u.reshard)
        flag = "True" if len(again) == len(units.blocks) else "False" if not again else "i in again"
        blocks = f'model.get_submodule("{units.container}")'
        loop = f"i, module in enumerate({blocks})" if "i in" in flag else f"module in {blocks}"
        lines += [f"    again = {_tuple(again, 12)}"] if "i in" in flag else []
        if seq is not None:
            lines.append(f"    blocks = {blocks}")
            for group in seq.groups:
                lines += [f"    {block_loop(group, seq.blocks)}",
                          f"        fully_shard([blocks[i].get_submodule(p) for p in {group.parts!r}], mesh=along, "
                          f"reshard_after_forward={flag})"]
        if layout.fsdp_axes:
            lines += [f"    for {loop}:", f"        fully_shard(module, mesh=dp, reshard_after_forward={flag}{ignored})"]
    if layout.fsdp_axes:
        lines.append(f"    fully_shard(model, mesh=dp, reshard_after_forward={units.root.reshard}"
                     f"{ignored.replace('module', 'model')})")
    lines += ["    for module in model.modules():  # each rank's loss is its share: sum the gradients",
              "        if isinstance(module, FSDPModule):", "            module.set_gradient_divide_factor(1.0)",
              "            module.set_force_sum_reduction_for_comms(True)  # a plain sum (gloo has no pre-scaled one)"]
    return lines


IGNORED = '''


def _ignored(module, styled):
    """The parameters of ``module`` its tensor-parallel styles hold, which fully_shard leaves alone."""
    return {p for p in module.parameters() if p in styled}'''


def _describe(layout: NativeLayout, names: list[str]) -> str:
    roles = ", ".join(f'"{n}" ({r})' for n, r in zip(names, layout.roles))
    fed = [names[a] for a, r in enumerate(layout.roles) if r == DP]
    feed = f"each rank gets its slice of the batch along {', '.join(fed)}" if fed else "every rank gets the whole batch"
    summed = "; fully_shard sums the gradients" if layout.fsdp_axes else ""
    return f"Mesh dims: {roles}; {feed}. Each rank's loss is its share of the whole batch's (loss_share){summed}."


def _imports(text: str, layout: NativeLayout) -> list[str]:
    wanted = [("defaultdict(", "from collections import defaultdict"),
              ("nullcontext(", "from contextlib import nullcontext"),
              ("torch.ops", "import torch"),
              ("checkpoint_wrapper(", "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import "
                                      "checkpoint_wrapper"),
              ("init_device_mesh(", "from torch.distributed.device_mesh import init_device_mesh")]
    lines = [line for key, line in wanted if key in text]
    fsdp = [name for name in ("FSDPModule", "fully_shard") if f"{name}(" in text or f"{name})" in text]
    if fsdp:
        lines.append(f"from torch.distributed.fsdp import {', '.join(fsdp)}")
    placements = [name for name in ("DTensor", "Replicate", "Shard") if f"{name}(" in text or f"{name})" in text]
    if placements:
        lines.append(f"from torch.distributed.tensor import {', '.join(placements)}")
    kinds = {s.kind for s in layout.styles.values()} | ({"PrepareModuleInput"} if any(layout.sliced_inputs) else set())
    if layout.sequence is not None:
        kinds |= {"PrepareModuleInput", "PrepareModuleOutput", *(style for group in layout.sequence.groups for _, style in group.styles)}
    parallel = sorted(kinds) + (["loss_parallel"] if "loss_parallel(" in text else [])
    if kinds:
        lines.append(f"from torch.distributed.tensor.parallel import {', '.join([*parallel, 'parallelize_module'])}")
    if "selective_context" in text:
        lines.append("from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts")
    if "attention_by_heads(" in text:
        lines += HEADS_IMPORTS
    return lines


def render(plan: Plan, layout: NativeLayout) -> str:
    """The source of ``layout`` (see module doc)."""
    names = mesh_names(layout.roles)
    steps: list[list[str]] = []
    if layout.styles:
        steps.append(_tp_lines(layout, names))
    if layout.sequence is not None:
        steps.append(sequence_lines(layout.sequence, names[layout.roles.index(SP)]))
    if layout.units.container is not None and any(u.recompute != NONE for u in layout.units.blocks):
        steps.append(_ac_lines(layout))
    if layout.fsdp_axes or layout.sequence is not None:
        steps.append(_fsdp_lines(layout, names))
    vocab_sharded = any(style.dtensor_output for style in layout.styles.values())
    body = [
        'def build_mesh(device_type="cuda"):',
        f'    """The {plan.mesh.label} device mesh with named dims (call on every rank)."""',
        f"    return init_device_mesh(device_type, {tuple(plan.mesh.shape)!r}, mesh_dim_names={tuple(names)!r})",
        "", "",
        "def parallelize(model, mesh):",
        '    """Shard ``model`` in place as the plan does; returns it."""',
        *[f"    {step[0][4:step[0].index(':')]}" for step in steps],
        "    return model",
    ]
    for step in steps:
        body += ["", "", *step]
    body += ["", "", "def loss_context():", '    """Run the loss and its backward inside this context."""',
             "    return loss_parallel()" if vocab_sharded else "    return nullcontext()", "", "",
             "def loss_share(loss):",
             f'    """This rank\'s share of the whole batch\'s loss: its loss over the rows it holds, of '
             f'{layout.loss_slices} slice{"s" if layout.loss_slices > 1 else ""}."""',
             f"    return loss / {layout.loss_slices}" if layout.loss_slices > 1 else "    return loss"]
    text = "\n".join(body)
    if "selective_context" in text:
        text += SELECTIVE_POLICY
    if "_ignored(" in text:
        text += IGNORED
    if "attention_by_heads(" in text:
        text += HEADS
    head = [f'"""{plan.model or "The model"}\'s autoshard plan on mesh {plan.mesh.label} in PyTorch\'s own APIs '
            "(torchtitan style).", "", _describe(layout, names), '"""', ""]
    head += [f"# not exported: {note}" for note in layout.notes] + ([""] if layout.notes else [])
    return "\n".join([*head, *_imports(text, layout), "", "", text]) + "\n"
