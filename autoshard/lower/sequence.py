"""One mesh axis that splits the repeated blocks by the sequence, attention by heads (Ulysses), as PyTorch code.

A plan may run each block on the rank's slice of the sequence along an axis: the norms and the
attention projections on the slice (their weights gathered whole, their gradients summed over
the axis), attention itself split by heads through all-to-alls (queries, keys and values traded
from a sequence split to a head split and the output back), and the MLP column- then
row-parallel on the sequence gathered for it (Megatron's sequence parallelism). The export:

- ``parallelize_module`` on the axis: ``PrepareModuleInput`` cuts the first block's input to the
  rank's slice (``Replicate -> Shard(1)``: the backward gathers the gradient),
  ``PrepareModuleOutput`` gathers the last block's output, the per-position tables the blocks read
  (rotary cos/sin) are cut the same way, and the MLP's linears get ``ColwiseParallel`` /
  ``RowwiseParallel(output_layouts=Shard(1))`` with their input gathered once per module;
- the all-to-alls around the attention kernel, through transformers' ``AttentionInterface`` (its
  public hook for custom attention): the model's own attention function (sdpa, eager ...) runs on
  whole sequences of the rank's heads, so its mask and causality are the unsplit model's;
- ``fully_shard`` of the blocks' parts that compute on slices with whole weights over the
  flattened mesh of the data axes and this one, so their gradients are summed over both.

Outside the blocks the axis computes whole: the embedding and the head run on every rank of it,
their gradients equal there. :func:`sequence_axis` reads that form off a 1-D view of the plan or
raises ``NotMappable`` naming what does not fit it.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from autoshard.frontend.graph import NodeKind, OpGraph
from autoshard.lower.context import cuts
from autoshard.lower.tp_styles import NotMappable
from autoshard.problem.plan import Plan
from autoshard.sharding.layers import find_repeated_layers

COLWISE, ROWWISE = "ColwiseParallel", "RowwiseParallel"


@dataclass(frozen=True)
class BlockGroup:
    """Blocks laid out alike along the axis: their indices, the styles inside each (path -> style), the
    modules whose input is gathered for their styled linears, and the parts whose weights are summed
    over the axis."""

    indices: tuple[int, ...]
    styles: tuple[tuple[str, str], ...]
    gathered_inputs: tuple[str, ...]
    parts: tuple[str, ...]


@dataclass(frozen=True)
class SequenceAxis:
    """The axis's blocks (``container.0`` ... ``container.{blocks-1}``), the attention module inside a
    block, the modules outside the blocks whose outputs are per-position tables (path, number of
    outputs), and the blocks grouped by their layout along the axis."""

    container: str
    blocks: int
    attention: str
    tables: tuple[tuple[str, int], ...]
    groups: tuple[BlockGroup, ...]


def _relative(path: str, container: str) -> str:
    """``container.i.rest`` -> ``rest``."""
    return path[len(container) + 1:].partition(".")[2]


def _block_params(view: Plan, graph: OpGraph, container: str,
                  dependent: frozenset[str]) -> dict[int, dict[str, str]]:
    """Per block, each parameter (path inside the block) -> its style on the axis, or "" when its op
    uses it whole on the rank's sequence slice; raises NotMappable for any other use."""
    by_block: dict[int, dict[str, str]] = {}
    for edge in view.edges:
        src = graph[edge.src]
        if src.kind != NodeKind.PARAM or not src.qualname.startswith(container + "."):
            continue
        op, place = graph[edge.dst], view.nodes[edge.dst]
        where = f"{src.qualname} ({op.name}, {op.op})"
        if edge.dst_spec.is_replicated:
            others = [s for k, s in enumerate(place.in_specs) if op.inputs[k] != edge.src and op.inputs[k] in dependent]
            if not any(cuts(s, 1) for s in others):
                raise NotMappable(f"{where} runs whole on the axis, on an input not cut by the sequence")
            style = ""
        elif op.op == "linear" and edge.dst_spec.dims[0] and not place.in_specs[0].dims[1]:
            style = COLWISE
        elif op.op == "linear" and edge.dst_spec.dims[1] and place.out_spec.partial:
            style = ROWWISE
        else:
            raise NotMappable(f"{where} is used as {edge.dst_spec.format(1)}, which no sequence-parallel style is")
        block = int(src.qualname[len(container) + 1:].partition(".")[0])
        path = _relative(src.qualname, container)
        if by_block.setdefault(block, {}).setdefault(path, style) != style:
            raise NotMappable(f"{src.qualname} is used two ways along the axis")
    return by_block


def _cover(styles: dict[str, str]) -> tuple[str, ...]:
    """The fewest block submodules holding exactly the unstyled parameters (``styles``: param -> style)."""
    parts: set[str] = set()
    for param, style in styles.items():
        if style:
            continue
        owner = param.rpartition(".")[0]
        if not owner:
            raise NotMappable(f"{param} belongs to the block itself, not to a part of it")
        atoms = owner.split(".")
        for k in range(1, len(atoms) + 1):
            prefix = ".".join(atoms[:k])
            if not any(s and (p.startswith(prefix + ".")) for p, s in styles.items()):
                parts.add(prefix)
                break
        else:
            raise NotMappable(f"{param} shares its module with styled weights")
    return tuple(sorted(parts))


def _tables(view: Plan, graph: OpGraph, container: str, blocks: frozenset[str],
            dependent: frozenset[str]) -> tuple[tuple[str, int], ...]:
    """Modules outside the blocks (below the blocks' parent) whose parameter-free outputs the blocks
    read cut by the sequence, with the number of tensors each returns."""
    parent = container.rpartition(".")[0]
    found: dict[str, set[str]] = {}
    for edge in view.edges:
        src = graph[edge.src]
        if edge.src in blocks or edge.src in dependent or edge.dst not in blocks or not cuts(edge.dst_spec, 1):
            continue
        module = src.module
        if module in ("", parent) or (parent and not module.startswith(parent + ".")):
            continue
        found.setdefault(module, set())
    for module, outputs in found.items():
        inside = {n.name for n in graph if n.module == module or n.module.startswith(module + ".")}
        outputs.update(e.src for e in view.edges if e.src in inside and e.dst not in inside)
    return tuple((module, len(outputs)) for module, outputs in sorted(found.items()))


def _check_even(view: Plan, graph: OpGraph, blocks: frozenset[str]) -> None:
    """Every dim the blocks cut along the axis divides by its size (the all-to-alls trade equal pieces)."""
    n = view.mesh.shape[0]
    for name in blocks:
        place, meta = view.nodes.get(name), graph[name].tensor
        if place is None or place.out_spec is None or meta is None:
            continue
        for dim, axes in enumerate(place.out_spec.dims):
            if axes and dim < len(meta.shape) and meta.shape[dim] % n:
                raise NotMappable(f"{name} cuts dim {dim} of size {meta.shape[dim]} into {n} unequal pieces")


def sequence_axis(view: Plan, graph: OpGraph, model: nn.Module, dependent: frozenset[str],
                  attention_module: str) -> SequenceAxis:
    """The axis as :class:`SequenceAxis` (module doc), given the 1-D ``view``, the parameter-dependent
    nodes and the module whose attention the view splits by heads; raises NotMappable."""
    config = getattr(model, "config", None)
    if not getattr(config, "_attn_implementation", None):
        raise NotMappable("the export hooks the all-to-alls into transformers' AttentionInterface, and this model "
                          "does not dispatch its attention through one")
    layers = find_repeated_layers(graph)
    if layers is None or not attention_module.startswith(layers.container + "."):
        raise NotMappable("the attention split by heads is not inside repeated blocks")
    container = layers.container
    _check_even(view, graph, layers.nodes)
    groups: dict[tuple, list[int]] = {}
    for block, styles in sorted(_block_params(view, graph, container, dependent).items()):
        styled = {p: s for p, s in styles.items() if s}
        gathered = tuple(sorted({p.rpartition(".")[0].rpartition(".")[0] for p, s in styled.items() if s == COLWISE}))
        if any(not g for g in gathered):
            raise NotMappable("a column-parallel linear sits directly in the block, with no module to gather its input")
        modules = tuple(sorted({(p.rpartition(".")[0], s) for p, s in styled.items()}))
        groups.setdefault((modules, gathered, _cover(styles)), []).append(block)
    return SequenceAxis(container, layers.count, _relative(attention_module, container),
                        _tables(view, graph, container, layers.nodes, dependent),
                        tuple(BlockGroup(tuple(blocks), *key) for key, blocks in groups.items()))


def block_loop(group: BlockGroup, blocks: int) -> str:
    """The loop header over ``group``'s block indices (``i``)."""
    return f"for i in {group.indices!r}:" if len(group.indices) < blocks else f"for i in range({blocks}):"


def _layouts(count: int, layout: str) -> str:
    """``count`` copies of ``layout``: one placement, or a tuple of them."""
    return layout if count == 1 else "(" + ", ".join([layout] * count) + ")"


def sequence_lines(axis: SequenceAxis, name: str) -> list[str]:
    """``apply_sp(model, mesh)`` for mesh dim ``name``."""
    last = f"{axis.container}.{axis.blocks - 1}"
    lines = ["def apply_sp(model, mesh):",
             f'    """Sequence parallelism on mesh["{name}"]: each block on the rank\'s slice of the sequence, '
             "attention by\n    heads through all-to-alls, the MLP column/row-parallel on the gathered sequence; "
             'outside the\n    blocks the axis computes whole."""',
             f'    sp = mesh["{name}"]', "    parallelize_module(model, sp, {"]
    for path, count in axis.tables:
        lines.append(f'        "{path}": PrepareModuleOutput(output_layouts={_layouts(count, "Replicate()")}, '
                     f'desired_output_layouts={_layouts(count, "Shard(1)")}),')
    lines += [f'        "{axis.container}.0": PrepareModuleInput(input_layouts=(Replicate(),), '
              "desired_input_layouts=(Shard(1),), use_local_output=True),",
              f'        "{last}": PrepareModuleOutput(output_layouts=Shard(1), desired_output_layouts=Replicate()),',
              "    })"]
    styled = [group for group in axis.groups if group.styles]
    lines += [f'    blocks = model.get_submodule("{axis.container}")'] if styled else []
    for group in styled:
        lines += [f"    {block_loop(group, axis.blocks)}", "        parallelize_module(blocks[i], sp, {"]
        lines += [f'            "{path}": PrepareModuleInput(input_layouts=(Shard(1),), '
                  "desired_input_layouts=(Replicate(),), use_local_output=True),"
                  for path in group.gathered_inputs]
        lines += [f'            "{path}": {style}({"output_layouts=Shard(1)" if style == ROWWISE else ""}),'
                  for path, style in group.styles]
        lines.append("        })")
    lines.append(f'    attention_by_heads(model, sp, "{axis.container}.0.{axis.attention}")')
    return lines


HEADS = '''


def attention_by_heads(model, mesh, attention):
    """Attention split by heads over ``mesh`` (Ulysses): transformers' attention function for the model,
    wrapped so that queries, keys and values [batch, heads, sequence slice, dim] become [batch, heads/n,
    sequence, dim] by one all-to-all each, and the output goes back to the rank's slice of every head."""
    group, n = mesh.get_group(), mesh.size()
    implementation = model.config._attn_implementation
    eager = importlib.import_module(type(model.get_submodule(attention)).__module__).eager_attention_forward
    inner = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager)

    def to_heads(x):
        b, h, s, d = x.shape
        pieces = x.reshape(b, n, h // n, s, d).movedim(1, 0).contiguous()
        got = funcol.all_to_all_single_autograd(pieces, None, None, group)  # [source rank, b, h/n, s, d]
        return got.permute(1, 2, 0, 3, 4).reshape(b, h // n, n * s, d)

    def to_sequence(x):
        b, s, h, d = x.shape
        pieces = x.reshape(b, n, s // n, h, d).movedim(1, 0).contiguous()
        got = funcol.all_to_all_single_autograd(pieces, None, None, group)  # [source rank, b, s/n, h, d]
        return got.permute(1, 2, 0, 3, 4).reshape(b, s // n, n * h, d)

    def attention_forward(module, query, key, value, attention_mask, **kwargs):
        out, weights = inner(module, to_heads(query), to_heads(key), to_heads(value), attention_mask, **kwargs)
        return to_sequence(out), weights

    name = f"heads_by_all_to_all_{id(model)}"  # one per model: the wrapper holds this mesh's group
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[implementation])
    model.config._attn_implementation = name'''

HEADS_IMPORTS = ["import importlib", "import torch.distributed._functional_collectives as funcol",
                 "from transformers import AttentionInterface",
                 "from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface",
                 "from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS"]
