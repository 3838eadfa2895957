"""What the pipeline search knows of an option (``Searched``) and its answer over all of them
(``PipelineResult``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from autoshard.api import ModelSolution
from autoshard.pipeline.options import PipelineOption


@dataclass
class Searched:
    """An option as far as it was solved: per device group its solution, the step and its bound
    (``bounded``: False when the time limit came before its bound; ``origin``: ``baseline`` for
    the recipe's plans taken as they are, not solved, ``no plan`` where solving found none in time)."""

    option: PipelineOption
    bound: float
    step: float | None = None
    solutions: dict[tuple, ModelSolution] = field(default_factory=dict)
    groups: dict[tuple, list[int]] = field(default_factory=dict)
    mismatches: list[str] = field(default_factory=list)
    bounded: bool = True
    origin: str = "search"

    @property
    def fits(self) -> bool:
        """Every device's plan within the memory budget."""
        return all(s.solution.status != "over budget" for s in self.solutions.values())

    @property
    def proved(self) -> bool:
        """Its step meets its bound and every boundary layout agrees."""
        return self.step is not None and not self.mismatches and self.step <= self.bound * (1 + 1e-9)


@dataclass
class PipelineResult:
    """The best option, every option's bound or step, and the claim over them (``unbounded``: how
    many options the bounding phase left without a bound)."""

    best: Searched
    searched: list[Searched]
    lower_bound: float
    elapsed: float
    unbounded: int = 0

    @property
    def gap(self) -> float:
        """Relative gap between the best step and the least bound over the options."""
        return max(0.0, (self.best.step - self.lower_bound) / self.best.step) if self.best.step else 0.0
