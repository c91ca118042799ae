"""``mpi-trainer launch``: run the mpirun job, and restart it with ``--resume`` when it dies or stalls.

Separation of concerns: the job (scheduler and workers) trains and checkpoints;
the supervisor here only starts ``mpirun``, watches it from outside, and
decides whether to start it again. It counts a death (a non-zero exit, which
is what mpirun returns when any rank is killed or aborts) or a stall (no new
row in ``rounds.csv`` within the bound of
:class:`~mpi_trainer.algorithms.wait_bounds.StallWatch`) as a failure; it ends
the whole process tree of the failed attempt and starts the next one with
``--resume``, at most ``--max-restarts`` times. A bad config (exit status 2)
is not retried: it would fail the same way again. A preemption signal to the
supervisor is passed on to the job (which checkpoints and exits 75), and the
supervisor then exits 75 itself without restarting: running it again resumes. With
``--drop-failed-hosts``, a host named in two failures leaves the machinefile
and the job restarts with fewer workers.
"""

from __future__ import annotations

import collections
import json
import math
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mpi_trainer.algorithms.wait_bounds import StallWatch
from mpi_trainer.errors import EXIT_INPUT_ERROR, EXIT_PREEMPTED, ConfigError
from mpi_trainer.persistence.run_files import SUMMARY_NAME, open_append, write_atomic
from mpi_trainer.persistence.run_state import is_complete

POLL_SECONDS = 0.5
PREEMPT_MARGIN_SECONDS = 10.0  # beyond the job's grace period, for it to write and exit
TERM_GRACE_SECONDS = 3.0
HOST_FAILURES_TO_DROP = 2
# Host names in failure messages: ours ("worker rank 2 on host X") and Open MPI's ("... on node X ...").
_HOST_PATTERN = re.compile(r"\bon (?:host|node) ([A-Za-z0-9_.\-]+?)[.,;:]?(?:\s|$)")


@dataclass
class Failure:
    """Why an attempt ended badly, and whether trying again can help."""

    cause: str
    returncode: int
    retry: bool = True
    hosts: list[str] = field(default_factory=list)


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        return f"mpirun was killed by signal {signal.Signals(-returncode).name}"
    return f"the job exited with status {returncode} (a rank failed, aborted or was killed)"


def hosts_named(lines: Iterable[str]) -> list[str]:
    """Hosts that failure messages in ``lines`` name, in first-seen order."""
    found: list[str] = []
    for line in lines:
        for host in _HOST_PATTERN.findall(line):
            if host not in found:
                found.append(host)
    return found


def read_machinefile(path: Path) -> list[tuple[str, int]]:
    """``(host, slots)`` per line of an Open MPI hostfile; a line without ``slots=`` counts one.

    A ``slots`` value that is not a positive integer is refused with its line number."""
    entries = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        given = next((w for w in words[1:] if w.startswith(("slots=", "slots:"))), "slots=1")
        value = given[len("slots="):]
        if not value.isdigit() or int(value) < 1:
            raise ConfigError(f"{path}, line {number}: `{given}` is not a slot count. Received: {line.strip()!r}; "
                              f"expected 'HOST slots=N' with N a positive integer")
        entries.append((words[0], int(value)))
    return entries


# mpirun options that give it a launch agent of its own, which may reach hosts this machine cannot resolve
OWN_AGENT_OPTIONS = ("plm_ssh_agent", "plm_rsh_agent", "--launch-agent", "plm_ssh_args")


def unresolved_hosts(entries: list[tuple[str, int]]) -> list[str]:
    """The machinefile's hosts that this machine cannot resolve (mpirun would fail on them with ssh's
    ``Could not resolve hostname`` before any rank starts)."""
    missing = []
    for host, _ in entries:
        try:
            socket.getaddrinfo(host, None)
        except (socket.gaierror, UnicodeError):
            if host not in missing:
                missing.append(host)
    return missing


def check_hosts_resolve(path: Path, mpirun_args: str = "") -> None:
    """Refuse a machinefile naming a host that does not resolve, unless mpirun has a launch agent of its own."""
    if any(option in mpirun_args for option in OWN_AGENT_OPTIONS):
        return
    missing = unresolved_hosts(read_machinefile(path))
    if missing:
        raise ConfigError(f"{path} names host(s) that do not resolve from {socket.gethostname()}: {missing}. "
                          f"Received: --machinefile {str(path)!r}; expected host names or addresses this machine "
                          f"resolves (check /etc/hosts or DNS, or the spelling)")


def drop_host(entries: list[tuple[str, int]], host: str, ranks: int) -> tuple[list[tuple[str, int]], int]:
    """The machinefile without ``host`` and the rank count reduced by its slots."""
    kept = [(name, slots) for name, slots in entries if name != host]
    removed = sum(slots for name, slots in entries if name == host)
    return kept, ranks - removed


class Supervisor:
    """Starts attempts, watches them, restarts them; knows nothing of MPI beyond the command line."""

    def __init__(self, command_for: Callable[[int], list[str]], progress_file: Path, stall_seconds: float,
                 max_restarts: int, log_file: Path | None = None,
                 on_failure: Callable[[Failure], bool] | None = None) -> None:
        self.command_for = command_for
        self.progress_file = progress_file
        self.stall_seconds = stall_seconds
        self.max_restarts = max_restarts
        self.log_file = log_file
        self.on_failure = on_failure or (lambda failure: True)
        self.failures: list[Failure] = []
        self.current: subprocess.Popen | None = None  # the attempt running now
        self.preempted_by: str | None = None  # the signal that asked the supervisor to stop
        self.preempt_deadline = math.inf
        self.forward_signal: int | None = signal.SIGUSR1  # what mpirun passes on to every rank
        self.grace_seconds = 25.0

    def preempt(self, name: str) -> None:
        """A preemption signal: pass it on to the job and stop once the job has checkpointed and exited."""
        if self.preempted_by:
            return
        self.preempted_by = name
        self.preempt_deadline = time.monotonic() + self.grace_seconds + PREEMPT_MARGIN_SECONDS
        self.log(f"{name} received: asking the job to checkpoint and exit (exit status {EXIT_PREEMPTED})")
        proc = self.current
        if proc is not None and proc.poll() is None:
            if self.forward_signal is None:
                self.preempt_deadline = time.monotonic()  # nothing the job would take: end it now
            else:
                os.kill(proc.pid, self.forward_signal)

    def log(self, text: str) -> None:
        line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} launch: {text}"
        print(line, file=sys.stderr, flush=True)
        if self.log_file is not None:
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            with os.fdopen(open_append(self.log_file), "a", encoding="utf-8") as handle:
                handle.write(line + "\n")

    def run(self) -> int:
        """Attempts until one succeeds; returns 0 or the last failure's exit status."""
        for attempt in range(self.max_restarts + 1):
            if self.preempted_by:
                break
            command = self.command_for(attempt)
            self.log(f"attempt {attempt + 1}/{self.max_restarts + 1}: {shlex.join(command)}")
            failure = self.run_once(command)
            if failure is None:
                self.log(f"attempt {attempt + 1} completed")
                return 0
            self.failures.append(failure)
            self.log(f"attempt {attempt + 1} failed: {failure.cause}")
            if not failure.retry or not self.on_failure(failure):
                return failure.returncode or 1
            if attempt < self.max_restarts:
                self.log(f"restarting with --resume (restart {attempt + 1} of {self.max_restarts}) "
                         f"after: {failure.cause}")
        if self.preempted_by:
            return EXIT_PREEMPTED
        self.log(f"giving up after {self.max_restarts} restarts")
        return self.failures[-1].returncode or 1

    def progress(self) -> tuple[int, int] | None:
        try:
            stat = self.progress_file.stat()
        except FileNotFoundError:
            return None
        return stat.st_size, stat.st_mtime_ns

    def run_once(self, command: list[str]) -> Failure | None:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        tail: collections.deque[str] = collections.deque(maxlen=400)
        reader = threading.Thread(target=_relay, args=(proc.stdout, tail), daemon=True)
        reader.start()
        self.current = proc
        try:
            failure = self.watch(proc)
        finally:
            self.current = None
            if proc.poll() is None:
                end_process_tree(proc)
            reader.join(timeout=5)
        if failure is not None:
            failure.hosts = hosts_named(tail)
        return failure

    def watch(self, proc: subprocess.Popen) -> Failure | None:
        stall = StallWatch(self.stall_seconds, started=time.monotonic())
        last_seen = self.progress()
        while True:
            returncode = proc.poll()
            if returncode is not None:
                return self.ended(returncode)
            if time.monotonic() > self.preempt_deadline:
                end_process_tree(proc)
                return Failure(f"preempted ({self.preempted_by}): the job did not exit within "
                               f"checkpoint.grace_seconds and was ended", EXIT_PREEMPTED, retry=False)
            seen = self.progress()
            if seen != last_seen:
                last_seen = seen
                stall.progressed(time.monotonic(), self.run_complete())
            elif stall.expired(time.monotonic()):
                end_process_tree(proc)
                return Failure(f"stalled: no new round in {self.progress_file.name} for {stall.describe()}", 1)
            time.sleep(POLL_SECONDS)

    def run_complete(self) -> bool:
        """Whether the run's summary.json (beside rounds.csv) marks it complete."""
        try:
            return is_complete(json.loads((self.progress_file.parent / SUMMARY_NAME).read_text()))
        except (OSError, ValueError):
            return False

    def ended(self, returncode: int) -> Failure | None:
        """An attempt's exit status: success, a failure to retry, or one to stop at."""
        if returncode == 0:
            return None
        if self.preempted_by or returncode == EXIT_PREEMPTED:
            # 75: the job checkpointed for a preemption. Sent to the supervisor too, the supervisor
            # stops (it is being preempted); sent to a rank alone, the run goes on at once.
            return Failure(f"preempted ({self.preempted_by or 'a rank was signalled'}): the job exited with "
                           f"status {returncode}", EXIT_PREEMPTED, retry=not self.preempted_by)
        return Failure(describe_exit(returncode), returncode, retry=returncode != EXIT_INPUT_ERROR)


def _relay(stream: Any, tail: collections.deque) -> None:
    """Pass the job's output through to the console, keeping the last lines for host names."""
    for line in stream:
        sys.stdout.write(line)
        sys.stdout.flush()
        tail.append(line)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc); empty elsewhere."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children[ppid].append(int(entry.name))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _signal_all(pids: Iterable[int], pgid: int, sig: int) -> None:
    for target in [*pids]:
        try:
            os.kill(target, sig)
        except ProcessLookupError:
            pass
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def end_process_tree(proc: subprocess.Popen) -> None:
    """SIGTERM mpirun, its process group and every descendant (ranks may run their own group), then SIGKILL.

    A stopped rank ignores SIGTERM until continued, hence SIGCONT first and SIGKILL last.
    """
    pids = descendants(proc.pid)
    for sig in (signal.SIGCONT, signal.SIGTERM):
        _signal_all([proc.pid, *pids], proc.pid, sig)
    try:
        proc.wait(timeout=TERM_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        pass
    _signal_all([proc.pid, *pids, *descendants(proc.pid)], proc.pid, signal.SIGKILL)
    proc.wait()


@dataclass
class AttemptHosts:
    """Where the next attempt runs: rank count and machinefile (changes when a host is dropped)."""

    ranks: int
    machinefile: str | None
    host_failures: collections.Counter = field(default_factory=collections.Counter)


def host_dropper(hosts: AttemptHosts, run_dir: Path,
                 log: Callable[[str], None]) -> Callable[[Failure], bool]:
    """on_failure hook: count failures per host; drop one at the second, if workers remain."""

    def on_failure(failure: Failure) -> bool:
        if not hosts.machinefile:
            return True
        entries = read_machinefile(Path(hosts.machinefile))
        for host in failure.hosts:
            hosts.host_failures[host] += 1
            if hosts.host_failures[host] < HOST_FAILURES_TO_DROP or host not in dict(entries):
                continue
            kept, ranks = drop_host(entries, host, hosts.ranks)
            if ranks < 2 or not kept:
                log(f"host {host} failed {hosts.host_failures[host]} times, but dropping it would leave "
                    f"no worker; keeping it")
                continue
            path = run_dir / "machinefile.active"
            write_atomic(path, "".join(f"{name} slots={slots}\n" for name, slots in kept))
            hosts.machinefile, hosts.ranks, entries = str(path), ranks, kept
            log(f"host {host} failed {hosts.host_failures[host]} times: dropped; restarting on "
                f"{ranks} ranks with {path}")
        return True

    return on_failure
