"""`./quickstart` stops before installing when the disk is too full, naming the folder and
what is free: a full disk once failed pip half way through CI's install."""

import subprocess

import pytest

from tests.utils import ROOT


def quickstart_on_disks(folder, command: str, checkout_size: str, temporary: str):
    """Run a copy of quickstart (no .venv/ beside it) in a private mount namespace (a user
    namespace, so no root is needed): its folder on a tmpfs of ``checkout_size``, TMPDIR
    as ``temporary`` says ("small": a 1 MB tmpfs of its own; "same": the checkout's
    folder; "missing": a folder that does not exist). PYTHON=false makes an install that
    should not have started fail at once."""
    checkout, small = folder / "checkout", folder / "small"
    checkout.mkdir()
    small.mkdir()
    tmpdir = {"small": small, "same": checkout, "missing": folder / "missing"}[temporary]
    script = (f"mount -t tmpfs -o size={checkout_size} tmpfs {checkout} && "
              f"mount -t tmpfs -o size=1m tmpfs {small} && "
              f"cp {ROOT / 'quickstart'} {checkout}/ && "
              f"for disk in {checkout} {small}; do df -Pk $disk | "
              "awk 'NR == 2 { print \"free_kb=\" $4 }'; done && "
              f"TMPDIR={tmpdir} PYTHON=false {checkout}/quickstart {command}; "
              "echo status=$?; ls -A " + str(checkout))
    done = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                           script], capture_output=True, text=True, timeout=60)
    if "free_kb=" not in done.stdout:
        pytest.skip(f"this kernel lets no user namespace mount a tmpfs: {done.stderr.strip()}")
    free = [int(line.split("=")[1]) * 1024 // 10**9
            for line in done.stdout.splitlines() if line.startswith("free_kb=")]
    status = int(done.stdout.split("status=")[1].split()[0])
    left = done.stdout.split("status=")[1].split()[1:]
    return free, status, left, done.stderr


@pytest.mark.parametrize("command, checkout_size, temporary, full_disk, need", [
    ("run", "64g", "small", "small", 2),  # the temporary folder alone too small
    ("test", "64g", "small", "small", 3),
    ("run", "1m", "same", "checkout", 7),  # one disk for both: the needs add up
    ("test", "1m", "same", "checkout", 11),
    ("run", "1m", "missing", "checkout", 5),  # TMPDIR missing: pip would use /tmp
])
def test_quickstart_refuses_a_full_disk_before_installing(tmp_path, command, checkout_size,
                                                          temporary, full_disk, need):
    free, status, left, stderr = quickstart_on_disks(tmp_path, command, checkout_size,
                                                     temporary)
    free_gb = free[0] if full_disk == "checkout" else free[1]
    assert status == 1, stderr
    assert (f"quickstart: {free_gb} GB free on the disk of {tmp_path / full_disk}, and "
            f"'./quickstart {command}' needs about {need} GB there" in stderr), stderr
    assert left == ["quickstart"]  # nothing was installed


def test_quickstart_goes_on_to_install_when_there_is_room(tmp_path):
    """The check passes on big enough disks: the install then starts (and fails at once on
    PYTHON=false, which proves it started)."""
    free, status, left, stderr = quickstart_on_disks(tmp_path, "test", "64g", "same")
    assert free[0] >= 11
    assert status == 1 and "quickstart:" not in stderr, stderr  # `false -m venv` failed
    assert left == ["quickstart"]
