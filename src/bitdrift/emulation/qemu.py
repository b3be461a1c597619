"""QEMU's user-mode emulators, found in this environment or on the PATH, and Debian's
statically linked build of them fetched where no apt-get is (``bitdrift install-qemu``);
the Debian index and .deb readers that the aarch64 userland (bitdrift.emulation.aarch64) uses too.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

from bitdrift.errors import InstallError

QEMU = "qemu-x86_64"
ARM_QEMU = "qemu-aarch64"


def qemu_path(name: str = QEMU) -> str | None:
    """QEMU in this environment's own ``bin`` (where ``bitdrift install-qemu`` puts it, and
    what a SLURM node's environment carries), else on the PATH."""
    return shutil.which(name, path=os.pathsep.join([str(Path(sys.prefix) / "bin"),
                                                    os.environ.get("PATH", "")]))


# -- QEMU where no apt-get is: Debian's statically linked build ---------------------------------
DEBIAN_MIRROR = "https://deb.debian.org/debian"
DEBIAN_SUITE = "bookworm"  # QEMU 7.2, the version the emulation check was measured with
# The package of static emulators: qemu-user-static up to bookworm (qemu-TARGET-static);
# from trixie on, qemu-user itself is static (qemu-TARGET) and qemu-user-static transitional
STATIC_PACKAGES = ("qemu-user-static", "qemu-user")


def static_entry(index: str) -> dict:
    """The index's package of statically linked emulators (see STATIC_PACKAGES)."""
    for package in STATIC_PACKAGES:
        try:
            entry = package_entry(index, package)
        except InstallError:
            continue
        description = entry.get("Description", "").lower()
        if "transitional" not in description and (package.endswith("-static")
                                                  or "static" in description):
            return entry
    raise InstallError("install-qemu: the index has no static QEMU "
                       f"({' or '.join(STATIC_PACKAGES)})")


def check_mirror(mirror: str) -> str:
    """``--mirror`` as a URL urllib can fetch from (http, https, ftp or file), else one
    line naming the option."""
    from urllib.parse import urlsplit

    from bitdrift.errors import ConfigError

    parts = urlsplit(str(mirror))
    if parts.scheme not in ("http", "https", "ftp", "file") or \
            (parts.scheme != "file" and not parts.netloc):
        raise ConfigError(f"--mirror {mirror!r}: not the URL of a Debian mirror (e.g. "
                          f"{DEBIAN_MIRROR}, or file:///path for a local copy)")
    return str(mirror).rstrip("/")


def index_stanzas(index: str):
    """The fields of each package of a Debian ``Packages`` index, one dict per stanza
    (continuation lines left out)."""
    for stanza in index.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines()
                      if ": " in line and not line.startswith(" "))
        if "Package" in fields:
            yield fields


def package_entry(index: str, package: str) -> dict:
    """The fields of ``package`` in a Debian ``Packages`` index (its stanza)."""
    for fields in index_stanzas(index):
        if fields["Package"] == package:
            return fields
    raise InstallError(f"the Debian index has no package {package!r}")


def deb_data(deb: bytes, name: str) -> bytes:
    """The data archive (``data.tar.*``) of a .deb, an ``ar`` archive, given its bytes."""
    if deb[:8] != b"!<arch>\n":
        raise InstallError(f"{name} is not a Debian package (no ar header)")
    position = 8
    while position + 60 <= len(deb):
        header = deb[position:position + 60]
        member = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        position += 60
        if member.startswith("data.tar"):
            return deb[position:position + size]
        position += size + size % 2
    raise InstallError(f"{name} holds no data.tar")


def extract_from_deb(deb: bytes, name: str, wanted: dict[str, Path]) -> None:
    """Write each ``wanted`` file of the .deb's data archive ({path in the package: out}),
    atomically (a half-written QEMU must never look installed)."""
    import io
    import tarfile

    found = set()
    with tarfile.open(fileobj=io.BytesIO(deb_data(deb, name)),
                      mode="r:*") as archive:
        for member in archive:
            name = member.name.removeprefix("./")
            if name not in wanted or not member.isfile():
                continue
            out = wanted[name]
            out.parent.mkdir(parents=True, exist_ok=True)
            partial = out.with_name(out.name + ".partial")
            with archive.extractfile(member) as source, open(partial, "wb") as target:
                shutil.copyfileobj(source, target, 1 << 20)
            partial.chmod(0o755)
            os.replace(partial, out)
            found.add(name)
            if {str(one) for one in wanted.values()} <= {str(wanted[one]) for one in found}:
                break  # the rest of the archive (measured: 97 % of its unpacking) unread
    # a file offered under several names (``wanted`` maps each to one out) is there once one is
    missing = sorted({str(out) for name, out in wanted.items() if name not in found}
                     - {str(wanted[name]) for name in found})
    if missing:
        raise InstallError(f"install-qemu: {name} lacks {', '.join(missing)}")


def install_qemu(prefix: Path | str | None = None, targets=("x86_64",),
                 mirror: str = DEBIAN_MIRROR, suite: str = DEBIAN_SUITE) -> dict:
    """Debian's statically linked QEMU user-mode emulators (of ``suite``: see
    STATIC_PACKAGES) into ``prefix``/bin as ``qemu-TARGET``: for cluster nodes without Debian or
    root (a conda environment's post-deploy script runs it). The package is checked
    against the SHA-256 in the suite's index and kept in the user's cache
    (bitdrift.emulation.cache). Returns {"version", "installed": [paths]}."""
    import lzma

    from bitdrift.emulation.cache import fetch, fetch_deb

    mirror = check_mirror(mirror)
    index = lzma.decompress(fetch(f"{mirror}/dists/{suite}/main/binary-amd64/Packages.xz"))
    entry = static_entry(index.decode("utf-8", "replace"))
    bindir = Path(prefix or sys.prefix) / "bin"
    url = f"{mirror}/{entry['Filename']}"
    wanted = {f"usr/bin/qemu-{target}{suffix}": bindir / f"qemu-{target}"
              for target in targets for suffix in ("-static", "")}
    extract_from_deb(fetch_deb(url, entry.get("SHA256", ""), "install-qemu"), url, wanted)
    return {"version": entry.get("Version", ""),
            "installed": sorted({str(path) for path in wanted.values()})}


def qemu_version(name: str = QEMU) -> str:
    """The version the emulator ``name`` found here prints; asked once per binary (an Arm
    device's every fresh worker checks it), again when the file is replaced."""
    path = qemu_path(name) or name
    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError:
        stamp = None
    return _version_of(path, stamp)


@functools.cache
def _version_of(path: str, stamp: int | None) -> str:
    try:
        first = subprocess.run([path, "--version"], capture_output=True,
                               text=True, timeout=30).stdout.splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return first[0].split("version", 1)[-1].strip() if first else "unknown"
