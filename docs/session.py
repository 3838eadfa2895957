"""Regenerate the README's quoted outputs from real runs, so they cannot drift from what the code prints.

``python docs/session.py`` runs each session's commands (the CLI as a user runs it: piped, in a
scratch folder, ``OMP_NUM_THREADS=1``) and rewrites the README between its markers:

- ``<!-- session NAME ... -->`` + a fenced block + ``<!-- /session -->``: a command's output;
- ``<!-- value NAME -->text<!-- /value -->``: a number or phrase quoted in the prose.

``--only NAME`` runs some sessions, ``--check`` rewrites nothing and exits 1 naming the blocks whose
text differs from a fresh run (timings and step times are compared as ``<t>``: they vary run to
run). The demo session is cheap (one small solve) and checked by ``tests/test_readme.py``; the
torchrun sessions take a minute or more each on two cores.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

from autoshard.cli.solve import PROGRESS_LINE

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
EXAMPLES = ROOT / "examples"
_BLOCK = re.compile(r"(<!-- session (?P<name>[\w-]+)[^>]*-->\n```(?P<lang>\w*)\n)(?P<body>.*?)(```\n<!-- /session -->)",
                    re.S)
_VALUE = re.compile(r"(<!-- value (?P<name>[\w-]+) -->)(?P<body>.*?)(<!-- /value -->)", re.S)


def normalise(text: str) -> str:
    """``text`` with what varies run to run (solve times ``0.08s``, step times ``0.49 s``) as ``<t>``."""
    text = re.sub(r"\b\d+\.\d+s\)", "<t>s)", text)
    return re.sub(r"(step \d+ loss \d+\.\d+) \d+\.\d+ s", r"\1 <t> s", text)


def run(*argv: str, cwd: Path, torchrun: int = 0) -> str:
    """stdout of ``python -m ARGV`` (or torchrun with ``torchrun`` ranks) in ``cwd``, piped, failing loudly;
    without the progress lines a slow machine adds (``PROGRESS_LINE``)."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"OMP_NUM_THREADS": "1"}
    launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={torchrun}", "-m"] if torchrun \
        else [sys.executable, "-m"]
    done = subprocess.run([*launcher, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return "".join(line for line in done.stdout.splitlines(keepends=True) if not PROGRESS_LINE.fullmatch(line.rstrip()))


def example(name: str) -> str:
    return str(EXAMPLES / f"{name}.py")


def _tables_between(lines: list[str], keep_first: int, keep_last: int, prefix: str) -> list[str]:
    """``lines`` without the tables that follow the ``prefix`` lines other than the first and last."""
    heads = [k for k, line in enumerate(lines) if line.startswith(prefix)]
    drop: set[int] = set()
    for head in heads[keep_first:len(heads) - keep_last]:
        k = head + 1
        while k < len(lines) and lines[k][:1] in "┏┃┡│└":
            drop.add(k)
            k += 1
    return [line for k, line in enumerate(lines) if k not in drop]


def demo_command() -> list[str]:
    """The module and arguments of the Makefile's ``demo`` recipe (``$(PY) -m MODULE ARGS...``)."""
    recipe = re.search(r"^demo:.*\n\t\$\(PY\) -m (.+)$", (ROOT / "Makefile").read_text(), re.M)
    if recipe is None:
        raise RuntimeError("Makefile has no `demo:` recipe of the form `$(PY) -m MODULE ARGS`")
    return recipe.group(1).split()


def demo(tmp: Path) -> dict[str, str]:
    """``make demo``: every line, but only the first and the last improving plan's tables."""
    module, *args = demo_command()
    out = run(module, *(str(ROOT / a) if a.startswith("examples/") else a for a in args), cwd=tmp)
    lines = _tables_between(out.splitlines(), 1, 1, "Iteration ")
    return {"demo": "$ make demo\n" + "\n".join(lines) + "\n"}


def solve_lines(tmp: Path) -> dict[str, str]:
    """The piped LLaMA example's line count; the MLP's plans explained: inference and training against
    Megatron's, the Slapo cost model's totals and plan."""
    llama = run("autoshard.solve", example("llama"), "--mesh", "2x2", cwd=tmp)
    slapo = run("autoshard.solve", example("mlp"), "--mesh", "8", "--cost-model", "slapo", cwd=tmp)
    totals = re.findall(r"^Iteration \d+ \([^)]*\): total (\d+) elements", slapo, re.M)
    syncs = re.findall(r'^sch\["(\w+)"\]\.sync\(mode="(\w+)", sync_op_or_fn="([^"]+)"\)', slapo, re.M)
    inference = run("autoshard.solve", example("mlp"), "--mesh", "8", "--baseline", "megatron", "--tables", "last",
                    "--quiet", cwd=tmp)
    training = run("autoshard.solve", example("mlp"), "--mesh", "8", "--mode", "training", "--baseline", "megatron",
                   "--tables", "none", "--quiet", cwd=tmp)
    cut = re.search(r"^│ \|-x +│ RRR +│ (\w+) ", inference, re.M).group(1)
    megatron = re.search(r"^Megatron baseline: (\S+ \w+) .*= ([\d.]+x) Megatron", inference, re.M)
    ours = re.search(r"^proved optimal: no plan costs less than (\S+ \w+) ", inference, re.M).group(1)
    trained = re.search(r"^Megatron baseline: .*; ours (\S+ \w+) \(\d+ ps\) = ([\d.]+x) Megatron", training, re.M)
    return {"llama-lines": str(len(llama.splitlines())), "slapo-totals": ", ".join(totals),
            "slapo-plan": ", ".join(f"`{module} {mode} {op}`" for module, mode, op in syncs),
            "mlp-x": f"`{cut}`, " + ("the batch of 8" if cut.startswith("S") else "the 1024 tokens"),
            "mlp-megatron": megatron.group(1), "mlp-ratio": megatron.group(2), "mlp-inference": ours,
            "mlp-training": f"{trained.group(1)}, {trained.group(2)} Megatron"}


def run_check(tmp: Path) -> dict[str, str]:
    """A training plan of the MLP on 2 devices run by torchrun: every line but the gradients after the first."""
    run("autoshard.solve", example("mlp"), "--mesh", "2", "--mode", "training", "--out", "plan.json", cwd=tmp)
    out = run("autoshard.run", example("mlp"), "--plan", "plan.json", cwd=tmp, torchrun=2)
    lines = out.splitlines()
    grads = [k for k, line in enumerate(lines) if line.startswith("  grad ")]
    lines = [line if k != grads[1] else "  ..." for k, line in enumerate(lines) if k not in grads[2:]]
    return {"run-mlp": "\n".join(lines) + "\n"}


def torchtitan_code(tmp: Path) -> dict[str, str]:
    """The LLaMA example with its loss under torchtitan's plan pinned: the exported code, the dict abridged."""
    sys.path.insert(0, str(ROOT))
    from tests.runtime.plans import megatron_pins, traced

    pins = megatron_pins(traced("llama+loss"), ("o_proj", "down_proj"))
    argv = [item for name, spec in pins.items() for item in ("--pin", f"{name}={spec}")]
    out = run("autoshard.solve", example("llama"), "--mesh", "2x2", "--mode", "training", "--quiet", "--tables", "none",
              *argv, cwd=tmp)
    code = out.split("PyTorch-native (torchtitan style):\n", 1)[1]
    code = code[code.index("def build_mesh"):code.index("plan written") if "plan written" in code else len(code)]
    lines = [line for line in code.splitlines() if not line.strip().startswith('"""')]
    styled = [k for k, line in enumerate(lines) if line.startswith('        "')]
    keep = set(styled[:1] + styled[-2:])
    lines = [line if k not in styled or k in keep else "        ..." for k, line in enumerate(lines)]
    lines = [line for k, line in enumerate(lines) if not (line == "        ..." and lines[k - 1] == line)]
    return {"torchtitan-code": "\n".join(lines).strip() + "\n"}


def training(tmp: Path) -> dict[str, str]:
    """20 steps of the LLaMA example on 2x2 with checkpoints; its step-10 checkpoint resumed on 2 ranks."""
    run("autoshard.solve", example("llama"), "--mesh", "2x2", "--mode", "training", "--out", "plan.json", cwd=tmp)
    out = run("autoshard.train", example("llama"), "--plan", "plan.json", "--steps", "20", "--lr", "3e-3",
              "--checkpoint", "ckpt", "--checkpoint-every", "10", cwd=tmp, torchrun=4)
    lines = out.splitlines()
    steps = {int(m.group(1)): line for line in lines if (m := re.match(r"step (\d+) ", line))}
    checkpoints = [line for line in lines if line.startswith("checkpoint ")]
    shown = [lines[0], steps[1], steps[2], "...", steps[10], checkpoints[0], "...", steps[20], checkpoints[-1]]
    uninterrupted = steps[11].split()[3]
    run("autoshard.solve", example("llama"), "--mesh", "2", "--mode", "training", "--out", "plan2.json", cwd=tmp)
    shutil.copytree(tmp / "ckpt" / "step_000010", tmp / "from10" / "step_000010")  # resume at step 10, not 20
    resumed = run("autoshard.train", example("llama"), "--plan", "plan2.json", "--steps", "12", "--lr", "3e-3",
                  "--checkpoint", "from10", "--resume", cwd=tmp, torchrun=2)
    again = next(line for line in resumed.splitlines() if line.startswith("step 11 ")).split()[3]
    return {"train": "\n".join(shown) + "\n",
            "resume-header": resumed.splitlines()[0].split(": ", 1)[1],
            "resume-step-11": f"{again} against {uninterrupted} uninterrupted"}


def mixtral(tmp: Path) -> dict[str, str]:
    """The Mixtral example pinned expert-parallel: the solve's summary lines and the run check, abridged."""
    out = run("autoshard.solve", example("mixtral"), "--mesh", "2x2", "--mode", "training", "--expert-parallel", "1",
              "--baseline", "torchtitan", "--quiet", "--tables", "none", "--out", "plan.json", cwd=tmp)
    keep = ("proved optimal", "torchtitan baseline", "expert parallel", "(tokens sent")
    solved = [line for line in out.splitlines() if line.startswith(keep)]
    checked = run("autoshard.run", example("mixtral"), "--plan", "plan.json", cwd=tmp, torchrun=4).splitlines()
    experts = next(line for line in checked if line.startswith("  grad model.layers.0.mlp.experts.gate_up_proj"))
    tail = [line for line in checked if line.startswith(("  largest", "  rank 0:", "  collectives"))]
    text = ["$ python -m autoshard.solve examples/mixtral.py --mesh 2x2 --mode training --expert-parallel 1 \\",
            "      --baseline torchtitan --quiet --tables none --out plan.json", "...", *solved, "...",
            "$ torchrun --nproc_per_node=4 -m autoshard.run examples/mixtral.py --plan plan.json", "...", experts,
            "  ...", tail[0], tail[1], "  ...", tail[2]]
    unpinned = run("autoshard.solve", example("mixtral"), "--mesh", "2x2", "--mode", "training", "--quiet",
                   "--tables", "none", cwd=tmp)
    if "all replicated" not in unpinned:
        raise RuntimeError("the README says the Mixtral toy's unpinned optimum replicates the experts; it no longer does")
    cost = re.search(r"^proved optimal: no plan costs less than (\S+ \w+) ", unpinned, re.M).group(1)
    run("autoshard.solve", example("mixtral"), "--mesh", "4", "--mode", "training", "--expert-parallel", "0",
        "--quiet", "--tables", "none", "--out", "plan4.json", cwd=tmp)
    ranks = run("autoshard.run", example("mixtral"), "--plan", "plan4.json", cwd=tmp, torchrun=4)
    sent = sorted(float(k) for k in re.findall(r"all_to_all \d+x ([\d.]+) KiB", ranks))
    return {"mixtral": "\n".join(text) + "\n", "mixtral-unpinned": cost,
            "mixtral-ep4": f"{sent[0]:g} to {sent[-1]:g} KiB"}


def recompute(tmp: Path) -> dict[str, str]:
    """LLaMA-3-8B on 8 H100s: the peak line; torchtitan's plan of the small LLaMA example on 2x2 (every layer
    recomputed, FSDP re-gathering): the line the CLI prints for a plan that recomputes and re-gathers."""
    from autoshard.api import build_model_problem
    from autoshard.problem.baselines.torchtitan import torchtitan_choice
    from autoshard.frontend.load import load_model
    from autoshard.frontend.trace import trace
    from autoshard.problem.readback import make_plan
    from autoshard.cli.report import fit_line

    big = run("autoshard.solve", example("llama3_8b"), "--mesh", "8", "--mode", "training", "--device", "h100",
              "--quiet", "--tables", "none", cwd=tmp)
    peak = next(line for line in big.splitlines() if line.startswith("peak memory per device"))
    loaded = load_model(example("llama"))
    mp = build_model_problem(trace(loaded.model, loaded.example_inputs), "2x2", mode="training",
                             memory_budget=10**15)  # a budget, so that recomputation is offered
    return {"recompute": f"{peak}\n{fit_line(make_plan(mp, torchtitan_choice(mp)))}\n"}


def pipeline(tmp: Path) -> dict[str, str]:
    """The small LLaMA example pipelined over the first axis of 2x2: the search and the stages' plans."""
    text = run("autoshard.solve", example("llama"), "--mesh", "2x2", "--pipeline", "0", "--mode", "training",
               "--microbatches", "2", "--quiet", cwd=tmp)
    return {"pipeline": text}


SESSIONS: dict[str, Callable[[Path], dict[str, str]]] = {
    "demo": demo, "solve-lines": solve_lines, "run-check": run_check, "torchtitan-code": torchtitan_code,
    "training": training, "mixtral": mixtral, "recompute": recompute, "pipeline": pipeline,
}
"""Each session's function returns the text of the README blocks and values it produces, by name."""


def generate(names: list[str]) -> dict[str, str]:
    """The texts of the named sessions, each run in its own scratch folder."""
    texts: dict[str, str] = {}
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            texts |= SESSIONS[name](Path(tmp))
    return texts


def rewrite(readme: str, texts: dict[str, str]) -> tuple[str, list[str]]:
    """``readme`` with the blocks and values of ``texts`` replaced; the names whose text changed
    (beyond timings) and those not found."""
    changed: list[str] = []
    found: set[str] = set()

    def replace(match: re.Match) -> str:
        name = match.group("name")
        if name not in texts:
            return match.group(0)
        found.add(name)
        if normalise(match.group("body")) != normalise(texts[name]):
            changed.append(name)
        return match.group(1) + texts[name] + match.group(len(match.groups()))

    readme = _BLOCK.sub(replace, readme)
    readme = _VALUE.sub(replace, readme)
    return readme, changed + [f"{name} (no marker)" for name in texts if name not in found]


def main(argv: list[str] | None = None) -> int:
    """Regenerate (or ``--check``) the README's sessions."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=sorted(SESSIONS), help="run only this session (repeatable)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a block differs")
    args = parser.parse_args(argv)
    text, changed = rewrite(README.read_text(), generate(args.only or list(SESSIONS)))
    if args.check:
        for name in changed:
            print(f"README.md: {name} differs from a fresh run (python docs/session.py --only ... rewrites it)")
        return 1 if changed else 0
    README.write_text(text)
    print(f"README.md: rewrote {', '.join(changed) or 'nothing (all blocks were current)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
