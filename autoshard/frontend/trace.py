"""Trace a PyTorch model into an OpGraph with torch.fx or torch.export.

- ``fx``: ``torch.fx`` symbolic tracing through every module (no leaf modules, so ``nn.Linear``
  becomes ``F.linear`` on ``get_attr`` weight and bias), then shapes from a fake-tensor run.
  Keeps the user's Python-level ops; fails on models with data-dependent Python control flow,
  such as Hugging Face transformers.
- ``export``: ``torch.export.export(strict=False)``, whose ATen graph already carries shapes.
  ``wrap_with_set_grad_enabled`` (LLaMA's rotary embedding runs under ``torch.no_grad``) is
  inlined here: its body's ATen ops become ordinary nodes that do not require grad and replay
  under the same grad mode. ``ep.run_decompositions({})`` would inline it too, but it also
  rewrites ``dropout``/``contiguous`` into ``clone`` and ``reshape`` into ``view``/``_unsafe_view``
  and doubles the tracing time. Other higher-order ops (``wrap_with_autocast``, whose body's
  dtypes depend on the autocast context; control flow) stay single nodes with ``op=None``.
- ``auto``: fx, falling back to export when fx fails.

Both trace the model in eval mode (the user's train/eval flags are restored afterwards) and
normalise to the same vocabulary (see ``autoshard.frontend.graph``), so a model traced both ways gives the
same ops. ``OpGraph.module`` is an executable GraphModule (``module(*example_inputs)`` runs the
model) whose ``meta`` holds each node's replayable call for ``autoshard.frontend.call``.
"""

from __future__ import annotations

import contextlib
import io
import operator
from typing import Any, Iterator

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.export.graph_signature import InputKind, OutputKind

from autoshard.errors import AutoshardError
from autoshard.frontend.call import NODE_CALLS_KEY, NodeCall
from autoshard.frontend.convert import GraphConverter
from autoshard.frontend.experts import fuse_experts
from autoshard.frontend.functionalize import InPlaceProxy, MutationError, functionalize_fx, has_mutations
from autoshard.frontend.gradients import mark_gradients
from autoshard.frontend.eager import mixed_dtypes, quiet_fake_tensor_logs, raise_if_forward_fails
from autoshard.frontend.load import describe_error
from autoshard.frontend.loss import model_name
from autoshard.frontend.profile import profile_graph
from autoshard.frontend.graph import OpGraph

FRONTENDS = ("auto", "fx", "export")
_SET_GRAD_ENABLED = torch.ops.higher_order.wrap_with_set_grad_enabled


def trace(model: torch.nn.Module, example_inputs: tuple[torch.Tensor, ...], frontend: str = "auto") -> OpGraph:
    """Trace ``model(*example_inputs)`` into an OpGraph with the chosen frontend.

    ``auto`` tries fx and falls back to export; the frontend used is ``OpGraph.frontend``. When
    tracing fails because forward itself fails on the example inputs (a shape mismatch, an
    exception of the user's), the error says so instead of blaming the tracer.
    """
    if frontend not in FRONTENDS:
        raise AutoshardError(f"unknown frontend {frontend!r}; use one of {', '.join(FRONTENDS)}")
    with _eval_mode(model), quiet_fake_tensor_logs():
        graph = _trace(model, example_inputs, frontend)
        if mixed_dtypes(graph):  # shape propagation does not check dtypes; the real kernels will
            raise_if_forward_fails(model, example_inputs)
    return graph


def _trace(model: torch.nn.Module, example_inputs: tuple[torch.Tensor, ...], frontend: str) -> OpGraph:
    """:func:`trace` in eval mode: the chosen frontend, then why it failed in one line."""
    name = model_name(model)
    if frontend == "fx":
        try:
            return trace_fx(model, example_inputs)
        except MutationError as error:
            raise AutoshardError(f"torch.fx cannot trace {name}: {error}") from error
        except Exception as error:
            raise_if_forward_fails(model, example_inputs)
            raise AutoshardError(f"torch.fx cannot trace {name}: {describe_error(error)}; "
                                 "try --frontend export") from error
    if frontend == "export":
        try:
            return trace_export(model, example_inputs)
        except Exception as error:
            raise_if_forward_fails(model, example_inputs)
            raise AutoshardError(f"torch.export cannot trace {name}: {describe_error(error)}; "
                                 "make forward traceable (no data-dependent Python control flow)") from error
    try:
        return trace_fx(model, example_inputs)
    except Exception as fx_error:
        try:
            graph = trace_export(model, example_inputs)
        except Exception as export_error:
            raise_if_forward_fails(model, example_inputs)
            raise AutoshardError(
                f"cannot trace {name}: torch.fx failed ({describe_error(fx_error)}) and torch.export failed "
                f"({describe_error(export_error)}); make forward traceable (tensor-only inputs and outputs, "
                "no data-dependent Python control flow) or pass inputs that match forward's signature"
            ) from export_error
        graph.frontend_note = f"torch.fx failed: {describe_error(fx_error)}"
        return graph


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Trace in eval mode (dropout off, no buffer updates), then restore every module's flag."""
    flags = {module: module.training for module in model.modules()}
    model.eval()
    try:
        yield
    finally:
        for module, training in flags.items():
            module.training = training


@contextlib.contextmanager
def _state_unchanged(model: torch.nn.Module) -> Iterator[None]:
    """Refuse a forward that mutates a parameter or buffer while fx traces it (fx runs such calls eagerly
    on the real tensor and records nothing); buffers get their values back first."""
    state = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers(remove_duplicate=False))
    versions = {name: tensor._version for name, tensor in state.items()}
    saved = {name: tensor.detach().clone() for name, tensor in model.named_buffers()}
    try:
        yield
    finally:
        changed = [name for name, tensor in state.items() if tensor._version != versions[name]]
        with torch.no_grad():
            for name in changed:
                if name in saved:
                    state[name].copy_(saved[name])
    if changed:
        raise MutationError(f"forward modifies parameter or buffer {changed[0]} in place: autoshard plans a pure "
                            "function of inputs and parameters; compute a new tensor instead (or update it outside "
                            "forward)")


class _ThroughAllModules(torch.fx.Tracer):
    """Symbolic tracer that records the ops inside every module instead of calling it a leaf,
    and in-place operators (``x += y``) as the mutations they are."""

    def is_leaf_module(self, module: torch.nn.Module, qualname: str) -> bool:
        return False

    def proxy(self, node: torch.fx.Node) -> torch.fx.Proxy:
        return InPlaceProxy(node, self)


class _FakePropagation(torch.fx.Interpreter):
    """Runs a GraphModule on fake tensors, recording each node's result in ``meta["val"]``."""

    def run_node(self, node: torch.fx.Node) -> Any:
        result = super().run_node(node)
        node.meta["val"] = result
        return result


def trace_fx(model: torch.nn.Module, example_inputs: tuple[torch.Tensor, ...]) -> OpGraph:
    """torch.fx symbolic trace through all modules, fake-tensor shape propagation, in-place calls
    made out of place (``functionalize.functionalize_fx``)."""
    tracer = _ThroughAllModules()
    with _state_unchanged(model):
        graph = tracer.trace(model)
    module = torch.fx.GraphModule(tracer.root, graph, type(model).__name__)
    with FakeTensorMode(allow_non_fake_inputs=True) as fake_mode:
        _FakePropagation(module).run(*(fake_mode.from_tensor(t) for t in example_inputs))
    functionalize_fx(module)
    module.recompile()
    parameters = {name for name, _ in module.named_parameters()}
    converter = GraphConverter()
    first_read: dict[str, torch.fx.Node] = {}  # a buffer read in every layer (self.cos) is one node
    for node in module.graph.nodes:
        if node.op == "placeholder":
            converter.add_input(node, node.target)
        elif node.op == "get_attr" and first_read.setdefault(node.target, node) is not node:
            converter.alias(node, first_read[node.target])
        elif node.op == "get_attr":
            fetch = NodeCall(operator.attrgetter(node.target), (module,))
            converter.add_state(node, node.target, node.target in parameters, fetch)
        elif node.op in ("call_function", "call_method"):
            converter.add_call(node)
        elif node.op == "output":
            converter.add_output(node.args)
        else:
            raise ValueError(f"unexpected fx node {node.format_node()}")
    return _graph(converter, "fx", module, model)


def trace_export(model: torch.nn.Module, example_inputs: tuple[torch.Tensor, ...]) -> OpGraph:
    """torch.export (non-strict) with context-only higher-order ops inlined; a program that still
    mutates tensors in place is functionalised by ``run_decompositions({})`` first."""
    # On failure torch.export prints the partial graph to stderr; the caller reports one line instead.
    with contextlib.redirect_stderr(io.StringIO()):
        program = torch.export.export(model, tuple(example_inputs), strict=False)
        if has_mutations(program.graph_module):
            program = program.run_decompositions({})
    signature = program.graph_signature
    input_specs = {spec.arg.name: spec for spec in signature.input_specs}
    converter = GraphConverter()
    inliner = _HigherOrderInliner(converter, program.graph_module)
    first_use: dict[int, torch.fx.Node] = {}  # tied weights are lifted once per name: keep one node
    for node in program.graph.nodes:
        spec = input_specs.get(node.name)
        if spec is not None and spec.kind is InputKind.PARAMETER:
            first = first_use.setdefault(id(model.get_parameter(spec.target)), node)
            if first is not node:
                converter.alias(node, first)
                continue
        if node.op == "placeholder":
            _add_export_input(converter, node, spec, model, program)
        elif node.op == "get_attr":
            converter.constant[node] = operator.attrgetter(node.target)(program.graph_module)
        elif inliner.handles(node):
            inliner.inline(node, grad_enabled=True)
        elif node.op == "call_function":
            converter.add_call(node)
        elif node.op == "output":
            user_outputs = [result for result, spec in zip(node.args[0], signature.output_specs)
                            if spec.kind is OutputKind.USER_OUTPUT]
            converter.add_output(user_outputs)
        else:
            raise ValueError(f"unexpected exported node {node.format_node()}")
    return _graph(converter, "export", program.module(), model)


def _add_export_input(
    converter: GraphConverter, node: torch.fx.Node, spec: Any, model: torch.nn.Module,
    program: torch.export.ExportedProgram,
) -> None:
    """Classify an exported placeholder: user input, parameter, buffer or lifted constant."""
    if spec.kind is InputKind.USER_INPUT:
        converter.add_input(node, node.name)
    elif spec.kind is InputKind.PARAMETER:
        converter.add_state(node, spec.target, True, NodeCall(operator.attrgetter(spec.target), (model,)))
    elif spec.kind is InputKind.BUFFER:
        converter.add_state(node, spec.target, False, NodeCall(operator.attrgetter(spec.target), (model,)))
    elif spec.kind is InputKind.CONSTANT_TENSOR:
        fetch = NodeCall(operator.getitem, (program.constants, spec.target))
        converter.add_state(node, spec.target, False, fetch)
    else:
        raise ValueError(f"unsupported exported input {node.name} of kind {spec.kind.name}")


class _HigherOrderInliner:
    """Inlines ``wrap_with_set_grad_enabled`` bodies (nested ones too) into the graph."""

    def __init__(self, converter: GraphConverter, root: torch.fx.GraphModule) -> None:
        self.converter = converter
        self.root = root
        self.results: dict[torch.fx.Node, list[torch.fx.Node]] = {}
        # getitems on an inlined op vanish, so their names are free for the body's nodes
        hop_users = {user for node in root.graph.nodes if _sets_grad_mode(node) for user in node.users}
        self.taken = {node.name for node in root.graph.nodes if node not in hop_users}

    def handles(self, node: torch.fx.Node) -> bool:
        """A grad-mode higher-order op, or a getitem on one's results."""
        if node.op == "call_function" and node.target is operator.getitem:
            return node.args[0] in self.results
        return _sets_grad_mode(node)

    def inline(self, node: torch.fx.Node, grad_enabled: bool) -> None:
        """Add the body's nodes in place of the call; getitems on it alias the body's results."""
        if node.target is operator.getitem:
            self.converter.alias(node, self.results[node.args[0]][node.args[1]])
            return
        enabled, body_node, *operands = node.args
        body = operator.attrgetter(body_node.target)(self.root)
        for inner in body.graph.nodes:
            if inner.op == "placeholder":
                self.converter.alias(inner, operands.pop(0))
            elif inner.op == "get_attr":
                self.converter.constant[inner] = operator.attrgetter(inner.target)(body)
            elif self.handles(inner):
                self.inline(inner, bool(enabled))
            elif inner.op == "call_function":
                self.converter.add_call(inner, self._fresh_name(node.name, inner.name), bool(enabled))
            elif inner.op == "output":
                self.results[node] = list(inner.args[0])
            else:
                raise ValueError(f"cannot inline {inner.format_node()} from {node.name}")

    def _fresh_name(self, prefix: str, name: str) -> str:
        candidate, counter = name, 0
        while candidate in self.taken:
            counter += 1
            candidate = f"{prefix}_{name}" if counter == 1 else f"{prefix}_{name}_{counter}"
        self.taken.add(candidate)
        return candidate


def _sets_grad_mode(node: torch.fx.Node) -> bool:
    """``wrap_with_set_grad_enabled(enabled, body, *operands)``: the body under a grad mode."""
    return node.op == "call_function" and node.target is _SET_GRAD_ENABLED


def _graph(converter: GraphConverter, frontend: str, module: torch.fx.GraphModule, model: torch.nn.Module) -> OpGraph:
    """The OpGraph of a converted trace, mixture-of-experts layers fused into one node each
    (frontend/experts.py), every op's work measured by torch (frontend/profile.py)."""
    module.meta[NODE_CALLS_KEY] = converter.calls
    graph = OpGraph(nodes=converter.nodes, frontend=frontend, module=module)
    fuse_experts(graph, model)
    mark_gradients(graph)  # before profiling: which operands get a gradient decides the backward measured
    profile_graph(graph)
    return graph
