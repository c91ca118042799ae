"""Weights at MPI speed: the transport's bulk verbs against blocking mpi4py calls, side by side.

For every interconnect (Open MPI's shared-memory or TCP transport, or ``ft``: the fault-tolerant
MPI that ``fault.survive`` needs, ob1 over TCP with ULFM on) and rank count it starts one
``mpirun`` job. In it, for every payload, the transport's ``reduce_sum``, ``broadcast`` and
``send_array``/``recv_array`` alternate with blocking ``Reduce``, ``Bcast`` and ``Send``/``Recv``
of the same buffer; a call's time is the longest any rank spent in it, and the table shows the
median over the repetitions. A point passes when transport <= 1.2 x blocking + 1 ms.
At ``--cpu-ranks`` ranks the job also measures rank 0's CPU while it waits ``--slow-seconds``
for a deliberately slow last rank, in ``reduce_sum`` and in a blocking ``Reduce``.
``--before-after`` adds the previous verb (``MPI_Ireduce`` polled with sleeps growing to 5 ms)
at 1.85 MB and 2 ranks; ``--nonblocking`` times ``MPI_Ireduce``/``MPI_Ibcast`` polled without
sleeping, the other candidate for the bulk phase.

    .venv/bin/python scripts/bench_comm.py                       # the full table (about 10 min)
    .venv/bin/python scripts/bench_comm.py --ranks 2 3 --payloads-mb 0.3 2 --slow-seconds 2
    .venv/bin/python scripts/bench_comm.py --btl sm ft --ranks 4 --payloads-mb 0.07 1.7   # fault.survive's price
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpi_trainer.launch.mpirun import FAULT_TOLERANT_OPTIONS, find_mpirun  # noqa: E402

# Open MPI's transport by name; "ft" is the fault-tolerant MPI that fault.survive runs on (ob1 over TCP).
BTLS = {"sm": ["--mca", "btl", "self,sm"], "tcp": ["--mca", "btl", "self,tcp"], "ft": FAULT_TOLERANT_OPTIONS}
PAIRS = (("reduce", "transport reduce_sum", "blocking Reduce"),
         ("bcast", "transport broadcast", "blocking Bcast"),
         ("p2p", "transport send/recv_array", "blocking Send/Recv"))


# -- inside the mpirun job -------------------------------------------------------
def operations(comm, transport, buf: np.ndarray) -> dict[str, Callable[[], None]]:
    """Each timed call, by name: the transport's verb and the blocking mpi4py call it must match."""
    from mpi4py import MPI

    rank = comm.Get_rank()

    def blocking_reduce() -> None:
        comm.Reduce(MPI.IN_PLACE if rank == 0 else buf, buf if rank == 0 else None, op=MPI.SUM, root=0)

    def transport_p2p() -> None:
        if rank == 1:
            transport.send_array(buf, 0)
        elif rank == 0:
            transport.recv_array(buf, 1)

    def blocking_p2p() -> None:
        if rank == 1:
            comm.Send(buf, 0, 99)
        elif rank == 0:
            comm.Recv(buf, 1, 99)

    return {"transport reduce": lambda: transport.reduce_sum(buf), "blocking reduce": blocking_reduce,
            "transport bcast": lambda: transport.broadcast(buf), "blocking bcast": lambda: comm.Bcast(buf, 0),
            "transport p2p": transport_p2p, "blocking p2p": blocking_p2p}


def spin(request) -> None:
    """Poll a request without sleeping: what a non-blocking bulk collective costs at best."""
    while not request.Test():
        pass


def nonblocking_operations(comm, buf: np.ndarray) -> dict[str, Callable[[], None]]:
    """``--nonblocking``: MPI_Ireduce / MPI_Ibcast tested without sleeping, the alternative bulk phase."""
    from mpi4py import MPI

    root = comm.Get_rank() == 0
    return {"spin reduce": lambda: spin(comm.Ireduce(MPI.IN_PLACE if root else buf, buf if root else None,
                                                     op=MPI.SUM, root=0)),
            "spin bcast": lambda: spin(comm.Ibcast(buf, 0))}


def polled_ireduce(comm, buf: np.ndarray, max_sleep: float = 0.005) -> None:
    """The previous ``reduce_sum``: ``MPI_Ireduce`` tested with sleeps from 20 us doubling to 5 ms."""
    from mpi4py import MPI

    if comm.Get_rank() == 0:
        request = comm.Ireduce(MPI.IN_PLACE, buf, op=MPI.SUM, root=0)
    else:
        request = comm.Ireduce(buf, None, op=MPI.SUM, root=0)
    sleep = 2e-5
    while not request.Test():
        time.sleep(sleep)
        sleep = min(sleep * 2, max_sleep)


def timed(comm, call: Callable[[], None]) -> float:
    """Seconds from a common start to the last rank's return from ``call``."""
    from mpi4py import MPI

    comm.Barrier()
    started = time.perf_counter()
    call()
    return comm.allreduce(time.perf_counter() - started, op=MPI.MAX)


def time_payload(comm, transport, megabytes: float, reps: int, nonblocking: bool) -> dict[str, float]:
    """Median milliseconds of each call on a ``megabytes`` float32 buffer, calls interleaved."""
    buf = np.ones(int(megabytes * 1e6) // 4, np.float32)
    calls = operations(comm, transport, buf)
    if nonblocking:
        calls.update(nonblocking_operations(comm, buf))
    times: dict[str, list[float]] = {name: [] for name in calls}
    for rep in range(reps):
        names = list(calls) if rep % 2 == 0 else list(reversed(calls))
        for name in names:
            times[name].append(timed(comm, calls[name]))
    return {name: 1e3 * statistics.median(values) for name, values in times.items()}


def waiting_cpu(comm, call: Callable[[], None], slow_seconds: float) -> float:
    """Rank 0's CPU, as a fraction of one core, while ``call`` waits for the last rank to come late."""
    comm.Barrier()
    if comm.Get_rank() == comm.Get_size() - 1:
        time.sleep(slow_seconds)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    call()
    return (time.process_time() - cpu0) / (time.perf_counter() - wall0)


def run_job(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    from mpi_trainer.comm.transport import Transport

    comm, transport = MPI.COMM_WORLD, Transport(MPI.COMM_WORLD)
    transport.bound = 600.0  # as in a job: every wait bounded, failure notices checked while it sleeps
    result: dict = {"payloads": {}}
    for megabytes in args.payloads_mb:
        result["payloads"][str(megabytes)] = time_payload(comm, transport, megabytes, args.reps, args.nonblocking)
    if comm.Get_size() == args.cpu_ranks and args.slow_seconds > 0:
        calls = operations(comm, transport, np.ones(int(1.85e6) // 4, np.float32))
        result["cpu"] = {name: waiting_cpu(comm, calls[name], args.slow_seconds)
                         for name in ("transport reduce", "blocking reduce")}
    if args.before_after and comm.Get_size() == 2:
        result["before_after"] = before_after(comm, transport)
    if comm.Get_rank() == 0:
        print("RESULT " + json.dumps(result), flush=True)


def before_after(comm, transport, reps: int = 7) -> dict[str, float]:
    """Median milliseconds of the previous and the current verb at 1.85 MB (LeNet), alternating."""
    buf = np.ones(int(1.85e6) // 4, np.float32)
    old, new = [], []
    for _ in range(reps):
        old.append(timed(comm, lambda: polled_ireduce(comm, buf)))
        new.append(timed(comm, lambda: transport.reduce_sum(buf)))
    return {"polled Ireduce": 1e3 * statistics.median(old), "reduce_sum": 1e3 * statistics.median(new)}


# -- the driver ------------------------------------------------------------------
def launch(ranks: int, btl: str, args: argparse.Namespace) -> dict:
    command = [find_mpirun(), "-n", str(ranks), "--oversubscribe", "--bind-to", "none", *BTLS[btl]]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-run-as-root")
    command += [sys.executable, __file__, "--job", "--reps", str(args.reps), "--cpu-ranks", str(args.cpu_ranks),
                "--slow-seconds", str(args.slow_seconds), "--payloads-mb", *map(str, args.payloads_mb)]
    command += [flag for flag, on in (("--before-after", args.before_after), ("--nonblocking", args.nonblocking))
                if on]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"bench job failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return json.loads(lines[0][len("RESULT "):])


def print_table(results: dict[tuple[str, int], dict]) -> bool:
    """The timing table; returns whether every point met the target."""
    print("| transport | ranks | payload MB | operation | transport ms | blocking ms | ratio | target met |")
    print("|---|---|---|---|---|---|---|---|")
    met = True
    for (btl, ranks), result in results.items():
        for megabytes, times in result["payloads"].items():
            for key, label, _ in PAIRS:
                ours, theirs = times[f"transport {key}"], times[f"blocking {key}"]
                ok = ours <= 1.2 * theirs + 1.0
                met &= ok
                print(f"| {btl} | {ranks} | {megabytes} | {label} | {ours:.2f} | {theirs:.2f} | "
                      f"{ours / theirs:.2f} | {'yes' if ok else '**no**'} |")
    return met


def print_nonblocking(results: dict[tuple[str, int], dict]) -> None:
    print("| transport | ranks | payload MB | Ireduce spin / Reduce | Ibcast spin / Bcast |")
    print("|---|---|---|---|---|")
    for (btl, ranks), result in results.items():
        for megabytes, t in result["payloads"].items():
            if "spin reduce" in t:
                print(f"| {btl} | {ranks} | {megabytes} | {t['spin reduce']:.2f} / {t['blocking reduce']:.2f} ms | "
                      f"{t['spin bcast']:.2f} / {t['blocking bcast']:.2f} ms |")


def print_extras(results: dict[tuple[str, int], dict], slow_seconds: float) -> None:
    for (btl, ranks), result in results.items():
        for name, fraction in result.get("cpu", {}).items():
            print(f"{btl}, {ranks} ranks: rank 0 CPU while waiting {slow_seconds:g} s in {name}: "
                  f"{fraction:.1%} of a core")
        if "before_after" in result:
            old, new = result["before_after"]["polled Ireduce"], result["before_after"]["reduce_sum"]
            print(f"{btl}, 1.85 MB at 2 ranks: polled Ireduce {old:.2f} ms, reduce_sum {new:.2f} ms "
                  f"({old / new:.0f}x as fast)")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 3, 5, 9])
    parser.add_argument("--payloads-mb", type=float, nargs="+", default=[0.3, 2, 8, 32])
    parser.add_argument("--btl", choices=sorted(BTLS), nargs="+", default=["sm", "tcp"])
    parser.add_argument("--reps", type=int, default=11)
    parser.add_argument("--slow-seconds", type=float, default=10.0)
    parser.add_argument("--cpu-ranks", type=int, default=3, help="rank count at which the waiting CPU is measured")
    parser.add_argument("--before-after", action="store_true")
    parser.add_argument("--nonblocking", action="store_true",
                        help="also time Ireduce/Ibcast polled without sleeping (the bulk phase not chosen)")
    parser.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.job:
        run_job(args)
        return
    results = {(btl, ranks): launch(ranks, btl, args) for btl in args.btl for ranks in args.ranks}
    met = print_table(results)
    if args.nonblocking:
        print_nonblocking(results)
    print_extras(results, args.slow_seconds)
    print(f"target (transport <= 1.2 x blocking + 1 ms at every point): {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
