"""A run directory is the running user's alone: someone else's, or one with planted links, is refused."""

from __future__ import annotations

import os
import pwd

import pytest

from mpi_trainer.errors import ConfigError
from mpi_trainer.logs import add_log_file, get_logger
from mpi_trainer.persistence.run_dir_owner import check_run_dir_owner
from mpi_trainer.persistence.run_lock import RunLock

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")


def _nobody() -> int:
    return pwd.getpwnam("nobody").pw_uid


@as_root
def test_a_run_directory_another_user_created_is_refused_naming_the_owner(tmp_path):
    run_dir = tmp_path / "theirs"
    run_dir.mkdir(mode=0o700)
    os.chown(run_dir, _nobody(), -1)
    with pytest.raises(ConfigError, match=r"it is owned by nobody \(mode drwx------\).*Received: run_dir="):
        RunLock(run_dir).acquire()
    assert list(run_dir.iterdir()) == []  # nothing written into it


@as_root
def test_another_users_link_to_a_root_only_directory_is_refused(tmp_path):
    private = tmp_path / "root-only"
    private.mkdir(mode=0o700)
    link = tmp_path / "run"
    link.symlink_to(private)
    os.lchown(link, _nobody(), -1)
    with pytest.raises(ConfigError, match=r"run is a symbolic link owned by nobody"):
        RunLock(link).acquire()
    assert list(private.iterdir()) == []


def test_a_planted_run_lock_link_is_not_written_through(tmp_path):
    target = tmp_path / "precious"
    target.write_text("root's file\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.lock").symlink_to(target)
    with pytest.raises(ConfigError, match=r"symbolic links: run.lock -> .*precious"):
        RunLock(run_dir).acquire()
    assert target.read_text() == "root's file\n"


def test_a_planted_train_log_link_is_not_written_through(tmp_path):
    target = tmp_path / "precious"
    target.write_text("root's file\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "train.log").symlink_to(target)
    with pytest.raises(ConfigError, match=r"train.log -> "):
        check_run_dir_owner(run_dir)
    with pytest.raises(OSError, match="never written through"):  # and the writer itself will not follow it
        add_log_file(run_dir / "train.log")
    get_logger().warning("not for the planted file")
    assert target.read_text() == "root's file\n"


def test_a_parent_others_can_write_without_the_sticky_bit_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match=r"shared .*is writable by others without the sticky bit"):
        check_run_dir_owner(shared / "run")
    shared.chmod(0o1777)  # as /tmp: the sticky bit keeps others from renaming what is not theirs
    check_run_dir_owner(shared / "run")
    RunLock(shared / "run").acquire().release()


def test_the_users_own_directory_and_a_new_one_pass(tmp_path):
    check_run_dir_owner(tmp_path)
    check_run_dir_owner(tmp_path / "new" / "run")
    (tmp_path / "mine").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "mine")  # the user's own link is fine
    check_run_dir_owner(tmp_path / "link")
