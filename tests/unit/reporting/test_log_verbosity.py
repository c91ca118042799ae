"""``log.verbosity``: what each rank's log shows."""

from __future__ import annotations

from mpi_trainer.logs import get_logger, setup_logging


def test_workers_speak_at_verbosity_2_only(capsys):
    setup_logging(1, 3, "host", 1)
    get_logger().info("quiet")
    setup_logging(1, 3, "host", 2)
    get_logger().debug("loud")
    out = capsys.readouterr().out
    assert "quiet" not in out and "[rank 1/3 host] DEBUG loud" in out
