"""The Python API: model in, proved plan out. The CLI is this plus rendering.

    from autoshard import plan_model
    result = plan_model(model, (x,), mesh="2x4", mode="training", pins={"fc1.weight": "S0R"})
    result.plan.save("plan.json")
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from fractions import Fraction
import time
from typing import Any, Callable, Mapping

from autoshard.problem.baselines.start import Start, starting_plan
from autoshard.problem.build import BuildOptions, ModelProblem, build_problem
from autoshard.cost.communication import make_cost_model
from autoshard.cost.devices import Device, get_device
from autoshard.frontend.graph import OpGraph
from autoshard.sharding.mesh import Mesh, parse_mesh
from autoshard.sharding.spec import TensorSpec
from autoshard.problem.plan import Plan
from autoshard.problem.readback import make_plan
from autoshard.errors import AutoshardError
from autoshard.solver import InfeasibleError, Solution, SolveOptions, solve
from autoshard.solver.core.rows import smallest_peak
from autoshard.cost.units import format_bytes

# Problems this small (total strategies over all nodes) go straight to the z3 loop, so its log
# shows every plan it tried; larger ones are reduced and warm-started first (plain z3 already
# struggles with a handful of 25-strategy nodes on a 2-D mesh).
DIRECT_Z3_MAX_STRATEGIES = 64


class BudgetError(AutoshardError):
    """No plan of the problem fits its memory budget, as the solver proved."""


@dataclass(frozen=True)
class StageOptions:
    """A pipeline stage's terms: microbatches per step, the most it holds in flight (in its own
    activation sets), the (bytes/s, seconds) link it receives on, the layouts it receives and
    sends tensors in (by name; none: its own choice), and whether it keeps its parameters
    gathered over the step's microbatches (one gather and one gradient reduction per step)."""

    microbatches: int
    in_flight: Fraction
    link: tuple[float, float]
    boundary: Mapping[str, TensorSpec] = field(default_factory=dict)
    keep_gathered: bool = False


@dataclass
class ModelSolution:
    """What solving a model produced: the problem, the solver's answer and the plan."""

    model_problem: ModelProblem
    solution: Solution
    plan: Plan
    start: Start | None = None
    """The hand-written plan the solver started from (problem/baselines/start.py), if one fit."""


def default_solve_options(mp: ModelProblem, timeout: float | None = None) -> SolveOptions:
    """Direct z3 CEGIS on small problems (every iteration is informative), reductions on large ones."""
    p = mp.problem
    large = sum(p.num_strategies(i) for i in range(p.num_nodes)) > DIRECT_Z3_MAX_STRATEGIES
    return SolveOptions(timeout=timeout, reduce=large, warm_start=large)


def as_mesh(mesh: Mesh | str | int, device: Device | None = None) -> Mesh:
    """Accept a Mesh, ``"2x4"`` or ``8`` (links from ``device``, default the generic ones)."""
    if isinstance(mesh, Mesh):
        return mesh
    links = {} if device is None else {"intra": device.intra, "inter": device.inter}
    return parse_mesh(str(mesh), **links)


def build_model_problem(
    graph: OpGraph,
    mesh: Mesh | str | int = 8,
    *,
    cost_model: str = "alpha-beta",
    mode: str = "inference",
    memory_budget: int | None = None,
    pins: Mapping[str, str] | None = None,
    device: Device | str | None = None,
    peak_flops: float | None = None,
    memory_bandwidth: float | None = None,
    precision: str = "as-is",
    capacity_factor: float = 1.0,
    expert_parallel: int | None = None,
    recompute: str = "full",
    overlap: bool | None = None,
    compile: str | None = None,
    float8: str | None = None,
    async_tp: bool = False,
    stage: StageOptions | None = None,
) -> ModelProblem:
    """The sharding problem of a traced model.

    ``device`` is a preset name (``h100``), a preset file (``my_gpu.toml``) or a Device;
    ``peak_flops`` (every dtype) and ``memory_bandwidth`` override its roofline. A memory budget
    of None means the device's capacity (none for the generic device). ``capacity_factor`` scales what expert-sharded
    mixture-of-experts layers are charged over balanced routing; ``expert_parallel`` (a mesh
    axis) pins them to expert parallelism over that axis. ``overlap`` (default: the device's)
    lets parameter traffic hide under the neighbouring layer's compute (``problem/build.py``);
    ``recompute`` is the recomputation policy (``cost/recompute.py``). ``compile`` (``model`` or
    ``layers``), ``float8`` (``tensorwise`` or ``rowwise``) and ``async_tp`` price the step as
    torch.compile, torchao's Float8 linears and asynchronous tensor parallelism run it
    (``problem/build.py``). ``stage``: the graph is one
    device's pipeline stage (autoshard/pipeline), with microbatches in flight and a link to receive on.
    """
    chosen = device if isinstance(device, Device) else get_device(device)
    chosen = chosen.with_roofline(peak_flops, memory_bandwidth)
    mesh = as_mesh(mesh, chosen)
    model = make_cost_model(cost_model, mesh, chosen)
    budget = memory_budget if memory_budget is not None else chosen.memory
    options = BuildOptions(mode=mode, memory_budget=None if budget is None else chosen.live_limit(budget),
                           pins=dict(pins or {}), slapo_space=cost_model == "slapo", precision=precision,
                           capacity_factor=capacity_factor, expert_parallel=expert_parallel,
                           overlap=chosen.overlap if overlap is None else overlap, device_budget=budget,
                           recompute=recompute, compile=compile, float8=float8, async_tp=async_tp)
    if stage is not None:
        options = replace(options, in_flight=stage.in_flight, accumulate=stage.microbatches > 1,
                          receive_link=stage.link, boundary=dict(stage.boundary),
                          kept_over=stage.microbatches if stage.keep_gathered else 0)
    from autoshard.frontend.profile import LocalFlops

    return build_problem(graph, mesh, model, options, LocalFlops(graph) if graph.module is not None else None)


def solve_model_problem(
    mp: ModelProblem,
    options: SolveOptions | None = None,
    on_event: Callable[[Any], None] | None = None,
    model_name: str = "",
    baselines: bool = True,
) -> ModelSolution:
    """Solve a model problem and read the answer back as a plan. Under a memory budget (and with
    ``baselines``) the cheapest hand-written plan that fits is the solver's first best
    (``starting_plan``), so the answer is it or a cheaper plan; the seconds costing the recipes
    took come off ``options.timeout``."""
    options = options or default_solve_options(mp)
    start = None
    if baselines and options.start is None:
        began = time.monotonic()
        deadline = None if options.timeout is None else began + options.timeout / 2
        start = starting_plan(mp, deadline)
        spent = time.monotonic() - began
        timeout = None if options.timeout is None else max(options.timeout - spent, 0.0)
        options = replace(options, timeout=timeout, start=None if start is None else start.choice)
    try:
        solution = solve(mp.problem, options, on_event=on_event)
    except InfeasibleError:
        raise BudgetError(_budget_message(mp)) from None
    plan = make_plan(mp, list(solution.choice), model=model_name, lower_bound=solution.lower_bound,
                     proved_optimal=solution.status == "optimal")
    return ModelSolution(mp, solution, plan, start)


def _budget_message(mp: ModelProblem) -> str:
    """One line for a memory budget no plan meets, in bytes per device (the device's budget, and
    the live bytes it leaves once the allocator's headroom and the runtime's bytes are taken)."""
    live = mp.problem.usage_limit
    budget = live if mp.options.device_budget is None else mp.options.device_budget
    device = mp.cost_model.device
    limit = format_bytes(budget) if live == budget else f"{format_bytes(budget)} ({format_bytes(live)} live)"
    peak = smallest_peak(mp.problem)
    if peak.value > live:
        least = "" if peak.exact else "at least "
        needed = device.device_bytes(peak.value)
        return (f"--memory-budget {limit} is below the smallest peak any plan reaches "
                f"({least}{format_bytes(peak.value)} live per device, {peak.value} bytes): raise the budget to at "
                f"least {format_bytes(needed)} or use a larger mesh")
    return (f"no plan fits --memory-budget {limit} per device (proved by the solver): "
            f"raise the budget or use a larger mesh")


def plan_model(
    model: Any,
    example_inputs: Any,
    mesh: Mesh | str | int = 8,
    *,
    frontend: str = "auto",
    timeout: float | None = None,
    on_event: Callable[[Any], None] | None = None,
    **build_options: Any,
) -> ModelSolution:
    """Trace ``model`` on ``example_inputs`` and return its optimal plan on ``mesh``.

    ``build_options`` are those of :func:`build_model_problem` (cost_model, mode, memory_budget,
    pins, device, peak_flops, memory_bandwidth, precision, capacity_factor, expert_parallel,
    recompute, overlap, compile, float8, async_tp).
    """
    from autoshard.frontend.trace import trace

    inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    graph = trace(model, inputs, frontend)
    mp = build_model_problem(graph, mesh, **build_options)
    return solve_model_problem(mp, default_solve_options(mp, timeout), on_event, type(model).__name__)
