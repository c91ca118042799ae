"""The exceptions a user of mpi_trainer may catch, and the exit codes they map to."""

# Exit statuses of `mpi_trainer train` (and of mpirun, which passes the first non-zero one on).
EXIT_INPUT_ERROR = 2  # bad config, data, arguments or run directory: retrying cannot help
EXIT_WORKER_FAILURE = 3  # a rank stopped answering (watchdog)
# Preempted (SIGTERM or SIGUSR1): the run checkpointed, or its grace period ran out; running the same
# command again resumes it. 75 is sysexits.h's EX_TEMPFAIL, "try again later".
EXIT_PREEMPTED = 75


class InputError(ValueError):
    """Bad input from the user: the message says what, the value and what was expected."""


class ConfigError(InputError):
    """A configuration key holds a bad value, or the file cannot be read."""


class DataError(InputError):
    """A dataset cannot be loaded or fails validation."""


class AgreedInputError(InputError):
    """Bad input that every rank knows about: all of them report it and exit together."""


class WorkerFailure(RuntimeError):
    """A remote rank failed; the message carries its rank, host and traceback."""


class PeerFailure(WorkerFailure):
    """Another rank failed and said so; ``rank`` is the rank that failed.

    Raised on every other rank when one rank of a job fails (a user's ``fit`` script catches it to go
    on after the job ended); the rank that failed raises its own exception.
    """

    def __init__(self, rank: int, host: str, text: str) -> None:
        role = "the scheduler" if rank == 0 else "worker"
        super().__init__(f"rank {rank} ({role}) on host {host} failed: {text}")
        self.rank = rank


class RankLost(RuntimeError):
    """A peer rank of the communicator failed (or the communicator was revoked because one did).

    Raised by the transports' verbs under ``fault.survive``; the scheduler and the workers answer it by
    shrinking the communicator to the survivors and carrying on.
    """


class Preempted(SystemExit):
    """The job was asked to stop (SIGTERM, SIGUSR1) and checkpointed; ends the process with
    :data:`EXIT_PREEMPTED` unless caught. Running the same command again resumes the run."""

    def __init__(self, message: str = "preempted: checkpoint written; run the same command again to resume") -> None:
        super().__init__(EXIT_PREEMPTED)
        self.message = message

    def __str__(self) -> str:
        return self.message
