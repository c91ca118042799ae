"""Command-line entry points; argument parsing only."""

from __future__ import annotations

import argparse
import sys

from mpi_trainer.config import load_config
from mpi_trainer.errors import InputError


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="TOML hyper-parameter file")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set train.epochs=5 (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mpi-trainer",
                                     description="Data-parallel Keras training under mpirun.")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train (run under mpirun -n N, N >= 2)")
    _add_config_args(train)
    train.add_argument("--run-dir", help="directory for the run's files (default runs/<config>-<time>-<pid>-<random>, "
                       "or runs/<config>-slurm<job id> under Slurm); a directory holding an unfinished run "
                       "resumes it, one holding a complete run trains nothing unless more rounds are asked for")
    train.add_argument("--resume", action="store_true",
                       help="continue the run in --run-dir from its checkpoint (any number of workers); what "
                       "a directory holding a run does anyway, but refused without --run-dir")
    from mpi_trainer.launch.launcher import add_launch_parser

    add_launch_parser(commands, _add_config_args)
    preflight = commands.add_parser("preflight", help="under the job's mpirun line: check that every rank "
                                    "reaches the others and reads the data (prints a table)")
    _add_config_args(preflight)
    preflight.add_argument("--timeout", type=float, default=30.0,
                           help="seconds each step may take before the rank is named as failing")
    preflight.add_argument("--probe-mb", type=float, default=4.0,
                           help="megabytes sent to each worker and back to time its link to rank 0")
    check = commands.add_parser("check", help="validate a config without MPI (loads data, builds the model)")
    _add_config_args(check)
    check.add_argument("--workers", type=int, help="also check the data splits into this many blocks")
    report = commands.add_parser("report", help="write a run's plots and print its per-round table "
                                 "(works on a run still going or cut short)")
    report.add_argument("run_dir", help="the run directory (--run-dir of train)")
    report.add_argument("--no-plots", dest="plots", action="store_false", help="the table only, no PNGs")
    return parser


def run_report(run_dir: str, plots: bool) -> int:
    from mpi_trainer.reporting.report import make_report

    result = make_report(run_dir, plots)
    print(result.text, end="")
    for name in result.plots:
        print(f"plot: {result.png(name)}")
    return 0


def train(config: str, overrides: list[str], run_dir: str | None, resume: bool) -> int:
    """``train`` on every rank: :func:`mpi_trainer.fit` with the config file; a refused job exits 2."""
    from mpi_trainer.api import fit
    from mpi_trainer.errors import EXIT_INPUT_ERROR, EXIT_PREEMPTED, AgreedInputError, Preempted

    try:
        fit(config=config, overrides=overrides, run_dir=run_dir, resume=resume)
    except AgreedInputError:
        return EXIT_INPUT_ERROR  # every rank has printed the message
    except Preempted:
        return EXIT_PREEMPTED  # rank 0 has logged where the run stopped
    return 0


def main(argv: list[str] | None = None) -> int:
    from mpi_trainer.launch.console import quiet_backend, report_error
    from mpi_trainer.launch.launcher import split_command

    argv, program = split_command(sys.argv[1:] if argv is None else list(argv))
    args = build_parser().parse_args(argv)
    args.program = program
    quiet_backend()
    try:
        if args.command == "report":
            return run_report(args.run_dir, args.plots)
        if args.command == "train":
            return train(args.config, args.overrides, args.run_dir, args.resume)
        if args.command == "preflight":
            from mpi_trainer.launch.preflight import preflight

            return preflight(args.config, args.overrides, args.timeout, args.probe_mb)
        cfg = load_config(args.config, args.overrides)
        if args.command == "launch":
            from mpi_trainer.launch.launcher import launch

            return launch(args, cfg)
        if args.command == "check":
            from mpi_trainer.trainer.check import check

            print(f"{args.config}: OK: {check(cfg, args.workers)}")
            print(cfg.to_toml(), end="")
            return 0
        raise AssertionError(f"unhandled command {args.command!r}")
    except InputError as exc:
        return report_error(exc)


if __name__ == "__main__":
    sys.exit(main())
