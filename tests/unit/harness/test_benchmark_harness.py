"""The benchmark harness without running a job: alternation, medians and ranges, JSON, the generated page."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import pytest

from benchmarks.harness import (
    Comparison,
    Environment,
    Spread,
    SuiteResult,
    conclusions_of,
    load_results,
    run_comparison,
    save_conclusions,
)
from benchmarks.jobs import epochs_to, seeded, time_to
from benchmarks.report import cell, number, render
from benchmarks.suites import SUITES


def test_variants_alternate_and_each_figure_gets_its_median_and_range():
    calls = []

    def variant(name, values):
        figures = iter(values)
        return lambda: calls.append(name) or {"seconds": next(figures)}

    variants = {"a": variant("a", [3.0, 1.0, 2.0]), "b": variant("b", [5.0, 9.0, 7.0])}
    table = run_comparison(Comparison("t", "cmd", variants, {"seconds": "s"}), repeats=3, log=lambda line: None)
    assert calls == ["a", "b", "a", "b", "a", "b"]  # A, B, A, B...: a change in load hits both alike
    assert table.rows["a"]["seconds"] == Spread(2.0, 1.0, 3.0, [3.0, 1.0, 2.0])
    assert table.rows["b"]["seconds"] == Spread(7.0, 5.0, 9.0, [5.0, 9.0, 7.0])


def test_a_missing_or_nan_figure_is_left_out_of_the_median():
    spread = Spread.of([float("nan"), 4.0, 2.0])
    assert (spread.median, spread.low, spread.high) == (3.0, 2.0, 4.0)
    assert math.isnan(Spread.of([float("nan")]).median)  # nothing measured stays unmeasured


def test_a_saved_result_carries_its_environment_and_renders_with_commit_and_command(tmp_path):
    environment = Environment.here()
    table = run_comparison(Comparison("Bytes per round", "python -m benchmarks run communication",
                                      {"average": lambda: {"bytes": 276350.0}, "best": iter_figures([2.0, 3.0])},
                                      {"bytes": "bytes/round"}),
                           repeats=2, log=lambda line: None)
    path = SuiteResult("communication", "q", environment, [table]).save(tmp_path)
    saved = json.loads(path.read_text())
    assert saved["environment"]["cores"] >= 1 and saved["environment"]["versions"]["python"]
    environment.load_average_end = [9.5, 4.0, 2.0]
    page = render(load_results(tmp_path))
    assert "→ 9.5/4.0/2.0" not in page  # saved before the end was known
    page = render([{**saved, "environment": {**saved["environment"], "load_average_end": [9.5, 4.0, 2.0]}}])
    assert "→ 9.5/4.0/2.0" in page
    assert f"Commit `{environment.commit}`" in page
    assert "Reproduce with `python -m benchmarks run communication`" in page
    assert "| average | 276,350 |" in page  # the same in every repeat: no range
    assert "| best | 2.5 [2–3] |" in page
    assert page.startswith("# Performance") and "## Communication" in page


def iter_figures(values):
    figures = iter(values)
    return lambda: {"bytes": next(figures)}


def test_numbers_keep_four_significant_digits():
    assert [number(x) for x in (0.0310, 2.78, 234.44, 3878301, float("nan"), "n/a")] == \
        ["0.031", "2.78", "234.4", "3,878,301", "n/a", "n/a"]


def test_list_names_every_suite_and_says_which_cannot_run_here(capsys, monkeypatch):
    from benchmarks import __main__ as cli
    from benchmarks.suites import gpu

    monkeypatch.setattr(gpu, "gpu_names", lambda: [])
    assert cli.main(["list"]) == 0
    listed = capsys.readouterr().out
    for name in ("throughput", "accuracy", "schedules", "transport", "bandwidth", "keras_fit", "lbfgs", "gpu",
                 "run_directory", "scaling", "stragglers"):
        assert f"\n{name} " in f"\n{listed}", name
    assert "gpu" in listed and "cannot run here: no GPU" in listed


def test_a_suite_that_cannot_run_here_is_skipped_and_saves_nothing(capsys, monkeypatch, tmp_path):
    from benchmarks import __main__ as cli
    from benchmarks.suites import bandwidth, gpu

    monkeypatch.setattr(gpu, "gpu_names", lambda: [])
    monkeypatch.setattr(bandwidth.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(cli.SuiteResult, "save", lambda self, folder=tmp_path: pytest.fail("nothing may be saved"))
    assert cli.run_suite("gpu", repeats=1, quick=True) is False
    assert cli.run_suite("bandwidth", repeats=1, quick=True) is False
    out = capsys.readouterr().out
    assert "gpu: skipped: no GPU" in out and "bandwidth: skipped: simulated hosts need root" in out
    assert cli.main(["run", "gpu"]) == 0  # a skipped suite is not an error: `run` with no names runs the rest


def test_every_comparison_names_the_command_of_its_own_suite():
    for name, module in SUITES.items():
        for comparison in module.comparisons(quick=True):
            assert comparison.command.startswith(f"python -m benchmarks run {name}"), (name, comparison.command)
            assert comparison.variants and comparison.columns


def test_every_saved_table_is_reproduced_by_a_harness_suite():
    """Every figure in docs/performance.md names the suite that measures it, and the commit it was measured at."""
    for result in load_results():
        assert result["suite"] in SUITES, result["suite"]
        for table in result["tables"]:
            command = table["command"]
            assert command.split()[:5] == ["python", "-m", "benchmarks", "run", result["suite"]], command
        assert result["environment"]["commit"] and not result.get("carried")


def test_conclusions_are_drawn_from_the_tables_saved_and_rendered_under_them(tmp_path):
    """A suite's conclusions are sentences built from its own figures: a result measured again concludes
    from the new figures, and the page prints what the result file holds, under its tables."""
    def outer(epochs, seconds):
        return {"epochs_to": asdict(Spread.of(epochs)), "seconds_to": asdict(Spread.of(seconds))}

    title = "MLP on digits, 2 workers; target test accuracy 0.95"
    rows = {"1 local epoch, outer `none`": outer([4.0, 4.0, math.inf], [2.0, 2.0, math.inf]),
            "1 local epoch, outer `nesterov`": outer([3.0, 3.0, 5.0], [1.0, 1.0, 1.5])}
    table = {"title": title, "command": "python -m benchmarks run schedules", "columns": {}, "rows": rows,
             "repeats": 3, "notes": ""}
    (concluded,) = conclusions_of(SUITES["schedules"], [table])
    assert "reached it in 3 of 3 seeds, after 3 local epochs, 0.50x the time" in concluded
    assert "reached it in 2 of 3 seeds, after 4 local epochs" in concluded
    rows["1 local epoch, outer `nesterov`"] = outer([6.0, 6.0, 6.0], [4.0, 4.0, 4.0])  # measured again
    assert "2.00x the time" in conclusions_of(SUITES["schedules"], [table])[0]
    assert conclusions_of(SUITES["faults"], [table]) == []  # a suite without conclude concludes nothing

    result = asdict(SuiteResult("schedules", "Q", Environment.here(), [], []))
    result["tables"] = [table]
    (tmp_path / "schedules.json").write_text(json.dumps(result))
    assert save_conclusions(SUITES, tmp_path) == [tmp_path / "schedules.json"]
    assert save_conclusions(SUITES, tmp_path) == []  # nothing changed the second time
    saved = load_results(tmp_path)
    page = render(saved)
    assert page.index("Settled by these figures:") > page.index(title) and saved[0]["conclusions"][0] in page


def test_seeded_variants_get_seed_n_on_repeat_n_and_targets_compare_at_float32_precision():
    seen = []
    variant = seeded(lambda seed: seen.append(seed) or {"seed": float(seed)})
    run_comparison(Comparison("t", "cmd", {"a": variant}, {"seed": "seed"}), repeats=3, log=lambda line: None)
    assert seen == [0, 1, 2]
    points = [(1.0, 0.9), (2.0, 0.9599999785), (3.0, 0.97)]
    assert time_to(points, 0.96) == 2.0 and math.isinf(time_to(points, 0.99))
    assert epochs_to([(5.0, 0.9), (9.0, 0.9599999785)], 0.96) == 2.0 and math.isinf(epochs_to(points, 0.99))
    # a seed that misses the target counts as longer than any that reaches it, and reads so on the page
    assert Spread.of([time_to(points, 0.99), 2.0, 3.0]).median == 3.0
    assert Spread.of([math.inf, math.inf, 2.0]).median == math.inf and number(math.inf) == "not reached"
    assert cell(asdict(Spread.of([math.inf, 2.0, math.inf]))) == "not reached (1 of 3 reached it: 2)"
    assert cell(asdict(Spread.of([12.0, 10.0, math.inf]))) == "12 (2 of 3 reached it: 10–12)"
    assert cell(asdict(Spread.of([6.0, 6.0, math.inf]))) == "6 (2 of 3 reached it: 6)"


def test_a_run_on_another_keras_backend_is_kept_beside_the_tensorflow_run_and_says_so(tmp_path, monkeypatch):
    table = run_comparison(Comparison("Scaling", "python -m benchmarks run scaling", {"one": lambda: {"s": 1.0}},
                                      {"s": "s"}), repeats=1, log=lambda line: None)
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    tensorflow = SuiteResult("scaling", "q", Environment.here(), [table]).save(tmp_path)
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    jax = SuiteResult("scaling", "q", Environment.here(), [table]).save(tmp_path)
    assert (tensorflow.name, jax.name) == ("scaling.json", "scaling-jax.json")
    page = render(load_results(tmp_path))
    section = page[page.index("## Scaling"):]
    assert section.count("### Scaling") == 2 and section.count("Keras backend jax") == 1
    assert section.index("Keras backend jax") > section.index("### Scaling")  # the TensorFlow run first
    assert "Reproduce with `KERAS_BACKEND=jax python -m benchmarks run scaling`." in section


def test_comparisons_of_one_run_that_share_their_columns_render_as_one_table_headed_by_each_title():
    def table(title, value):
        return {"title": title, "command": "python -m benchmarks run survive", "columns": {"s": "s added"},
                "rows": {"survive": {"s": {"median": value, "low": value, "high": value, "runs": [value]}}},
                "notes": "The target: one round."}

    environment = {**asdict(Environment.here()), "commit": "abc1234"}
    page = render([{"suite": "survive", "question": "q", "environment": environment,
                    "tables": [table("Killed in round 3: LeNet, 3 workers", 0.5),
                               table("Killed in round 3: MLP, 3 workers", 0.25)]}])
    assert page.count("| | s added |") == 1 and page.count("The target: one round.") == 1
    assert "### Killed in round 3\n" in page
    assert "| **Killed in round 3: LeNet, 3 workers** | |" in page and "| survive | 0.25 |" in page
