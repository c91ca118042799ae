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
    train.add_argument("--run-dir", help="directory for the run's files (default runs/<config>-<time>)")
    train.add_argument("--resume", action="store_true",
                       help="continue the run in --run-dir from its checkpoint (any number of workers)")
    from mpi_trainer.launch import add_launch_parser

    add_launch_parser(commands, _add_config_args)
    check = commands.add_parser("check", help="validate a config without MPI (loads data, builds the model)")
    _add_config_args(check)
    check.add_argument("--workers", type=int, help="also check the data splits into this many blocks")
    return parser


def main(argv: list[str] | None = None) -> int:
    from mpi_trainer.job import quiet_backend, report_error

    args = build_parser().parse_args(argv)
    quiet_backend()
    try:
        if args.command == "train":
            from mpi_trainer.job import train

            return train(args.config, args.overrides, args.run_dir, args.resume)
        cfg = load_config(args.config, args.overrides)
        if args.command == "launch":
            from mpi_trainer.launch import launch

            return launch(args, cfg)
        if args.command == "check":
            from mpi_trainer.job import check

            print(f"{args.config}: OK: {check(cfg, args.workers)}")
            print(cfg.to_toml(), end="")
            return 0
        raise AssertionError(f"unhandled command {args.command!r}")
    except InputError as exc:
        return report_error(exc)


if __name__ == "__main__":
    sys.exit(main())
