"""Differential testing of plans: run them on forked gloo ranks and compare with the unsharded model.

For one model and mesh, :func:`plans_for` makes the optimal plan under a compute-bound cost model
(``COMPUTE_BOUND``: compute so slow that the solver shards whatever it can, as a user would see
on a slow device) and random plans: uniform choices of one strategy per node, and choices that
prefer the strategies most likely to hide a bug (scaled means, losses divided by a global count
of valid targets, partial sums). :func:`run_plans` executes them all in one forked run, forward
and backward, and :func:`findings` lists what differs from the unsharded model (eager, not the
traced graph, so tracing bugs are caught too): tensors beyond the checker's tolerance, collectives
other than the plan's list, or an exception on a rank.
"""

from __future__ import annotations

import functools
import random
import traceback
import zlib
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from autoshard.api import build_model_problem, default_solve_options, solve_model_problem
from autoshard.problem.build import ModelProblem
from autoshard.frontend.trace import trace
from autoshard.problem.plan import Plan
from autoshard.problem.readback import make_plan
from autoshard.runtime.checks import Collective, expected_collectives, relative_errors
from autoshard.runtime.executor import parallelize
from autoshard.runtime.placements import distribute, gather_full
from autoshard.runtime.groups import MeshGroups
from tests.differential.models import MODELS
from tests.runtime.dist import run_ranks
from tests.runtime.plans import Traced, loss_weights, random_choices, reference

COMPUTE_BOUND = {"peak_flops": 1e8, "memory_bandwidth": 2e6}
"""The issue's ``--peak-flops 1e8 --memory-bandwidth 2e6``: plans shard even tiny models."""
TOLERANCE = 1e-5


@functools.lru_cache(maxsize=None)
def traced_model(name: str) -> Traced:
    """Model ``name`` of ``models.MODELS``, built and traced once per process (frontend ``auto``)."""
    model, inputs = MODELS[name]()
    return Traced(name, model, inputs, trace(model, inputs))


def model_problem(t: Traced, mesh: str, mode: str) -> ModelProblem:
    """The sharding problem under the compute-bound cost model."""
    return build_model_problem(t.graph, mesh, mode=mode, **COMPUTE_BOUND)


def biased_choice(mp: ModelProblem, rng: random.Random) -> list[int]:
    """Per node, a strategy with a scaled mean, a global-count loss or a partial output when it has one."""
    choice = []
    for name in mp.names:
        strategies = mp.candidates[name].strategies
        risky = [i for i, s in enumerate(strategies) if s.scale != 1 or s.count_axes or s.out_spec.partial]
        choice.append(rng.choice(risky or range(len(strategies))))
    return mp.with_storage_of_users(choice)


def plans_for(t: Traced, mesh: str, mode: str, n_random: int, seed: int, optimal: bool = True,
              timeout: float = 20.0) -> dict[str, Plan]:
    """The optimal plan (best within ``timeout`` s) and ``n_random`` random plans (half of them biased), by label."""
    mp = model_problem(t, mesh, mode)
    rng = random.Random(zlib.crc32(f"{t.name} {mesh} {mode} {seed}".encode()))
    chosen: dict[str, list[int]] = {}
    if optimal:
        chosen["optimal"] = list(solve_model_problem(mp, default_solve_options(mp, timeout)).solution.choice)
    n_biased = n_random // 2
    for k, choice in enumerate(random_choices(mp, n_random - n_biased, rng.randrange(2**31))):
        chosen[f"random{k}"] = choice
    for k in range(n_biased):
        chosen[f"biased{k}"] = biased_choice(mp, rng)
    return {f"{mode}/{label}": make_plan(mp, choice, model=t.name) for label, choice in chosen.items()}


@dataclass
class Outcome:
    """What rank 0 observed running one plan: errors of whole tensors, collectives, or an exception."""

    label: str
    errors: dict[str, tuple[float, float]] = field(default_factory=dict)
    collectives: list[Collective] = field(default_factory=list)
    exception: str = ""


def _grad(p: nn.Parameter) -> torch.Tensor:
    return p.grad if p.grad is not None else torch.zeros_like(p)


def _execute(rank: int, world: int, t: Traced, plans: dict[str, Plan],
             references: dict[str, tuple[list[torch.Tensor], dict[str, torch.Tensor]]]) -> list[Outcome]:
    """Every plan on this rank: forward, backward of sum(output * R), gathered outputs and gradients."""
    groups = MeshGroups.create(next(iter(plans.values())).mesh)
    outcomes = []
    for label, plan in plans.items():
        want_outputs, want_grads = references[plan.mode]
        try:
            module = parallelize(t.model, plan, groups, graph=t.graph, validate=False)  # wrong plans too
            local = module(*[x.clone() for x in t.inputs])
            local = list(local) if isinstance(local, tuple) else [local]
            # whole shapes from the reference: a dim the mesh does not divide is cut as torch.chunk cuts it
            outputs = [gather_full(o.detach(), s, groups, tuple(w.shape))
                       for o, s, w in zip(local, module.output_specs, want_outputs)]
            grads = {}
            if plan.mode == "training":
                weights = loss_weights(outputs)
                loss = sum((o * distribute(w, s, groups)).sum() for o, w, s in zip(local, weights, module.output_specs)
                           if o.is_floating_point())
                loss.backward()
                grads = {n: gather_full(_grad(p), module.param_specs[n], groups, tuple(want_grads[n].shape))
                         for n, p in module.named_parameters()}
            errors = relative_errors({f"output {k}": o for k, o in enumerate(outputs)},
                                     {f"output {k}": o for k, o in enumerate(want_outputs)})
            if grads:
                errors |= relative_errors({f"grad {n}": g for n, g in grads.items()},
                                          {f"grad {n}": g for n, g in want_grads.items()})
            outcomes.append(Outcome(label, errors, module.collectives()))
        except Exception as error:  # noqa: BLE001 - a plan that raises is a finding, not the end of the run
            outcomes.append(Outcome(label, exception=traceback.format_exception_only(error)[-1].strip()))
    return outcomes


def run_plans(t: Traced, plans: dict[str, Plan], timeout: float = 300) -> dict[str, Outcome]:
    """Run ``plans`` (one mesh) on forked gloo ranks; rank 0's outcome per label."""
    modes = {plan.mode for plan in plans.values()}
    references = {mode: reference(t, mode == "training") for mode in modes}
    world = next(iter(plans.values())).mesh.size
    results = run_ranks(world, _execute, t, plans, references, timeout=timeout)
    return {outcome.label: outcome for outcome in results[0]}


def findings(plans: dict[str, Plan], outcomes: dict[str, Outcome]) -> list[str]:
    """One line per plan that differs from the unsharded model or from its own collective list."""
    lines = []
    for label, plan in plans.items():
        outcome = outcomes[label]
        if outcome.exception:
            lines.append(f"{label}: raised {outcome.exception}")
            continue
        bad = {name: rel for name, (_, rel) in outcome.errors.items() if not rel <= TOLERANCE}
        if bad:
            worst = sorted(bad.items(), key=lambda item: -item[1])[:3]
            lines.append(f"{label}: {len(bad)} tensors off, worst " + ", ".join(f"{n} {e:.3g}" for n, e in worst))
        # rank 0 holds the first, largest pieces of every cut, whose bytes the plan prices
        if outcome.collectives != [replace(c, uneven=False) for c in expected_collectives(plan)]:
            lines.append(f"{label}: executed {len(outcome.collectives)} collectives, planned "
                         f"{len(expected_collectives(plan))}")
    return lines
