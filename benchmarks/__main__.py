"""``python -m benchmarks``: run suites, or regenerate docs/performance.md from their results."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict

from benchmarks.harness import (
    Environment,
    SuiteResult,
    conclusions_of,
    load_average,
    prepared,
    run_comparison,
    save_conclusions,
    skip_reason,
)
from benchmarks.report import write_performance
from benchmarks.suites import SUITES


def run_suite(name: str, repeats: int, quick: bool) -> bool:
    """Run one suite and save its result; False (nothing run, nothing saved) where it cannot run here."""
    module = SUITES[name]
    reason = skip_reason(module)
    if reason:
        print(f"{name}: skipped: {reason}", flush=True)
        return False
    environment = Environment.here()
    print(f"{name}: {module.QUESTION} (load average {environment.load_average})", flush=True)
    with prepared(module):
        tables = [run_comparison(comparison, repeats, lambda line: print(line, flush=True))
                  for comparison in module.comparisons(quick)]
    environment.load_average_end = load_average()
    conclusions = conclusions_of(module, [asdict(table) for table in tables])
    path = SuiteResult(name, module.QUESTION, environment, tables, conclusions).save()
    print(f"{name}: results in {path}", flush=True)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="the suites and their questions")
    run = commands.add_parser("run", help="run suites (all by default) and save their results")
    run.add_argument("suites", nargs="*", default=[], metavar="SUITE", help=f"any of {', '.join(SUITES)}")
    run.add_argument("--repeats", type=int, default=3, help="alternating repeats of every variant")
    run.add_argument("--quick", action="store_true", help="smaller models and fewer rounds")
    commands.add_parser("conclude", help="draw the saved results' conclusions again from their tables")
    commands.add_parser("docs", help="regenerate docs/performance.md from benchmarks/results")
    args = parser.parse_args(argv)
    if args.command == "list":
        for name, module in SUITES.items():
            reason = skip_reason(module)
            print(f"{name:<14} {module.QUESTION}" + (f" (cannot run here: {reason})" if reason else ""))
    elif args.command == "run":
        unknown = sorted(set(args.suites) - set(SUITES))
        if unknown:
            parser.error(f"unknown suites {unknown}; expected any of {list(SUITES)}")
        for name in args.suites or SUITES:
            run_suite(name, args.repeats, args.quick)
    elif args.command == "conclude":
        for path in save_conclusions(SUITES):
            print(path)
    else:
        print(write_performance())
    return 0


if __name__ == "__main__":
    sys.exit(main())
