"""The userland of an emulated Arm (aarch64) device, built by the project's own code: a
root of Debian's arm64 packages (its ``python3.11`` and the C/C++ runtime the wheels link)
and a site of aarch64 wheels from PyPI at the host's versions, run under ``qemu-aarch64
-L ROOT``. It lives in this environment (``.venv/share/bitdrift/aarch64``), is built once
by ``bitdrift install-aarch64`` and is complete only once its manifest is written (a
build cut off midway leaves nothing that looks installed).

QEMU 7.2 (Debian bookworm) crashes in LiteRT's interpreter and ONNX Runtime's import
(segmentation faults, measured on neoverse-n1 and max); QEMU 10 (trixie) runs both, so an
Arm device needs QEMU 8 or newer, which ``install-aarch64`` fetches.
"""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from importlib import metadata
from pathlib import Path

from bitdrift.errors import InstallError

# Runtimes with an aarch64 CPU wheel on PyPI that the site holds. torch's aarch64 wheel on
# PyPI is its CUDA build; TensorFlow, JAX and OpenVINO are not built into the site yet.
RUNTIMES = {"litert": ("ai-edge-litert",), "onnxruntime": ("onnxruntime", "onnx")}
# What a worker of those runtimes imports besides the runtime (bitdrift's own worker path)
WORKER_PACKAGES = ("numpy", "h5py", "py-cpuinfo", "jsonschema", "pyyaml", "tqdm")
# Debian's arm64 packages of the interpreter and of what the wheels link (libstdc++,
# OpenMP); their dependencies are resolved from the index
ROOT_PACKAGES = ("python3.11-minimal", "libpython3.11-stdlib", "libstdc++6", "libgomp1")
# Packages a root that only runs python needs none of (maintainer scripts, configuration)
NOT_NEEDED = {"debconf", "dpkg", "perl-base", "tzdata", "media-types", "install-info",
              "readline-common", "debianutils", "base-files"}
ROOT_SUITE = "bookworm"  # python3.11, the host's minor version
PYTHON = "usr/bin/python3.11"
# manylinux tags the wheels are built for (LiteRT: 2_27, ONNX Runtime: 2_28)
PLATFORMS = ("manylinux_2_28_aarch64", "manylinux_2_27_aarch64", "manylinux_2_17_aarch64",
             "manylinux2014_aarch64")
LEAST_QEMU = (8, 0)
QEMU_SUITE = "trixie"  # QEMU 10
MANIFEST = "manifest.json"


def folder(prefix: Path | str | None = None) -> Path:
    """Where the userland lives: ``prefix`` (default: this environment) /share/bitdrift."""
    return Path(prefix or sys.prefix) / "share" / "bitdrift" / "aarch64"


def installed(prefix: Path | str | None = None) -> dict | None:
    """The manifest of a complete build, else None."""
    try:
        return json.loads((folder(prefix) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def parse_index(text: str) -> dict[str, dict]:
    """{package: fields} of a Debian ``Packages`` index; a virtual package (Provides) maps
    to its first provider."""
    packages, provided = {}, {}
    for stanza in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines()
                      if ": " in line and not line.startswith(" "))
        if "Package" not in fields:
            continue
        packages[fields["Package"]] = fields
        for name in fields.get("Provides", "").split(","):
            provided.setdefault(name.strip().split(" ")[0], fields)
    return {**{name: fields for name, fields in provided.items() if name}, **packages}


def resolve(index: dict[str, dict], wanted=ROOT_PACKAGES) -> list[dict]:
    """The packages ``wanted`` needs (Pre-Depends and Depends, first alternative), without
    those a python-only root does not run."""
    seen, queue, found = set(), list(wanted), []
    while queue:
        name = queue.pop()
        if name in seen or name in NOT_NEEDED:
            continue
        seen.add(name)
        fields = index.get(name)
        if fields is None:
            raise InstallError(f"install-aarch64: Debian's arm64 index has no {name!r}")
        if fields["Package"] != name and fields["Package"] in seen:
            continue
        seen.add(fields["Package"])
        found.append(fields)
        for field in ("Pre-Depends", "Depends"):
            for alternatives in filter(None, (a.strip() for a in fields.get(field, "").split(","))):
                queue.append(alternatives.split("|")[0].strip().split(" ")[0].split(":")[0])
    return sorted(found, key=lambda fields: fields["Package"])


def unpack_deb(data: bytes, name: str, root: Path) -> None:
    """A .deb's data archive into ``root`` (links kept: the root's libraries are links)."""
    from bitdrift.emulation import ar_members

    with tempfile.NamedTemporaryFile(suffix=".deb") as deb:
        deb.write(data)
        deb.flush()
        members = ar_members(Path(deb.name))
    member = next((key for key in members if key.startswith("data.tar")), None)
    if member is None:
        raise InstallError(f"install-aarch64: {name} holds no data.tar")
    offset, size = members[member]
    with tarfile.open(fileobj=io.BytesIO(data[offset:offset + size]), mode="r:*") as archive:
        archive.extractall(root, filter="tar")


def build_root(root: Path, mirror: str, suite: str = ROOT_SUITE) -> list[str]:
    """Debian's arm64 python3.11 and the libraries the wheels link, unpacked into
    ``root``, each package checked against the index's SHA-256. Returns name=version."""
    from bitdrift.emulation import _fetch

    index = parse_index(lzma.decompress(_fetch(
        f"{mirror}/dists/{suite}/main/binary-arm64/Packages.xz")).decode("utf-8", "replace"))
    packages = resolve(index)
    for fields in packages:
        data = _fetch(f"{mirror}/{fields['Filename']}")
        if hashlib.sha256(data).hexdigest() != fields.get("SHA256"):
            raise InstallError(f"install-aarch64: {fields['Filename']} does not match the "
                               f"SHA-256 of {suite}'s index (a broken download or mirror)")
        unpack_deb(data, fields["Filename"], root)
    if not (root / PYTHON).is_file() and not (root / PYTHON).is_symlink():
        raise InstallError(f"install-aarch64: the root lacks {PYTHON}")
    return [f"{fields['Package']}={fields.get('Version', '')}" for fields in packages]


def requirements(runtimes=tuple(RUNTIMES)) -> list[str]:
    """The site's wheels pinned to this environment's versions: an Arm record is computed
    by the same release as the host's."""
    pins = []
    for name in (*WORKER_PACKAGES, *(name for runtime in runtimes for name in RUNTIMES[runtime])):
        try:
            pins.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pins.append(name)
    return pins


def build_site(site: Path, runtimes=tuple(RUNTIMES), index_url: str | None = None) -> None:
    """The aarch64 wheels (pip for another platform: binaries only)."""
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
               "--target", str(site), "--only-binary=:all:", "--python-version", "3.11",
               "--implementation", "cp", "--abi", "cp311",
               *(f"--platform={tag}" for tag in PLATFORMS), *requirements(runtimes)]
    if index_url:
        command += ["--index-url", index_url]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise InstallError(f"install-aarch64: pip could not fetch the aarch64 wheels ({last})")


def python_path(prefix: Path | str | None = None) -> str:
    """PYTHONPATH of an Arm worker: bitdrift itself as a link to the package the host runs
    (pure Python: an Arm record is computed by the very code of its run) before the site
    of aarch64 wheels. One link folder per package location, made when first needed."""
    import bitdrift

    package = Path(bitdrift.__file__).resolve().parent
    links = folder(prefix) / "links" / hashlib.sha1(str(package).encode()).hexdigest()[:12]
    link = links / "bitdrift"
    if not (link.is_symlink() and link.resolve() == package):
        links.mkdir(parents=True, exist_ok=True)
        partial = links / f"bitdrift.{os.getpid()}.partial"
        partial.unlink(missing_ok=True)
        partial.symlink_to(package)
        os.replace(partial, link)
    return os.pathsep.join([str(links), str(folder(prefix) / "site")])


def install(prefix: Path | str | None = None, mirror: str | None = None,
            runtimes=tuple(RUNTIMES)) -> dict:
    """QEMU (aarch64, 8 or newer), the arm64 root and the aarch64 site, into ``prefix``;
    built beside and moved into place whole. Returns the manifest."""
    from bitdrift.emulation import DEBIAN_MIRROR, install_qemu, qemu_path, qemu_version

    mirror = mirror or DEBIAN_MIRROR
    qemu = qemu_path("qemu-aarch64")
    if qemu is None or version_tuple(qemu_version("qemu-aarch64")) < LEAST_QEMU:
        install_qemu(prefix or sys.prefix, ("aarch64",), mirror, QEMU_SUITE)
    target = folder(prefix)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix="aarch64.partial-", dir=target.parent))
    try:
        packages = build_root(partial / "root", mirror)
        build_site(partial / "site", runtimes)
        manifest = {"packages": packages, "wheels": requirements(runtimes),
                    "runtimes": list(runtimes), "qemu": qemu_version("qemu-aarch64")}
        (partial / MANIFEST).write_text(json.dumps(manifest, indent=1))
        if target.exists():
            shutil.rmtree(target)
        os.replace(partial, target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return manifest


def ensure(out: Path | str, prefix: Path | str | None = None) -> dict:
    """The userland, built unless a complete one is there; its manifest written to ``out``
    (atomically: the workflow's mark that Arm devices can run)."""
    from bitdrift.atomic import atomic_output

    manifest = installed(prefix) or install(prefix)
    with atomic_output(out) as tmp:
        Path(tmp).write_text(json.dumps({**manifest, "folder": str(folder(prefix))}, indent=1))
    return manifest


def version_tuple(version: str) -> tuple[int, ...]:
    """``10.0.13 (Debian ...)`` -> (10, 0, 13); unknown -> (0,)."""
    head = version.split(" ")[0].split("+")[0]
    try:
        return tuple(int(part) for part in head.split(".") if part.isdigit()) or (0,)
    except ValueError:
        return (0,)
