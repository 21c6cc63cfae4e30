"""runleader's heartbeat file (``--watchdog``): its directory is made again, never taken
over, when a cleaner of the temporary directory removed it."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from django_leader.payload import HeartbeatFile


def test_a_directory_put_back_by_someone_else_is_not_used(tmp_path: Path) -> None:
    """The directory is removed (a temp cleaner), and another takes its path: open to all,
    with a symlink named ``heartbeat``. The next child gets a new private directory; the
    symlink's target is never created."""
    heartbeat = HeartbeatFile()
    try:
        heartbeat.reset()
        old_directory, old_path = heartbeat.directory, heartbeat.path
        shutil.rmtree(old_directory)
        os.mkdir(old_directory)
        os.chmod(old_directory, 0o777)
        target = tmp_path / "target"
        os.symlink(target, old_path)

        heartbeat.reset()

        assert not target.exists(), "the heartbeat went through the symlink"
        assert heartbeat.directory != old_directory
        st = os.lstat(heartbeat.directory)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
        assert stat.S_ISREG(os.lstat(heartbeat.path).st_mode)
        assert heartbeat.idle() < 5
    finally:
        heartbeat.close()
        shutil.rmtree(old_directory, ignore_errors=True)
    assert not os.path.exists(heartbeat.directory)


def test_a_directory_still_in_place_is_kept() -> None:
    heartbeat = HeartbeatFile()
    try:
        heartbeat.reset()
        directory = heartbeat.directory
        os.utime(heartbeat.path, (1, 1))
        heartbeat.reset()
        assert heartbeat.directory == directory
    finally:
        heartbeat.close()
