"""Rank 0's progress: a Keras Progbar on a terminal, plain lines elsewhere, and log.verbosity."""

from __future__ import annotations

import io
import logging
import subprocess
import sys

import numpy as np

from mpi_trainer.logs import add_log_file, get_logger, setup_logging
from mpi_trainer.reporting import progress
from mpi_trainer.reporting.progress import RoundProgress, with_batch_progress

ROW = {"round": 1, "test_accuracy": 0.9, "test_loss": 0.3, "wall_seconds": 1.5, "bytes": 2_000_000,
       "block_sizes": "60;40", "worker_train_seconds": "1.2;0.8"}


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _console(capsys, verbosity: int, rank: int = 0) -> str:
    setup_logging(rank, 3, "host", verbosity)  # the console handler writes to capsys' stdout
    get_logger().info("set-up detail")
    get_logger().debug("worker detail")
    bar = RoundProgress(epochs=5)
    bar.update(ROW)
    bar.close()
    return capsys.readouterr().out


def test_verbosity_0_shows_only_the_round_line(capsys):
    out = _console(capsys, 0)
    assert "round 2/5  acc 0.9000  loss 0.3000  1.50 s  2.00 MB  eta" in out
    assert "set-up detail" not in out and "worker rank 1" not in out


def test_verbosity_1_adds_one_line_per_worker_and_rank_0_messages(capsys):
    out = _console(capsys, 1)
    assert "worker rank 1: 60 samples train 1.20 s" in out and "worker rank 2: 40 samples train 0.80 s" in out
    assert "set-up detail" in out and "worker detail" not in out


def test_workers_speak_at_verbosity_2_only(capsys):
    setup_logging(1, 3, "host", 1)
    get_logger().info("quiet")
    setup_logging(1, 3, "host", 2)
    get_logger().debug("loud")
    out = capsys.readouterr().out
    assert "quiet" not in out and "[rank 1/3 host] DEBUG loud" in out


def test_a_terminal_gets_a_progbar_and_the_log_file_still_gets_the_line(tmp_path, monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)  # where setup_logging and Keras' Progbar write
    monkeypatch.setattr(progress, "_launcher_ancestor", lambda pid: None)  # not under mpirun
    setup_logging(0, 3, "host", 0)
    add_log_file(tmp_path / "train.log")
    bar = RoundProgress(epochs=4)
    for index in range(2):
        bar.update({**ROW, "round": index})
    bar.close()
    shown = terminal.getvalue()
    assert "2/4" in shown and "acc: 0.9000" in shown  # the Progbar, with its ETA
    assert "round 2/4  acc" not in shown  # the bar shows it: no duplicate line on the console
    assert "round 2/4  acc 0.9000" in (tmp_path / "train.log").read_text()
    assert shown.endswith("\n")  # the unfinished bar's line is ended at close
    logging.getLogger("mpi_trainer").handlers.clear()


def test_under_a_launcher_whose_output_is_a_pipe_lines_are_plain(monkeypatch):
    launcher = subprocess.Popen(["sleep", "30"], stdout=subprocess.PIPE)
    try:
        monkeypatch.setattr(progress, "_launcher_ancestor", lambda pid: ("prterun", launcher.pid))
        assert not progress._is_terminal(Terminal())
        monkeypatch.setattr(progress, "_launcher_ancestor", lambda pid: ("prted", launcher.pid))
        assert not progress._is_terminal(Terminal())  # a remote daemon: the user's terminal is unknown
        monkeypatch.setattr(progress, "_launcher_ancestor", lambda pid: None)
        assert progress._is_terminal(Terminal()) and not progress._is_terminal(io.StringIO())
    finally:
        launcher.kill()
        launcher.wait()


def test_workers_log_about_ten_batch_lines_per_round_at_verbosity_2(capsys):
    import keras

    setup_logging(1, 2, "host", 2)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    model.compile("sgd", "sparse_categorical_crossentropy")
    x, y = np.zeros((250, 4), np.float32), np.zeros(250, np.int64)
    assert with_batch_progress(None, 1, 25) is None
    model.fit(x, y, batch_size=10, epochs=1, verbose=0, callbacks=with_batch_progress(None, 2, 25))
    lines = [line for line in capsys.readouterr().out.splitlines() if " batch " in line]
    shown = [int(line.split(" batch ")[1].split("/")[0]) for line in lines]
    assert shown == [3, 6, 9, 12, 15, 18, 21, 24, 25]  # every third batch of 25 (at most ten), and the last
    assert "[rank 1/2 host]" in lines[-1] and "batch 25/25  loss" in lines[-1]
