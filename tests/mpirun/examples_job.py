"""Run example scripts one after another in this process; print one JSON line per example.

    python tests/mpirun/examples_job.py WORKDIR [--keras-only] EXAMPLE.py ... [--ported EXAMPLE.py ...]
    mpirun -n 3 python tests/mpirun/examples_job.py WORKDIR EXAMPLE.py ... ["EXAMPLE.py --epochs 2" ...]

Each script runs as ``__main__`` (``runpy.run_path``) with the working directory ``WORKDIR/<stem>``,
the same directory on every rank, as ranks started from one directory share it. Its stdout is
captured and its last ``Test <metric>: <value>`` line is reported (none: ``metric`` is null), with the
rank (mpi4py's), the seconds it took and the end of its output; a script that raises is reported with the
end of its traceback, and the next one runs. An argument with spaces is a script and its command line.
Keras' global state is reset between scripts (``clear_session``, the ``float32`` policy).

``--keras-only``: the scripts run as the plain Keras scripts they were ported from: ``mpi_trainer``
is replaced by a stand-in whose ``init()`` does nothing and whose ``fit(model, ...)`` is
``model.fit(...)`` (the baseline the data-parallel metric is compared with). The examples after
``--ported`` then run with the real ``mpi_trainer`` (in one process: the ported script as it runs
without ``mpirun``), in directories ``WORKDIR/ported/<stem>``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import runpy
import shlex
import sys
import time
import traceback
import types
from pathlib import Path

TEST_LINE = re.compile(r"^Test (\w+): (\S+)\s*$", re.MULTILINE)


def keras_only_module() -> types.ModuleType:
    """A stand-in ``mpi_trainer``: the two ported lines undone."""
    module = types.ModuleType("mpi_trainer")
    module.init = lambda **kwargs: None
    module.fit = lambda model, *args, **kwargs: model.fit(*args, **kwargs)
    module.stand_in = True
    return module


def reset_keras() -> None:
    keras = sys.modules.get("keras")
    if keras is not None:
        keras.mixed_precision.set_global_policy("float32")
        keras.backend.clear_session()


def run_example(path: Path, args: list[str], workdir: Path) -> dict:
    """One script's report: its metric (the last ``Test`` line) and output, or its error."""
    directory = workdir / path.stem
    directory.mkdir(parents=True, exist_ok=True)
    out, started, here, argv = io.StringIO(), time.perf_counter(), os.getcwd(), sys.argv
    report: dict = {"example": path.name, "metric": None, "value": None, "error": None, "output": ""}
    try:
        os.chdir(directory)
        sys.argv = [str(path), *args]
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(path), run_name="__main__")
        found = TEST_LINE.findall(out.getvalue())
        if found:
            report["metric"], report["value"] = found[-1][0], float(found[-1][1])
    except BaseException:  # noqa: B036 - a script's SystemExit or error is its report, not this job's end
        report["error"] = traceback.format_exc()[-3000:]
    finally:
        os.chdir(here)
        sys.argv = argv
        reset_keras()
    report["output"] = out.getvalue()[-4000:]
    report["seconds"] = round(time.perf_counter() - started, 2)
    return report


def main(argv: list[str]) -> None:
    keras_only = "--keras-only" in argv
    argv = [arg for arg in argv if arg != "--keras-only"]
    split = argv.index("--ported") if "--ported" in argv else len(argv)
    (workdir, *examples), ported = argv[:split], argv[split + 1:]
    from mpi4py import MPI

    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    runs = [(example, keras_only, Path(workdir)) for example in examples]
    runs += [(example, False, Path(workdir) / "ported") for example in ported]
    for example, stand_in, directory in runs:
        if stand_in:
            sys.modules["mpi_trainer"] = keras_only_module()
        elif getattr(sys.modules.get("mpi_trainer"), "stand_in", False):
            del sys.modules["mpi_trainer"]  # the script imports the real one
        script, *args = shlex.split(example)
        report = run_example(Path(script).resolve(), args, directory.resolve())
        print(json.dumps({**report, "rank": rank, "size": size, "keras_only": stand_in}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
