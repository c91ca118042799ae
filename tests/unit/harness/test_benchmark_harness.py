"""The benchmark harness without running a job: alternation, medians and ranges, JSON, the generated page."""

from __future__ import annotations

import json
import math

from benchmarks.harness import Comparison, Environment, Spread, SuiteResult, load_results, run_comparison
from benchmarks.report import number, render


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
    page = render(load_results(tmp_path))
    assert f"commit `{environment.commit}`" in page and "    python -m benchmarks run communication" in page
    assert "| average | 276,350 |" in page  # the same in every repeat: no range
    assert "| best | 2.5 [2–3] |" in page
    assert page.startswith("# Performance") and "## Communication" in page


def iter_figures(values):
    figures = iter(values)
    return lambda: {"bytes": next(figures)}


def test_numbers_keep_four_significant_digits():
    assert [number(x) for x in (0.0310, 2.78, 234.44, 3878301, float("nan"), "n/a")] == \
        ["0.031", "2.78", "234.4", "3,878,301", "n/a", "n/a"]
