"""The problem-file CLI path: progress lines, the solution list last, one-line errors."""

from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path

import pytest
from rich.console import Console

from autoshard.solver.model.iopddl import load_problem, parse_solution, write_problem
from autoshard.cli.problem_file import Clock, ProblemDisplay, add_solver_arguments, launch_time, run, solve_options
from autoshard.cli.progress import Heartbeat, LogLines
from autoshard.cli.solve import main
from autoshard.solver import EngineFailed, Phase, SolveOptions

from tests.solver.helpers import EXAMPLE, FakeClock, infeasible_beyond_the_smallest_peak_bound, needs_shared



def console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=60, force_terminal=False), out


@needs_shared
def test_run_prints_improvements_and_the_solution_last():
    con, out = console()
    assert run(str(EXAMPLE), 10.0, con) == 0
    lines = out.getvalue().strip().splitlines()
    assert any("cost 445" in line for line in lines)
    assert any(line.startswith("optimal: cost 445") for line in lines)
    choice = parse_solution(lines[-1], load_problem(EXAMPLE))
    assert load_problem(EXAMPLE).evaluate(choice).cost == 445


@needs_shared
def test_raw_z3_mode_prints_every_plan_and_the_unsat():
    con, out = console()
    run(str(EXAMPLE), None, con, options=SolveOptions(reduce=False, warm_start=False))
    text = out.getvalue()
    assert text.count("by z3") >= 2 and "UNSAT" in text


@needs_shared
def test_quiet_prints_only_the_solution():
    con, out = console()
    run(str(EXAMPLE), None, con, quiet=True)
    lines = out.getvalue().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("[")


@needs_shared
def test_long_solution_stays_on_one_line(tmp_path):
    data = json.loads(EXAMPLE.read_text())
    nodes = data["problem"]["nodes"]
    for key in ("intervals", "costs", "usages"):
        nodes[key] = nodes[key] * 20
    data["problem"]["edges"] = {"nodes": [], "costs": []}
    data["problem"]["usage_limit"] = None
    path = tmp_path / "wide.json"
    path.write_text(json.dumps(data))
    con, out = console()
    run(str(path), None, con)
    last = out.getvalue().strip().splitlines()[-1]
    assert len(parse_solution(last, load_problem(path))) == 100


@needs_shared
def test_main_reports_bad_files_in_one_line(tmp_path, capsys):
    path = tmp_path / "broken.json"
    path.write_text(EXAMPLE.read_text()[:200])
    assert main([str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "not valid JSON" in err


@needs_shared
def test_main_reports_infeasible_limits(tmp_path, capsys):
    data = json.loads(EXAMPLE.read_text())
    data["problem"]["usage_limit"] = 20
    path = tmp_path / "tight.json"
    path.write_text(json.dumps(data))
    assert main([str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "smallest achievable peak is 50" in err and "\n" not in err


def test_main_exits_2_saying_no_plan_fits_with_every_engine_on(tmp_path, capsys):
    path = tmp_path / "infeasible.json"
    write_problem(infeasible_beyond_the_smallest_peak_bound(), path)
    assert main([str(path), "--no-reduce"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no plan fits" in err and "\n" not in err


def test_solver_flags_override_base_options():
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout", type=float)
    add_solver_arguments(parser)
    args = parser.parse_args(["--no-reduce", "--no-warm-start", "--seed", "3", "--timeout", "5"])
    options = solve_options(args)
    assert (options.reduce, options.warm_start, options.prove, options.seed, options.timeout) == (False, False, True, 3, 5.0)
    base = SolveOptions(timeout=9.0, reduce=True, warm_start=True)
    assert solve_options(parser.parse_args([]), base) == base
    assert solve_options(parser.parse_args(["--no-prove"]), base).prove is False


def test_clock_counts_the_time_already_spent_and_keeps_a_reserve():
    now = FakeClock(now=1000.0)
    clock = Clock(60.0, 990.0, now)
    assert clock.solver_budget() == pytest.approx(60.0 - 10.0 - clock.reserve)
    assert clock.hard_deadline() < clock.started + 60.0
    assert Clock(None, 0.0).solver_budget() is None
    assert launch_time(now) == 1000.0  # in-process: counted from the call


@needs_shared
def test_run_with_most_of_the_limit_spent_still_prints_a_plan():
    con, out = console()
    run(str(EXAMPLE), 5.0, con, quiet=True, started=time.monotonic() - 4.9)
    assert out.getvalue().strip().startswith("[")


@needs_shared
def test_log_prints_one_line_per_plan_on_stderr_even_when_quiet(capsys, tmp_path):
    copy = tmp_path / "copy.json.gz"
    assert main([str(EXAMPLE), "--quiet", "--log", "--write-problem", str(copy)]) == 0
    out, err = capsys.readouterr()
    assert len(out.strip().splitlines()) == 1 and out.startswith("[")
    lines = err.strip().splitlines()
    assert any(" plan " in line for line in lines) and lines[-1].split()[1:4] == ["optimal", "445", "proved"]
    back, original = load_problem(copy), load_problem(EXAMPLE)
    assert back.num_nodes == original.num_nodes and back.edges == original.edges


@needs_shared
def test_gap_flag_is_checked_and_passed_on(capsys):
    parser = argparse.ArgumentParser()
    add_solver_arguments(parser)
    assert solve_options(parser.parse_args(["--gap", "0.01"])).gap == 0.01
    assert main([str(EXAMPLE), "--gap", "2"]) == 2
    assert "--gap 2 is not a relative gap" in capsys.readouterr().err


def test_model_cli_writes_its_problem_for_other_solvers(tmp_path, capsys):

    path = tmp_path / "mlp.json.gz"
    mlp = Path(__file__).resolve().parents[2] / "examples" / "mlp.py"
    assert main([str(mlp), "--mesh", "8", "--quiet", "--tables", "none", "--log",
                       "--write-problem", str(path)]) == 0
    out, err = capsys.readouterr()
    problem = load_problem(path)
    proved = err.strip().splitlines()[-1].split()
    assert proved[1] == "optimal" and "proved optimal" in out
    assert problem.num_nodes > 0 and problem.evaluate(problem.check_choice([0] * problem.num_nodes)).cost >= int(proved[2])


def test_log_prints_a_status_line_after_silence_and_stops_when_closed():
    clock = FakeClock()
    stream = io.StringIO()
    lines = LogLines(stream=stream, every=0.1, clock=clock)
    lines(Phase("lagrange", "TRW-S", 100.0))  # the solver's clock: 100 s in
    clock.now += 0.05
    assert not lines.heartbeat.tick() and stream.getvalue() == ""  # not yet silent for long enough
    for _ in range(2):
        clock.now += 0.1
        assert lines.heartbeat.tick()
    assert stream.getvalue().splitlines() == ["100.15s searching (lagrange): best - gap -",
                                              "100.25s searching (lagrange): best - gap -"]
    lines.close()
    clock.now += 1.0
    assert not lines.heartbeat.tick() and stream.getvalue().count("\n") == 2


def test_an_engine_failure_is_one_line_in_the_log_and_on_the_console():
    stream = io.StringIO()
    lines = LogLines(stream=stream, every=60.0)
    failure = EngineFailed("lagrange", "MemoryError: ", 12.5)
    lines(failure)
    lines.close()
    assert stream.getvalue() == "12.50s lagrange engine failed (MemoryError: ); the search goes on without it\n"
    console = Console(file=io.StringIO(), width=200)
    display = ProblemDisplay(console, None, every=60.0)
    display(failure)
    display.close()
    assert "lagrange engine failed (MemoryError: )" in console.file.getvalue()


def test_heartbeat_beats_only_after_silence():
    clock = FakeClock()
    beats: list[float] = []
    heart = Heartbeat(lambda: beats.append(clock.now), every=1.0, clock=clock)
    assert heart.thread is None  # a test's clock: the test ticks it
    for _ in range(10):  # something printed every 0.5 s: no beat
        clock.now += 0.5
        assert not heart.tick()
        heart.touch()
    silent_from = clock.now
    clock.now += 0.99
    assert not heart.tick()
    clock.now += 0.01
    assert heart.tick() and beats == [silent_from + 1.0]
    heart.stop()
    clock.now += 5.0
    assert not heart.tick()


def test_the_heartbeat_thread_ends_when_stopped():
    heart = Heartbeat(lambda: None, every=3600.0)
    assert heart.thread is not None and heart.thread.is_alive()
    heart.stop()
    heart.thread.join(60.0)  # a guard against a hang, not a measure
    assert not heart.thread.is_alive()


def test_display_without_a_terminal_prints_its_status_after_silence():
    con, out = console()
    clock = FakeClock()
    display = ProblemDisplay(con, None, every=0.1, clock=clock)
    display(Phase("lns", "neighbourhood search", 0.0))
    clock.now += 0.1
    assert display.heartbeat.tick() and "lns: best -  lower bound -" in out.getvalue()
    display.close()
    assert ProblemDisplay(Console(file=io.StringIO(), force_terminal=True), None).heartbeat.thread is None
