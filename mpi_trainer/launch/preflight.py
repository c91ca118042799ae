"""``mpi_trainer preflight CONFIG``: before a long run, check that the ranks reach each other and the data.

Run it with the same ``mpirun`` command line as the training job. Every rank sends a
small hello to every other rank and joins one sum over all ranks (the broadcast and
reduction that training uses), each bounded by ``timeout``, so a firewall or a wrong
``btl_tcp_if_include`` shows up as a named rank instead of a hang. Every rank then reads
the config and the rows it would read in training (its first and last training row under
``data.placement = "shared"``; nothing on workers under ``scatter``), and rank 0 times a
round trip of ``probe_mb`` to each worker. Rank 0 prints one table; a failure ends every
rank with a non-zero status.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np

from mpi_trainer.comm import open_transport
from mpi_trainer.comm.interface import RankTransport

TAG_HELLO = 41
TAG_REPORT = 42
TAG_PROBE = 43
TAG_VERDICT = 44
EXIT_PREFLIGHT_FAILED = 4


@dataclass
class RankReport:
    """What one rank found; it travels to rank 0 for the table."""

    rank: int
    host: str
    pid: int
    unreached: list[int] = field(default_factory=list)  # ranks whose hello never arrived
    collective: str = "ok"
    data: str = ""
    data_ok: bool = False
    probe_seconds: float | None = None

    @property
    def ok(self) -> bool:
        return not self.unreached and self.collective == "ok" and self.data_ok


def exchange_hellos(transport: RankTransport, timeout: float) -> list[int]:
    """Send a hello to every other rank, wait for theirs; return the ranks not heard from."""
    for step in range(1, transport.size):
        transport.send_object(transport.host, (transport.rank + step) % transport.size, TAG_HELLO)
    deadline = time.perf_counter() + timeout
    missing = []
    for step in range(1, transport.size):
        source = (transport.rank - step) % transport.size
        try:
            transport.recv_object(source, TAG_HELLO, timeout=max(1e-3, deadline - time.perf_counter()))
        except TimeoutError:
            missing.append(source)
    return missing


def sum_over_ranks(transport: RankTransport, timeout: float) -> str:
    """One reduction to rank 0 and one broadcast back, as every training round does."""
    ones = np.zeros(transport.size, dtype=np.float32)
    ones[transport.rank] = 1.0
    try:
        transport.reduce_sum(ones, timeout=timeout)
        transport.broadcast(ones, timeout=timeout)
    except TimeoutError:
        return f"timed out after {timeout:g} s"
    return "ok" if np.all(ones == 1.0) else f"wrong sum {ones.tolist()}"


def check_data(rank: int, config_path: str, overrides: list[str]) -> tuple[bool, str]:
    """Read the config and the training rows this rank would read; (ok, what was found)."""
    from mpi_trainer.config import load_config
    from mpi_trainer.data.pipelines import pipeline_source
    from mpi_trainer.data.sources import load_dataset
    from mpi_trainer.errors import InputError

    try:
        cfg = load_config(config_path, overrides)
        if rank != 0 and cfg.data.scatters:
            return True, f"{cfg.data.source}: not read here (scatter: rank 0 sends the rows)"
        dataset = pipeline_source(cfg, 1) or load_dataset(cfg.data, cfg.train.seed)
        dataset.train.read(np.array([0, dataset.num_train - 1]))
    except (InputError, ValueError, OSError, IndexError) as exc:
        return False, f"cannot read: {exc}"
    return True, f"{cfg.data.source}: {dataset.num_train} training rows"


def probe_links(transport: RankTransport, nbytes: int, timeout: float | None) -> dict[int, float]:
    """Rank 0: round-trip seconds of ``nbytes`` to each worker and back. Workers echo."""
    buffer = np.zeros(max(1, nbytes // 4), dtype=np.float32)
    if transport.rank != 0:
        transport.recv_array(buffer, 0, TAG_PROBE, timeout=timeout)
        transport.send_array(buffer, 0, TAG_PROBE)
        return {}
    seconds = {}
    for worker in range(1, transport.size):
        started = time.perf_counter()
        transport.send_array(buffer, worker, TAG_PROBE)
        transport.recv_array(buffer, worker, TAG_PROBE, timeout=timeout)
        seconds[worker] = time.perf_counter() - started
    return seconds


def gather_reports(transport: RankTransport, own: RankReport, timeout: float) -> list[RankReport | int]:
    """Rank 0: every rank's report, or the rank number where none came within ``timeout``."""
    reports: list[RankReport | int] = [own]
    deadline = time.perf_counter() + timeout
    for worker in range(1, transport.size):
        try:
            reports.append(transport.recv_object(worker, TAG_REPORT,
                                                 timeout=max(1e-3, deadline - time.perf_counter())).payload)
        except TimeoutError:
            reports.append(worker)
    return reports


def format_rank_table(reports: list[RankReport | int], probe_bytes: int) -> str:
    """One line per rank: host, pid, peers reached, the sum, the data, the link to rank 0."""
    size = len(reports)
    lines = [f"{'rank':>4}  {'host':<20} {'pid':>7}  {'reaches':<9} {'sum':<8} "
             f"{'round trip to rank 0':<22} data"]
    for index, report in enumerate(reports):
        if isinstance(report, int):
            lines.append(f"{index:>4}  no report within the timeout")
            continue
        reached = f"{size - 1 - len(report.unreached)}/{size - 1}"
        if report.unreached:
            reached += " (missing " + ",".join(map(str, report.unreached)) + ")"
        link = "-"
        if report.probe_seconds is not None:
            rate = 2 * probe_bytes / report.probe_seconds / 1e6
            link = f"{report.probe_seconds * 1e3:.1f} ms ({rate:.0f} MB/s)"
        lines.append(f"{report.rank:>4}  {report.host:<20} {report.pid:>7}  {reached:<9} "
                     f"{report.collective:<8} {link:<22} {report.data}")
    return "\n".join(lines)


def verdict(reports: list[RankReport | int]) -> str | None:
    """None when every rank passed, else the reason the job should not start."""
    if len(reports) < 2:
        return "training needs a worker besides the scheduler: run under mpirun -n 2 or more"
    failed = [index for index, r in enumerate(reports) if isinstance(r, int) or not r.ok]
    if failed:
        return "rank(s) " + ", ".join(map(str, failed)) + " failed (see the table)"
    return None


def preflight(config_path: str, overrides: list[str], timeout: float = 30.0, probe_mb: float = 4.0) -> int:
    """Entry for ``mpi_trainer preflight`` on every rank; returns the exit status."""
    transport = open_transport()
    own = RankReport(transport.rank, transport.host, os.getpid())
    own.unreached = exchange_hellos(transport, timeout)
    own.collective = sum_over_ranks(transport, timeout)
    own.data_ok, own.data = check_data(transport.rank, config_path, overrides)
    if transport.rank != 0:
        return worker_side(transport, own, int(probe_mb * 1e6), timeout)
    return scheduler_side(transport, own, int(probe_mb * 1e6), timeout)


def worker_side(transport: RankTransport, own: RankReport, probe_bytes: int, timeout: float) -> int:
    transport.send_object(own, 0, TAG_REPORT)
    transport.recv_object(0, TAG_VERDICT)  # only on success: after a failure rank 0 ends the job
    probe_links(transport, probe_bytes, timeout)
    transport.recv_object(0, TAG_VERDICT)  # rank 0 has printed the table
    return 0


def scheduler_side(transport: RankTransport, own: RankReport, probe_bytes: int, timeout: float) -> int:
    reports = gather_reports(transport, own, timeout)
    problem = verdict(reports)
    if problem is not None:
        print(format_rank_table(reports, probe_bytes), flush=True)
        print(f"preflight: FAILED: {problem}", flush=True)
        transport.abort(EXIT_PREFLIGHT_FAILED)  # a rank may be stuck: end them all, none left waiting
    for worker in range(1, transport.size):
        transport.send_object(True, worker, TAG_VERDICT)
    arrived = [report for report in reports if isinstance(report, RankReport)]  # all of them: the verdict passed
    for worker, seconds in probe_links(transport, probe_bytes, timeout).items():
        arrived[worker].probe_seconds = seconds
    print(format_rank_table(reports, probe_bytes), flush=True)
    hosts = len({r.host for r in arrived})
    print(f"preflight: OK: {len(reports)} ranks on {hosts} host(s) reach each other and read the data",
          flush=True)
    for worker in range(1, transport.size):
        transport.send_object(True, worker, TAG_VERDICT)
    return 0
