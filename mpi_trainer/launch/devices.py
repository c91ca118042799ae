"""Which device each rank trains on, chosen before its Keras backend is imported.

Every backend reads the visible GPUs once, when it starts: so each rank looks
at its node's GPUs without starting CUDA itself (``CUDA_VISIBLE_DEVICES`` as
mpirun handed it over, else ``nvidia-smi -L``, else the driver's
``/proc/driver/nvidia/gpus``), picks one, and narrows ``CUDA_VISIBLE_DEVICES``
to it before anything imports TensorFlow, JAX or PyTorch. The GPU users of a
node are its worker ranks in rank order (and the scheduler, only with
``train.scheduler_device = "gpu"``); user ``i`` takes GPU ``i mod gpus``, so
several workers may share one GPU. Sharing needs each backend to take memory
as it goes instead of all at once: memory growth on TensorFlow, no
preallocation on JAX; PyTorch's caching allocator already grows on demand.
A rank on CPU sees no GPU at all, so the scheduler never holds GPU memory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from mpi_trainer.config.choices import Device, SchedulerDevice
from mpi_trainer.errors import ConfigError

TRAINING_BACKENDS = ("tensorflow", "jax", "torch")
BACKEND_MODULES = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}
NVIDIA_PROC_DIR = Path("/proc/driver/nvidia/gpus")


@dataclass
class GpuInventory:
    """The GPUs a rank may use on its node, and where it looked for them (for messages)."""

    ids: list[str]
    looked: list[str] = field(default_factory=list)


@dataclass
class RankPlacement:
    """Where one rank runs: the log line and the summary's ``placement`` entry."""

    rank: int
    host: str
    local_rank: int
    role: Literal["scheduler", "worker"]
    backend: str
    device: str
    gpu_id: str | None = None
    threads: int | None = None  # the backend's threads; None: its own default (it had started already)
    cores: list[int] | None = None  # the cores it keeps to (train.bind_cores); None: any

    @property
    def is_scheduler(self) -> bool:
        """Rank 0's placement (``train.scheduler_device`` chose its device), not a worker's."""
        return self.role == "scheduler"

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu"

    def describe(self) -> str:
        role = " (scheduler)" if self.is_scheduler else ""
        threads = "" if self.threads is None else f", {self.threads} thread{'s' if self.threads != 1 else ''}"
        if self.cores:
            threads += f" on core{'s' if len(self.cores) > 1 else ''} {','.join(map(str, self.cores))}"
        return f"rank {self.rank}{role} on {self.host}: {self.backend}, {self.device}{threads}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def configured_backend(environ: Mapping[str, str] = os.environ) -> str:
    """The backend Keras will load: ``KERAS_BACKEND``, else keras.json's ``backend``, else TensorFlow."""
    if environ.get("KERAS_BACKEND"):
        return environ["KERAS_BACKEND"]
    keras_home = Path(environ.get("KERAS_HOME") or Path(environ.get("HOME", "~")).expanduser() / ".keras")
    try:
        return str(json.loads((keras_home / "keras.json").read_text()).get("backend", "tensorflow"))
    except (OSError, ValueError):
        return "tensorflow"


def check_training_backend(backend: str, installed: Callable[[str], bool]) -> None:
    """Fail before training when the backend cannot train here (not a training backend, or not installed)."""
    if backend not in TRAINING_BACKENDS:
        raise ConfigError(f"`KERAS_BACKEND` must name a Keras backend that can train (has `fit`). Received: "
                          f"KERAS_BACKEND={backend!r}; expected one of {list(TRAINING_BACKENDS)}")
    if not installed(BACKEND_MODULES[backend]):
        extra = " (pip install 'mpi_trainer[jax]')" if backend == "jax" else ""
        raise ConfigError(f"The Keras backend {backend!r} is not installed{extra}. Received: "
                          f"KERAS_BACKEND={backend!r}; expected a backend installed in this Python")


def parse_visible(value: str) -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` as a list of ids; empty or ``-1`` hides every GPU."""
    ids = [part.strip() for part in value.split(",") if part.strip()]
    return [] if not ids or ids[0].startswith("-") else ids


def nvidia_smi_ids(run: Callable[[list[str]], str] | None) -> list[str]:
    """GPU indices from ``nvidia-smi -L`` lines (``GPU 0: NVIDIA H100 ... (UUID: GPU-...)``)."""
    if run is None:
        return []
    ids = []
    for line in run(["nvidia-smi", "-L"]).splitlines():
        head, sep, _ = line.partition(":")
        if sep and head.startswith("GPU ") and head[4:].strip().isdigit():
            ids.append(head[4:].strip())
    return ids


def run_nvidia_smi(command: list[str]) -> str:
    """``nvidia-smi``'s output, or "" when it fails (a broken driver is a node without GPUs)."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def discover_gpus(environ: Mapping[str, str] = os.environ,
                  run: Callable[[list[str]], str] | None = None,
                  proc_dir: Path = NVIDIA_PROC_DIR) -> GpuInventory:
    """This node's usable GPUs, without initialising CUDA in this process.

    ``run`` runs ``nvidia-smi`` (None: use it when it is on PATH). A
    ``CUDA_VISIBLE_DEVICES`` set by the user or the batch system wins.
    """
    if "CUDA_VISIBLE_DEVICES" in environ:
        value = environ["CUDA_VISIBLE_DEVICES"]
        return GpuInventory(parse_visible(value), [f"CUDA_VISIBLE_DEVICES={value!r}"])
    if run is None and shutil.which("nvidia-smi"):
        run = run_nvidia_smi
    ids = nvidia_smi_ids(run)
    looked = ["CUDA_VISIBLE_DEVICES (unset)",
              "`nvidia-smi -L` (" + (f"{len(ids)} GPUs" if run else "not on PATH") + ")"]
    if ids:
        return GpuInventory(ids, looked)
    count = len([p for p in proc_dir.iterdir() if p.is_dir()]) if proc_dir.is_dir() else 0
    looked.append(f"{proc_dir} ({count} GPUs)" if proc_dir.is_dir() else f"{proc_dir} (absent)")
    return GpuInventory([str(i) for i in range(count)], looked)


def gpu_users(node_ranks: list[int], scheduler_on_gpu: bool) -> list[int]:
    """The ranks of a node that take a GPU, in the order they are dealt GPUs."""
    return [r for r in sorted(node_ranks) if r != 0 or scheduler_on_gpu]


def choose_placement(rank: int, host: str, node_ranks: list[int], requested: Device, scheduler_device: SchedulerDevice,
                     inventory: GpuInventory, backend: str) -> RankPlacement:
    """Where ``rank`` runs: GPU ``i mod gpus`` for the i-th GPU user of its node, else the CPU.

    ``requested`` is ``train.device`` (auto, cpu, gpu) for workers; the
    scheduler follows ``train.scheduler_device`` (cpu, gpu).
    """
    role: Literal["scheduler", "worker"] = "scheduler" if rank == 0 else "worker"
    want: Device = scheduler_device if rank == 0 else requested
    local_rank = sorted(node_ranks).index(rank)
    cpu = RankPlacement(rank, host, local_rank, role, backend, "cpu")
    if want == "cpu" or (want == "auto" and not inventory.ids):
        return cpu
    if not inventory.ids:
        key = "train.scheduler_device" if rank == 0 else "train.device"
        raise ConfigError(f"`{key}` asks for a GPU but node {host} has none: looked at "
                          f"{', '.join(inventory.looked)}. Received: {key}={want!r}; expected a node with "
                          f"an NVIDIA GPU, or {key}={'cpu' if rank == 0 else 'auto'!r}")
    users = gpu_users(node_ranks, scheduler_device == "gpu")
    gpu_id = inventory.ids[users.index(rank) % len(inventory.ids)]
    return replace(cpu, device=f"cuda:{gpu_id}", gpu_id=gpu_id)


def backend_environment(placement: RankPlacement, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Variables to set before the backend is imported so that it uses only the chosen device."""
    if placement.gpu_id is None:
        # An empty list hides every GPU: a CPU rank (the scheduler above all) never opens a CUDA context.
        variables = {"CUDA_VISIBLE_DEVICES": ""}
        if placement.backend == "jax":
            variables["JAX_PLATFORMS"] = "cpu"  # else a CUDA jaxlib warns that it found no GPU
        return variables
    variables = {"CUDA_VISIBLE_DEVICES": placement.gpu_id}
    if placement.backend == "tensorflow" and "TF_FORCE_GPU_ALLOW_GROWTH" not in environ:
        variables["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
    jax_memory = ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_ALLOCATOR")
    if placement.backend == "jax" and not any(name in environ for name in jax_memory):
        # JAX takes 75 % of the GPU at start-up by default: a second worker on the same GPU would fail.
        variables["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    return variables


def backend_started(backend: str) -> bool:
    """Whether this process's backend has already started its runtime, which has then read the visible
    GPUs and sized its thread pools for good (a script that built or ran a model before the job began)."""
    module = sys.modules.get(BACKEND_MODULES.get(backend, backend))
    if module is None:
        return False
    if backend == "torch":
        return bool(module.cuda.is_initialized())
    if backend == "jax":
        bridge = sys.modules.get("jax._src.xla_bridge")
        return bool(bridge is not None and bridge.backends_are_initialized())
    threading = module.config.threading  # TensorFlow refuses a new pool size once its runtime runs
    current = threading.get_inter_op_parallelism_threads()
    try:
        threading.set_inter_op_parallelism_threads(current + 1)
    except RuntimeError:
        return True
    threading.set_inter_op_parallelism_threads(current)
    return False


def refuse_started_backend(placement: RankPlacement, inventory: GpuInventory) -> None:
    """A backend that started before the GPUs were dealt sees every GPU of the node: refuse it there."""
    if not inventory.ids:
        return
    raise ConfigError(f"rank {placement.rank} on {placement.host}: the Keras backend {placement.backend!r} "
                      f"started before mpi_trainer dealt this node's {len(inventory.ids)} GPUs to its ranks (the "
                      f"script built or ran a model first), so every rank would see every GPU. Received: a "
                      f"{placement.backend} runtime already running; expected `mpi_trainer.init()` at the top "
                      f"of the script, before Keras builds anything (or the model passed as a function)")


def backend_sees_gpu(backend: str) -> bool:
    """Whether the (now imported) backend has a GPU to run on; starts CUDA, so only GPU ranks call it."""
    if backend == "jax":
        import jax

        return any(device.platform == "gpu" for device in jax.devices())
    if backend == "torch":
        import torch

        return bool(torch.cuda.is_available())
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


def confirm_placement(placement: RankPlacement, requested: Device | SchedulerDevice,
                      sees_gpu: Callable[[str], bool]) -> RankPlacement:
    """Check that the backend really runs on the chosen GPU (a CPU-only build would train on CPU).

    ``auto`` falls back to the CPU; an explicit ``gpu`` fails before training.
    """
    if placement.gpu_id is None or sees_gpu(placement.backend):
        return placement
    if requested == "auto":
        return replace(placement, device="cpu", gpu_id=None)
    key = "train.scheduler_device" if placement.is_scheduler else "train.device"
    raise ConfigError(f"`{key}` asks for a GPU and node {placement.host} has GPU {placement.gpu_id}, but the "
                      f"Keras backend {placement.backend!r} sees no GPU (a CPU-only build?). Received: "
                      f"{key}='gpu'; expected a CUDA build of {placement.backend}, or {key}='cpu'")
