"""One node: does a round's sum and broadcast of the weights move at memory speed?"""

from __future__ import annotations

from benchmarks.harness import Comparison, Figures
from benchmarks.jobs import program
from benchmarks.suites import bandwidth
from benchmarks.suites.big_models import prepared  # noqa: F401 - the simulated hosts, removed after the suite

QUESTION = "One node: a round's sum and broadcast through shared memory, against MPI and what memory allows"
SIZES = {"25M": 25e6, "100M": 100e6}
LINK = "1gbit"  # the simulated hosts' rate each way


def job(params: float, reps: int) -> Figures:
    """``benchmarks.shared_memory`` at one size, 2 workers: each way's median seconds and the ratios."""
    result = program("shared_memory", ["--params", str(params), "--reps", str(reps)], ranks=3)
    return {key: float(result[key]) for key in ("mpi_floor", "transport_mpi", "transport_shared", "one_pass",
                                                "memory_bound", "shared_over_bound", "shared_over_floor",
                                                "one_pass_over_bound", "one_pass_over_floor")}


def across_hosts(params: float, reps: int) -> Figures:
    """Rank 0 on one simulated host, both workers on the other: each way's seconds against the link's floor,
    one copy of the weights each way at the link's rate."""
    result = program("shared_memory", ["--params", str(params), "--reps", str(reps)], ranks=3,
                     mpirun_args=bandwidth.shaped(LINK, slots="1,2"))
    link = 2 * params * 4 * 8 / bandwidth.RATE_BITS[LINK]
    return {"transport_shared": result["transport_shared"], "one_pass": result["one_pass"],
            "transport_mpi": result["transport_mpi"], "mpi_floor": result["mpi_floor"],
            "send": result["send_each_way"], "both_ways": result["both_ways"], "link": link,
            "shared_over_link": result["transport_shared"] / link,
            "one_pass_over_link": result["one_pass"] / link,
            "one_pass_over_send": result["one_pass"] / result["send_each_way"],
            "one_pass_over_both": result["one_pass"] / result["both_ways"]}


def comparisons(quick: bool) -> list[Comparison]:
    reps = 5 if quick else 9
    hosts = [] if bandwidth.unavailable() else [Comparison(
        title=f"Two simulated hosts at {LINK} each way: rank 0 on one, both workers on the other; median of "
              f"{max(3, reps // 3)} calls",
        command=f"python -m benchmarks run node_memory{' --quick' if quick else ''}",
        variants={"25M parameters (100 MB)": (lambda: across_hosts(25e6, max(3, reps // 3)))},
        columns={"transport_shared": "sum, then broadcast s", "one_pass": "in one pass s",
                 "transport_mpi": "MPI (the transport's) s", "mpi_floor": "MPI floor s",
                 "send": "one copy sent each way s", "both_ways": "one copy each way at once s",
                 "link": "one copy each way at the link's rate s",
                 "shared_over_link": "sum, then broadcast / link", "one_pass_over_link": "one pass / link",
                 "one_pass_over_send": "one pass / sent", "one_pass_over_both": "one pass / at once"},
        notes="Each node's ranks add up in its shared memory and only its leader's sum crosses the link; the "
              "result crosses once to the node. Sum, then broadcast: `reduce_sum` then `broadcast`; in one pass: "
              "`reduce_broadcast`, each part of the result sent back while the next part of the sum comes in (a "
              "round's path with a float32 wire). One copy sent each way is a blocking Send from a worker to "
              "rank 0 and back, one copy each way at once an Isend and an Irecv on both: what TCP over the "
              "shaped link delivers, one way after the other and both at once. The target: <= 1.2x one copy each way "
              "at the link's rate.")]
    return hosts + [Comparison(
        title="Rank 0 sums two workers' float32 weights, then broadcasts the result; median of "
              f"{reps} calls, a call's time the slowest rank's",
        command=f"python -m benchmarks run node_memory{' --quick' if quick else ''}",
        variants={f"{size} parameters ({params * 4 / 1e6:g} MB)": (lambda p=params: job(p, reps))
                  for size, params in SIZES.items()},
        columns={"transport_shared": "shared memory s", "one_pass": "in one pass s",
                 "transport_mpi": "MPI (the transport's) s", "mpi_floor": "MPI floor s",
                 "memory_bound": "memory bound s", "shared_over_bound": "shared / bound",
                 "shared_over_floor": "shared / floor", "one_pass_over_bound": "one pass / bound",
                 "one_pass_over_floor": "one pass / floor"},
        notes="Shared memory is the transport's default when every rank is on one node (`reduce_sum` then "
              "`broadcast`); in one pass: `reduce_broadcast` through it, each part of the result handed back "
              "while the next is summed (a round's path with a float32 wire); MPI (the transport's) is the "
              "same calls with MPI_TRAINER_SHARED_MEMORY=0; the MPI floor is a blocking Reduce then Bcast of the "
              "whole buffer. The memory bound is rank 0 alone on one thread, in the same run: two in-place adds "
              "of a worker's buffer into its own and two copies of the result. The targets: shared memory "
              "<= 2x the bound and <= 0.5x the floor.")]


def conclude(tables: list[dict]) -> list[str]:
    lines = []
    for table in tables:
        for name, figures in table["rows"].items():
            median = {key: spread["median"] for key, spread in figures.items()}
            if "link" in median:
                lines.append(f"Between two hosts at {LINK}, with both workers on one, a round's sum and return of "
                             f"{name} in one pass took {median['one_pass']:.3g} s, {median['one_pass_over_link']:.2g}x "
                             f"one copy each way at the link's rate (target 1.2x) and "
                             f"{median['one_pass_over_send']:.2g}x one copy sent each way with Send and Recv "
                             f"({median['one_pass_over_both']:.2g}x one copy each way at once); the sum "
                             f"then the broadcast: {median['transport_shared']:.3g} s "
                             f"({median['shared_over_link']:.2g}x); MPI's: {median['transport_mpi']:.3g} s.")
                continue
            lines.append(f"At {name} a round's sum and broadcast took {median['transport_shared']:.3g} s through "
                         f"shared memory: {median['shared_over_bound']:.2g}x the memory bound (target 2x) and "
                         f"{median['shared_over_floor']:.2g}x the MPI floor (target 0.5x); in one pass "
                         f"{median['one_pass']:.3g} s ({median['one_pass_over_bound']:.2g}x, "
                         f"{median['one_pass_over_floor']:.2g}x); through MPI {median['transport_mpi']:.3g} s.")
    return lines
