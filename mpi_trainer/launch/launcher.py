"""``mpi-trainer launch``: the command line around the :class:`~.supervisor.Supervisor`.

It supervises a config (``launch -n N CONFIG [--set ...]``, run as ``train``) or
any script that calls :func:`mpi_trainer.fit` (``launch -n N [--set ...] -- python train.py``;
the script's ``fit`` applies the ``--set`` values after its own ``config`` and ``overrides``,
read from ``MPI_TRAINER_SET``).
It holds the run directory's lock for the whole supervised run (its jobs' rank 0
works under it, told by ``MPI_TRAINER_LAUNCHER``), so a second launcher or job on
the directory is refused at once; a script's ``fit`` finds the directory in
``MPI_TRAINER_RUN_DIR``. Running the same command again after an interruption
resumes the run; after a complete run it trains nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mpi_trainer.config import Config
from mpi_trainer.errors import ConfigError
from mpi_trainer.launch.mpirun import mpirun_command
from mpi_trainer.launch.run_dir import RUN_DIR_ENV, SET_ENV, default_run_dir
from mpi_trainer.launch.supervisor import (
    HOST_FAILURES_TO_DROP,
    AttemptHosts,
    Failure,
    Supervisor,
    check_hosts_resolve,
    host_dropper,
    read_machinefile,
)
from mpi_trainer.persistence.run_files import ROUNDS_NAME, SUMMARY_NAME, write_json_atomic
from mpi_trainer.persistence.run_lock import LAUNCHER_ENV, RunLock, holder_id

FORWARDED_BY_MPIRUN = ("SIGUSR1", "SIGUSR2")  # Open MPI's mpirun passes these on to every rank


def add_launch_parser(commands: Any, add_config_args: Callable[[argparse.ArgumentParser], None]) -> None:
    launch = commands.add_parser("launch", help="run the job under mpirun and restart it with --resume "
                                               "when it dies or stalls (a config, or -- COMMAND...)")
    launch.add_argument("config", nargs="?", help="TOML hyper-parameter file (or give a command after --)")
    launch.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set train.epochs=5 (repeatable)")
    launch.add_argument("-n", "--np", dest="ranks", type=int, required=True,
                        help="ranks: 1 scheduler + workers")
    launch.add_argument("--machinefile", help="Open MPI hostfile")
    launch.add_argument("--max-restarts", type=int, default=3, help="restarts allowed (default 3)")
    launch.add_argument("--run-dir", help="directory for the run's files (default runs/<config>-<time>-<pid>-"
                                          "<random>, or runs/<config>-slurm<job id> under Slurm)")
    launch.add_argument("--mpirun-args", default="", help="extra mpirun options, one string, e.g. "
                                                          "'--mca btl_tcp_if_include eth0'")
    launch.add_argument("--drop-failed-hosts", action="store_true",
                        help=f"leave out a host named in {HOST_FAILURES_TO_DROP} failures and restart "
                             f"with fewer workers")


def split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """``launch ... -- python train.py`` -> (the launcher's arguments, the command it supervises)."""
    if argv[:1] == ["launch"] and "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1:]
    return argv, []


def train_args(args: argparse.Namespace, run_dir: Path, resume: bool) -> list[str]:
    sets = [part for text in args.overrides for part in ("--set", text)]
    return ["train", args.config, *sets, "--run-dir", str(run_dir), *(["--resume"] if resume else [])]


def check_args(args: argparse.Namespace) -> None:
    if args.ranks < 2:
        raise ConfigError(f"`-n` must be >= 2 (one scheduler and at least one worker). "
                          f"Received: -n {args.ranks}")
    if args.max_restarts < 0:
        raise ConfigError(f"`--max-restarts` must be >= 0. Received: --max-restarts {args.max_restarts}")
    if args.machinefile and not Path(args.machinefile).is_file():
        raise ConfigError(f"`--machinefile` must name an existing file. Received: --machinefile "
                          f"{args.machinefile!r}")
    if args.machinefile:
        read_machinefile(Path(args.machinefile))  # a malformed line fails here, named, before any job
        check_hosts_resolve(Path(args.machinefile), getattr(args, "mpirun_args", ""))
    program = getattr(args, "program", [])
    if bool(args.config) == bool(program):
        raise ConfigError(f"`launch` supervises a config or a command after `--`, one of them. Received: "
                          f"config={args.config!r}, command={program!r}; expected e.g. `launch -n 3 "
                          f"configs/quickstart.toml` or `launch -n 3 -- python train.py`")


def job_command(args: argparse.Namespace, hosts: AttemptHosts, run_dir: Path,
                fault_tolerant: bool = False) -> Callable[[int], list[str]]:
    """Each attempt's mpirun line; the job learns the launcher and the run directory from its environment."""
    program = getattr(args, "program", [])
    sets = ["-x", SET_ENV] if program and args.overrides else []  # the script's fit() reads them
    extra = ["-x", LAUNCHER_ENV, "-x", RUN_DIR_ENV, *sets, *shlex.split(args.mpirun_args)]

    def command_for(attempt: int) -> list[str]:
        train = [] if program else train_args(args, run_dir, attempt > 0)
        return mpirun_command(hosts.ranks, train, hosts.machinefile, extra, fault_tolerant,
                              program=program or None)

    return command_for


def launch(args: argparse.Namespace, cfg: Config) -> int:
    """Entry for ``mpi-trainer launch``; returns the exit status."""
    check_args(args)
    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(args.config)
    lock = RunLock(run_dir).acquire()  # a second launcher or job on this directory fails here
    os.environ[LAUNCHER_ENV], os.environ[RUN_DIR_ENV] = holder_id(), str(run_dir)
    if getattr(args, "program", []) and args.overrides:  # checked here already (cfg): the script's fit applies them
        os.environ[SET_ENV] = json.dumps(args.overrides)
    hosts = AttemptHosts(args.ranks, args.machinefile)
    supervisor = Supervisor(job_command(args, hosts, run_dir, cfg.fault.survive), run_dir / ROUNDS_NAME,
                            cfg.watchdog.stall_seconds, args.max_restarts, run_dir / "launch.log")
    if args.drop_failed_hosts:
        supervisor.on_failure = host_dropper(hosts, run_dir, supervisor.log)
    if not cfg.checkpoint.every and not cfg.checkpoint.every_seconds:
        supervisor.log("checkpoint.every = 0 and checkpoint.every_seconds = 0: a restart resumes from the "
                       "last finished run's checkpoint only, or starts over")
    listen_for_preemption(supervisor, cfg)
    try:
        status = supervisor.run()
        record_restarts(run_dir / SUMMARY_NAME, supervisor.failures)  # still under the lock
        return status
    except KeyboardInterrupt:
        supervisor.log("interrupted; the job was ended")
        return 128 + signal.SIGINT
    finally:
        lock.release()


def listen_for_preemption(supervisor: Supervisor, cfg: Config) -> None:
    """SIGTERM and the configured preemption signals: the job checkpoints and every process exits 75.

    The job runs in its own session, out of reach of the terminal's Ctrl-C; SIGINT still ends
    it at once (run_once's cleanup)."""
    signals = cfg.checkpoint.preempt_signals
    forwarded = next((name for name in signals if name in FORWARDED_BY_MPIRUN), None)
    supervisor.forward_signal = signal.Signals[forwarded] if forwarded else None
    supervisor.grace_seconds = cfg.checkpoint.grace_seconds
    for name in sorted({"SIGTERM", *signals} - {"SIGINT"}):
        signal.signal(signal.Signals[name], lambda signum, frame: supervisor.preempt(signal.Signals(signum).name))


def record_restarts(summary_path: Path, failures: list[Failure]) -> None:
    """Add each restart's cause to the job's summary.json (the supervisor writes it after the job ends);
    a run launched more than once keeps the causes of every launch."""
    if not failures or not summary_path.exists():
        return
    summary = json.loads(summary_path.read_text())
    summary["restarts"] = list(summary.get("restarts", [])) + [
        {"cause": f.cause, "returncode": f.returncode, "hosts": f.hosts} for f in failures]
    write_json_atomic(summary_path, summary)
