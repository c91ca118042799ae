"""The supervising launcher without MPI: restarts on death, stall detection, host dropping, arguments."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from mpi_trainer.algorithms import wait_bounds
from mpi_trainer.cli import main
from mpi_trainer.errors import ConfigError
from mpi_trainer.launch.supervisor import (
    AttemptHosts,
    Failure,
    Supervisor,
    drop_host,
    host_dropper,
    hosts_named,
    read_machinefile,
)


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_dead_attempt_is_restarted_with_its_cause_logged(tmp_path):
    progress, log = tmp_path / "rounds.csv", tmp_path / "launch.log"
    attempts = []

    def command_for(attempt: int) -> list[str]:
        attempts.append(attempt)
        return _python("import sys; sys.exit(1)" if attempt == 0 else "print('fine')")

    supervisor = Supervisor(command_for, progress, stall_seconds=0, max_restarts=2, log_file=log)
    assert supervisor.run() == 0
    assert attempts == [0, 1]
    assert [f.returncode for f in supervisor.failures] == [1]
    text = log.read_text()
    assert "restarting with --resume (restart 1 of 2) after: the job exited with status 1" in text
    assert "attempt 2 completed" in text


def test_stalled_attempt_is_killed_within_stall_seconds_and_restarts_run_out(tmp_path):
    progress = tmp_path / "rounds.csv"
    hang = _python(f"import time; open({str(progress)!r}, 'a').write('header'); time.sleep(120)")
    supervisor = Supervisor(lambda attempt: hang, progress, stall_seconds=1.5, max_restarts=1,
                            log_file=tmp_path / "launch.log")
    started = time.monotonic()
    assert supervisor.run() == 1
    assert time.monotonic() - started < 2 * (1.5 + 5)  # two attempts, each ended soon after its stall
    assert [f.cause for f in supervisor.failures] == [
        "stalled: no new round in rounds.csv for 1.5 s (watchdog.stall_seconds)"] * 2
    assert "giving up after 1 restarts" in (tmp_path / "launch.log").read_text()


def test_by_default_a_job_that_stops_writing_rounds_is_ended_but_one_still_starting_is_not(tmp_path, monkeypatch):
    monkeypatch.setattr(wait_bounds, "ROUND_FLOOR", 0.5)  # the derived bound, scaled down: 3 x the
    monkeypatch.setattr(wait_bounds, "ROUND_MULTIPLE", 1.0)  # longest gap (here set-up's ~3 s), >= 1.5 s
    progress = tmp_path / "rounds.csv"
    row = f"open({str(progress)!r}, 'a').write('row\\n')"
    # attempt 0: 3 s of set-up with no row (not a stall), two rounds 0.1 s apart, then a hang;
    # attempt 1 (the restart) finishes
    hang = _python(f"import time; time.sleep(3); {row}; time.sleep(0.1); {row}; time.sleep(120)")
    attempts = [hang, _python("print('resumed')")]
    supervisor = Supervisor(lambda attempt: attempts[attempt], progress, stall_seconds=0, max_restarts=1)
    started = time.monotonic()
    assert supervisor.run() == 0
    assert time.monotonic() - started < 40
    (failure,) = supervisor.failures
    assert failure.cause.startswith("stalled: no new round in rounds.csv for ") and "the default" in failure.cause


def test_a_supervised_script_may_go_on_working_after_its_run_is_complete(tmp_path, monkeypatch):
    monkeypatch.setattr(wait_bounds, "ROUND_FLOOR", 0.2)
    monkeypatch.setattr(wait_bounds, "ROUND_MULTIPLE", 1.0)
    progress, summary = tmp_path / "rounds.csv", tmp_path / "summary.json"
    script = (f"import time; open({str(progress)!r}, 'a').write('row\\n'); "
              f"open({str(summary)!r}, 'w').write('{{\"completed\": true}}'); time.sleep(0.1); "
              f"open({str(progress)!r}, 'a').write('row\\n'); time.sleep(4)")
    supervisor = Supervisor(lambda attempt: _python(script), progress, stall_seconds=0, max_restarts=0)
    assert supervisor.run() == 0 and supervisor.failures == []


def test_bad_input_is_not_retried(tmp_path):
    supervisor = Supervisor(lambda attempt: _python("import sys; sys.exit(2)"), tmp_path / "rounds.csv", 0, 3)
    assert supervisor.run() == 2
    assert len(supervisor.failures) == 1


def test_failure_output_names_hosts():
    lines = ["mpi_trainer: error: watchdog: worker rank 2 on host node-b did not report round 3 within",
             "prterun noticed that process rank 1 with PID 4242 on node node-c exited on signal 9 (Killed).",
             "worker rank 1 on host node-b again"]
    assert hosts_named(lines) == ["node-b", "node-c"]


def test_host_failing_twice_is_dropped_from_the_machinefile(tmp_path):
    machinefile = tmp_path / "hosts"
    machinefile.write_text("# lab\nnode-a slots=2\nnode-b slots=2\nnode-c\n")
    assert read_machinefile(machinefile) == [("node-a", 2), ("node-b", 2), ("node-c", 1)]
    assert drop_host(read_machinefile(machinefile), "node-b", 5) == ([("node-a", 2), ("node-c", 1)], 3)
    hosts, messages = AttemptHosts(5, str(machinefile)), []
    on_failure = host_dropper(hosts, tmp_path, messages.append)
    on_failure(Failure("died", 1, hosts=["node-b"]))
    assert hosts.ranks == 5 and hosts.machinefile == str(machinefile)
    on_failure(Failure("died", 1, hosts=["node-b"]))
    assert hosts.ranks == 3
    assert Path(hosts.machinefile).read_text() == "node-a slots=2\nnode-c slots=1\n"
    assert "host node-b failed 2 times: dropped" in messages[0]


@pytest.mark.parametrize("args, message", [
    (["-n", "1"], "`-n` must be >= 2 (one scheduler and at least one worker). Received: -n 1"),
    (["-n", "3", "--max-restarts", "-1"], "`--max-restarts` must be >= 0. Received: --max-restarts -1"),
    (["-n", "3", "--machinefile", "/nonexistent/hosts"], "`--machinefile` must name an existing file"),
])
def test_launch_refuses_bad_arguments(args, message, capsys):
    assert main(["launch", *args, "configs/quickstart.toml"]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("line", ["node-b slots=two", "node-b slots=0", "node-b slots="])
def test_launch_names_the_machinefile_line_with_a_bad_slot_count(tmp_path, line, capsys):
    machinefile = tmp_path / "hosts"
    machinefile.write_text(f"# lab\nnode-a slots=2\n{line}\n")
    assert main(["launch", "-n", "3", "--machinefile", str(machinefile), "configs/quickstart.toml"]) == 2
    err = capsys.readouterr().err
    assert f"{machinefile}, line 3: `{line.split()[1]}` is not a slot count. Received: {line!r}; expected " \
           "'HOST slots=N' with N a positive integer" in err
    assert "Traceback" not in err


def test_terminating_the_launcher_passes_the_preemption_on_and_leaves_nothing_running(tmp_path):
    """SIGTERM to the launcher: the job (in its own session) gets SIGUSR1, ends, and the launcher exits 75."""
    import os
    import signal
    import subprocess

    import psutil

    script = tmp_path / "sleepy.py"
    script.write_text("import time\ntime.sleep(120)\n")  # SIGUSR1's default action ends it
    code = (
        "import sys, signal\n"
        "from pathlib import Path\n"
        "from mpi_trainer.launch.supervisor import Supervisor\n"
        f"command = [sys.executable, {str(script)!r}]\n"
        f"supervisor = Supervisor(lambda a: command, Path({str(tmp_path)!r}) / 'r.csv', 0, 2)\n"
        "signal.signal(signal.SIGTERM, lambda s, f: supervisor.preempt('SIGTERM'))\n"
        "sys.exit(supervisor.run())\n"
    )
    launcher = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 30
    children: list = []
    while time.monotonic() < deadline and not children:
        children = psutil.Process(launcher.pid).children(recursive=True)
        time.sleep(0.1)
    assert children, "the job never started"
    time.sleep(0.5)
    os.kill(launcher.pid, signal.SIGTERM)
    assert launcher.wait(timeout=30) == 75  # preempted, not restarted
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive


@pytest.mark.parametrize(("args", "message"), [
    (["launch", "-n", "3"], "a config or a command after `--`, one of them"),
    (["launch", "-n", "3", "configs/quickstart.toml", "--", "python", "t.py"], "one of them"),
    (["launch", "-n", "3", "--set", "train.epoch=2", "--", "python", "t.py"], "train.epoch"),  # checked at once
])
def test_launch_takes_a_config_or_a_command(args, message, capsys):
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_a_supervised_script_runs_under_mpirun_knowing_the_launcher_and_the_run_directory(tmp_path):
    import argparse

    from mpi_trainer.launch.launcher import job_command, split_command

    argv, program = split_command(["launch", "-n", "3", "--run-dir", "d", "--", "python", "train.py", "--lr", "1"])
    assert argv == ["launch", "-n", "3", "--run-dir", "d"] and program == ["python", "train.py", "--lr", "1"]
    args = argparse.Namespace(mpirun_args="--mca btl self,tcp", program=program, config=None, overrides=[])
    command = job_command(args, AttemptHosts(3, None), tmp_path)(1)
    assert command[-4:] == program  # run again as it is: the script's fit resumes by itself
    assert "-x MPI_TRAINER_LAUNCHER -x MPI_TRAINER_RUN_DIR --mca btl self,tcp" in " ".join(command)


def test_a_supervised_scripts_fit_takes_the_launchers_settings_after_its_own(tmp_path, monkeypatch):
    import argparse

    from mpi_trainer.api import _with_launch_overrides
    from mpi_trainer.launch.launcher import job_command
    from mpi_trainer.launch.run_dir import SET_ENV

    args = argparse.Namespace(mpirun_args="", program=["python", "train.py"], config=None,
                              overrides=["aggregation.ssp=2"])
    command = " ".join(job_command(args, AttemptHosts(3, None), tmp_path)(0))
    assert f"-x {SET_ENV}" in command  # mpirun passes the settings on to every rank
    monkeypatch.setenv(SET_ENV, '["aggregation.ssp=2", "train.epochs=4"]')
    assert _with_launch_overrides({"train.epochs": 2}) == [("train.epochs", 2), "aggregation.ssp=2", "train.epochs=4"]
    assert _with_launch_overrides(None) == ["aggregation.ssp=2", "train.epochs=4"]
    monkeypatch.setenv(SET_ENV, '{"train.epochs": 4}')
    with pytest.raises(ConfigError, match=SET_ENV):
        _with_launch_overrides(None)
    monkeypatch.delenv(SET_ENV)
    assert _with_launch_overrides(None) is None


def test_a_second_launcher_on_a_run_directory_in_use_is_refused_naming_the_holder(tmp_path, capsys):
    import os

    from mpi_trainer.persistence.run_lock import RunLock

    holder = RunLock(tmp_path / "busy").acquire()
    try:
        assert main(["launch", "-n", "3", "configs/quickstart.toml", "--run-dir", str(tmp_path / "busy")]) == 2
    finally:
        holder.release()
    assert f"in use by another job: host {os.uname().nodename} pid {os.getpid()}" in capsys.readouterr().err


def test_launch_names_a_machinefile_host_that_does_not_resolve_before_mpirun(tmp_path, capsys):
    machinefile = tmp_path / "hosts"
    machinefile.write_text("localhost slots=2\nno-such-node.invalid slots=2\n")
    assert main(["launch", "-n", "3", "--machinefile", str(machinefile), "configs/quickstart.toml"]) == 2
    err = capsys.readouterr().err
    assert "names host(s) that do not resolve" in err and "['no-such-node.invalid']" in err
    assert "Could not resolve hostname" not in err  # refused by launch itself, before mpirun ran
    # a launch agent of mpirun's own may reach hosts this machine cannot resolve: not refused for that
    from mpi_trainer.launch.supervisor import check_hosts_resolve
    check_hosts_resolve(machinefile, "--prtemca plm_ssh_agent /opt/agent.sh")


@pytest.mark.parametrize("user, kept, dropped", [
    ("--bind-to core", ["--oversubscribe"], ["none"]),
    ("--map-by ppr:1:core --bind-to core", [], ["--oversubscribe", "none"]),
    ("--nooversubscribe", ["--bind-to", "none"], ["--oversubscribe"]),
    ("-x FOO", ["--oversubscribe", "--bind-to", "none"], []),
])
def test_the_users_mpirun_flags_replace_the_launchers_defaults_that_set_the_same_thing(user, kept, dropped):
    import shlex

    from mpi_trainer.launch.mpirun import mpirun_command

    command = mpirun_command(3, ["train", "x.toml"], extra=shlex.split(user))
    for flag in kept:
        assert flag in command
    for flag in dropped:
        assert flag not in command
    assert command.count("--bind-to") <= 1  # Open MPI refuses it twice ("bind-to listed more than once")
    assert " ".join(command).count(user) == 1
