"""`./quickstart` stops before installing when the disk is too full, naming the folder and
what is free: a full disk once failed pip half way through CI's install."""

import shutil
import subprocess

import pytest

from tests.utils import ROOT

SMALL_DISK = "1m"


def quickstart_on_a_small_disk(folder, command: str) -> subprocess.CompletedProcess:
    """Run a copy of quickstart in ``folder`` (no .venv there) with TMPDIR on a 1 MB tmpfs
    of a private mount namespace (as root or not, through a user namespace)."""
    shutil.copy(ROOT / "quickstart", folder / "quickstart")
    small = folder / "small"
    small.mkdir()
    script = (f"mount -t tmpfs -o size={SMALL_DISK} tmpfs {small} && "
              f"df -Pk {small} | awk 'NR == 2 {{ print \"free_kb=\" $4 }}' && "
              f"TMPDIR={small} {folder / 'quickstart'} {command}")
    return subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                           script], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("command, need", [("run", 6), ("test", 10)])
def test_quickstart_refuses_a_full_disk_before_installing(tmp_path, command, need):
    done = quickstart_on_a_small_disk(tmp_path, command)
    if done.returncode != 0 and "free_kb=" not in done.stdout:
        pytest.skip(f"this kernel lets no user namespace mount a tmpfs: {done.stderr.strip()}")
    free_kb = int(done.stdout.split("free_kb=")[1].split()[0])
    assert free_kb < 1024 * 1024  # the disk the test made
    assert done.returncode == 1, done.stderr
    assert (f"{free_kb // 1048576} GB free on the disk of {tmp_path / 'small'}"
            in done.stderr)
    assert f"'./quickstart {command}' needs about {need} GB" in done.stderr
    # nothing was installed
    assert sorted(path.name for path in tmp_path.iterdir()) == ["quickstart", "small"]
