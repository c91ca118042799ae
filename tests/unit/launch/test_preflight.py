"""The preflight's table, verdict and data check, without MPI."""

from __future__ import annotations

import numpy as np

from mpi_trainer.launch.preflight import RankReport, check_data, format_rank_table, verdict


def _report(rank: int, **changes) -> RankReport:
    report = RankReport(rank, f"node{rank}", 100 + rank, data="digits: 1294 training rows", data_ok=True)
    for key, value in changes.items():
        setattr(report, key, value)
    return report


def test_all_ranks_passing_gives_no_verdict_and_a_row_each():
    reports = [_report(0), _report(1, probe_seconds=0.5)]
    assert verdict(reports) is None
    table = format_rank_table(reports, probe_bytes=1_000_000).splitlines()
    assert len(table) == 3
    assert table[2].split()[:5] == ["1", "node1", "101", "1/1", "ok"]
    assert "500.0 ms (4 MB/s)" in table[2]  # 2 MB moved in half a second


def test_unreached_peers_missing_reports_and_bad_data_are_named():
    reports = [_report(0, unreached=[2]), _report(1, data_ok=False, data="cannot read: x"), 2]
    assert verdict(reports) == "rank(s) 0, 1, 2 failed (see the table)"
    table = format_rank_table(reports, probe_bytes=1)
    assert "1/2 (missing 2)" in table and "cannot read: x" in table
    assert "   2  no report within the timeout" in table


def test_a_timed_out_sum_fails_that_rank_only_and_the_table_says_why():
    reports = [_report(0), _report(1, collective="timed out after 5 s"), _report(2)]
    assert verdict(reports) == "rank(s) 1 failed (see the table)"
    row = format_rank_table(reports, probe_bytes=1).splitlines()[2]  # a header line, then one row per rank
    assert row.split()[:2] == ["1", "node1"] and "timed out after 5 s" in row


def test_one_rank_alone_cannot_train():
    assert "mpirun -n 2" in verdict([_report(0)])


def test_check_data_reads_a_file_or_explains_why_not(tmp_path):
    path = tmp_path / "set.npz"
    np.savez(path, x=np.random.default_rng(0).random((50, 4)), y=np.arange(50) % 2)
    config = tmp_path / "c.toml"
    config.write_text(f'[data]\nsource = "{path}"\n')
    assert check_data(1, str(config), []) == (True, f"{path}: 40 training rows")
    assert check_data(1, str(config), ["data.placement=scatter"])[1].endswith(
        "not read here (scatter: rank 0 sends the rows)")
    ok, message = check_data(1, str(config), [f"data.source='{tmp_path / 'gone.npz'}'"])
    assert not ok and message.startswith("cannot read:") and "gone.npz" in message
