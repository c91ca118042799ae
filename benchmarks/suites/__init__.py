"""The suites, one per question; each module has ``QUESTION`` and ``comparisons(quick)``."""

from __future__ import annotations

from benchmarks.suites import communication, faults, observability, scaling, stragglers, survive, throughput

SUITES = {module.__name__.rsplit(".", 1)[1]: module
          for module in (throughput, communication, stragglers, faults, survive, observability, scaling)}
