"""The suites, one per question; each module has ``QUESTION`` and ``comparisons(quick)``, and may have
``unavailable()`` (why it cannot run on this machine, or "") and ``prepared()`` (a context around its runs)."""

from __future__ import annotations

from benchmarks.suites import (
    accuracy,
    bandwidth,
    big_models,
    communication,
    data_inputs,
    faults,
    gpu,
    keras_fit,
    lbfgs,
    long_epoch,
    node_memory,
    observability,
    pipelines,
    run_directory,
    scaling,
    schedules,
    stragglers,
    survive,
    synchronous,
    throughput,
    transport,
)

SUITES = {module.__name__.rsplit(".", 1)[1]: module
          for module in (throughput, accuracy, scaling, schedules, communication, transport, bandwidth, stragglers,
                         faults, survive, run_directory, observability, keras_fit, lbfgs, gpu, data_inputs,
                         pipelines, big_models, node_memory, synchronous, long_epoch)}
