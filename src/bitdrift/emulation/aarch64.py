"""The userland of an emulated Arm (aarch64) device, built by the project's own code: a
root of Debian's arm64 packages (its ``python3.11`` and the C/C++ runtime the wheels link)
and a site of aarch64 wheels from PyPI at the host's versions, run under ``qemu-aarch64
-L ROOT``. It lives in this environment (``.venv/share/bitdrift/aarch64``), is built once
by ``bitdrift install-aarch64`` and is complete only once its manifest is written (a
build cut off midway leaves nothing that looks installed). What a build fetches and the
site it makes are kept in the user's cache for the next environment
(bitdrift.emulation.cache).

QEMU 7.2 (Debian bookworm) crashes in LiteRT's interpreter and ONNX Runtime's import
(segmentation faults, measured on neoverse-n1 and max); QEMU 10 (trixie) runs both, so an
Arm device needs QEMU 10 or newer, which ``install-aarch64`` fetches.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from bitdrift.errors import InstallError, json_kind

# The runtimes the site can hold and the wheels each needs, what it holds unless more is
# asked for, and the host's distribution of a wheel of another name: data of the runtimes
# (bitdrift.runtimes), under the names this module has always given them
from bitdrift.runtimes import AARCH64_DEFAULT as DEFAULT_RUNTIMES
from bitdrift.runtimes import AARCH64_WHEELS as RUNTIMES
from bitdrift.runtimes import HOST_DISTRIBUTIONS

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
# manylinux tags the root's glibc (bookworm: 2.36) runs, newest first (LiteRT: 2_27, ONNX
# Runtime: 2_28, TensorFlow: 2_17)
PLATFORMS = (*(f"manylinux_2_{minor}_aarch64" for minor in range(36, 16, -1)),
             "manylinux2014_aarch64")
LEAST_QEMU = (10, 0)  # measured: 7.2 crashes, 10.0 runs; 8 and 9 not tried
QEMU_SUITE = "trixie"  # QEMU 10
MANIFEST = "manifest.json"


def folder(prefix: Path | str | None = None) -> Path:
    """Where the userland lives: ``prefix`` (default: this environment) /share/bitdrift."""
    return Path(prefix or sys.prefix) / "share" / "bitdrift" / "aarch64"


def installed(prefix: Path | str | None = None) -> dict | None:
    """The manifest of a complete build, else None (none was built, or a build was cut
    off before its manifest). A manifest of the wrong shape, or a build that lost its
    root's python since, is refused naming the file (InstallError)."""
    manifest, problem = _read_manifest(prefix)
    if problem:
        raise InstallError(f"{problem}; run `bitdrift install-aarch64` to build it anew")
    return manifest


def _read_manifest(prefix) -> tuple[dict | None, str | None]:
    """(the manifest, None), (None, None) where none is, or (None, what is wrong)."""
    path = folder(prefix) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as error:
        return None, f"{path}: not a readable manifest ({error})"
    if not isinstance(manifest, dict):
        return None, f"{path}: not a manifest of `bitdrift install-aarch64` " \
            f"({json_kind(manifest)}, not an object)"
    # what is read of it: the runtimes and pins (stale), the packages and QEMU (reported)
    for key, what, required in (("runtimes", "a list of runtimes", True),
                                ("wheels", "a list of pins", True),
                                ("packages", "a list of packages", False)):
        value = manifest.get(key, None if required else [])
        if not isinstance(value, list) or not all(isinstance(one, str) for one in value):
            return None, f"{path}: key {key!r} is not {what}"
    unknown = sorted(set(manifest["runtimes"]) - set(RUNTIMES))
    if unknown:
        return None, f"{path}: key 'runtimes' names {', '.join(unknown)}, not an aarch64 runtime"
    if not isinstance(manifest.get("qemu", ""), str):
        return None, f"{path}: key 'qemu' is not QEMU's version"
    python = path.parent / "root" / PYTHON
    if not python.is_file() and not python.is_symlink():
        return None, f"{path.parent}: the userland lacks root/{PYTHON} (removed since it " \
            "was built)"
    if not (path.parent / "site").is_dir():
        return None, f"{path.parent}: the userland lacks its site/ of aarch64 wheels " \
            "(removed since it was built)"
    return manifest, None


def parse_index(text: str) -> dict[str, dict]:
    """{package: fields} of a Debian ``Packages`` index; a virtual package (Provides) maps
    to its first provider."""
    from bitdrift.emulation.qemu import index_stanzas

    packages, provided = {}, {}
    for fields in index_stanzas(text):
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
    import io
    import tarfile

    from bitdrift.emulation.qemu import deb_data

    with tarfile.open(fileobj=io.BytesIO(deb_data(data, name)), mode="r:*") as archive:
        archive.extractall(root, filter="tar")


def build_root(root: Path, mirror: str, suite: str = ROOT_SUITE) -> list[str]:
    """Debian's arm64 python3.11 and the libraries the wheels link, unpacked into
    ``root``, each package checked against the index's SHA-256 (kept in the user's cache,
    bitdrift.emulation.cache). Returns name=version."""
    import lzma

    from bitdrift.emulation.cache import fetch, fetch_deb

    index = parse_index(lzma.decompress(fetch(
        f"{mirror}/dists/{suite}/main/binary-arm64/Packages.xz")).decode("utf-8", "replace"))
    packages = resolve(index)
    for fields in packages:
        deb = fetch_deb(f"{mirror}/{fields['Filename']}", fields.get("SHA256", ""),
                        "install-aarch64")
        unpack_deb(deb, fields["Filename"], root)
    if not (root / PYTHON).is_file() and not (root / PYTHON).is_symlink():
        raise InstallError(f"install-aarch64: the root lacks {PYTHON}")
    return [f"{fields['Package']}={fields.get('Version', '')}" for fields in packages]


def requirements(runtimes=DEFAULT_RUNTIMES) -> list[str]:
    """The site's wheels pinned to this environment's versions: an Arm record is computed
    by the same release as the host's."""
    from importlib import metadata
    pins = []
    for name in dict.fromkeys((*WORKER_PACKAGES, *(name for runtime in sorted(runtimes)
                                                   for name in RUNTIMES[runtime]))):
        for host_name in HOST_DISTRIBUTIONS.get(name, (name,)):
            try:
                pins.append(f"{name}=={metadata.version(host_name)}")
                break
            except metadata.PackageNotFoundError:
                continue
        else:
            raise InstallError(f"install-aarch64: this environment has no {name}, whose "
                               "version the aarch64 wheel must match; install it here first")
    return pins


def site_pins(runtimes) -> dict:
    """What the site of ``runtimes`` is built from: a site of the very same pins is the
    same site (the key of the user's cache of sites)."""
    return {"wheels": requirements(runtimes), "runtimes": sorted(runtimes),
            "platforms": list(PLATFORMS), "python": "cp311"}


def take_or_build_site(site: Path, runtimes) -> None:
    """The aarch64 site of ``runtimes``: hard-linked from the user's cache where a site of
    the same pins is kept whole, else built (build_site) and kept there."""
    from bitdrift.emulation import cache

    pins = site_pins(runtimes)
    entry = cache.take_site(pins, site)
    if entry is None:
        build_site(site, runtimes)
        cache.keep_site(pins, site)
    else:
        print(f"bitdrift: the aarch64 wheels taken from the cache ({entry}: the same pins)",
              file=sys.stderr)


def build_site(site: Path, runtimes=DEFAULT_RUNTIMES, index_url: str | None = None) -> None:
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


def stale(manifest: dict) -> list[str]:
    """The pins of a built userland that this environment's versions no longer match
    (``built -> now``): an Arm record must be computed by the host's release."""
    now = requirements(manifest.get("runtimes", ()))
    built = manifest.get("wheels", [])
    return [f"{old} -> {new}" for old, new in zip(built, now, strict=False)
            if old != new] + \
        ([] if len(built) == len(now) else [f"{len(built)} wheels -> {len(now)}"])


def install(prefix: Path | str | None = None, mirror: str | None = None,
            runtimes=DEFAULT_RUNTIMES, force: bool = True) -> dict:
    """QEMU (aarch64, 10 or newer), the arm64 root and the aarch64 site with ``runtimes``
    (and those a build there already held), into ``prefix``; built beside and moved into
    place whole, one build at a time (a lock beside it); the site taken from the user's
    cache where one of the same pins is kept. Without ``force`` a complete,
    current build with these runtimes is kept."""
    unknown = sorted(set(runtimes) - set(RUNTIMES))
    if unknown:
        raise InstallError(f"install-aarch64: no aarch64 build of {', '.join(unknown)} (the "
                           f"userland can hold {', '.join(RUNTIMES)})")
    import fcntl

    from bitdrift.atomic import work_folder
    from bitdrift.emulation.qemu import (
        DEBIAN_MIRROR,
        check_mirror,
        install_qemu,
        qemu_path,
        qemu_version,
    )

    if sys.version_info[:2] != (3, 11):
        # the Arm worker runs this environment's bitdrift under bookworm's python3.11
        raise InstallError(f"install-aarch64: the aarch64 userland runs Python 3.11 (Debian "
                           f"{ROOT_SUITE}'s); this environment runs {sys.version.split()[0]}")
    mirror = check_mirror(mirror or DEBIAN_MIRROR)
    target = folder(prefix)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / "aarch64.lock", "w") as lock:
        # A second build (two workdirs, the command beside the rule) waits, then finds
        # the first one's result
        fcntl.flock(lock, fcntl.LOCK_EX)
        manifest, problem = _read_manifest(prefix)
        if problem:  # built anew, with the runtimes asked for
            print(f"bitdrift: {problem}; building it anew", file=sys.stderr)
        if not force and manifest and not stale(manifest) and \
                set(runtimes) <= set(manifest.get("runtimes", ())):
            return manifest
        runtimes = sorted(set(runtimes) | set((manifest or {}).get("runtimes", ())))
        qemu = qemu_path("qemu-aarch64")
        if qemu is None or version_tuple(qemu_version("qemu-aarch64")) < LEAST_QEMU:
            install_qemu(prefix or sys.prefix, ("aarch64",), mirror, QEMU_SUITE)
        # A killed build leaves its work folder, removed by the next build
        with work_folder(target) as work:
            partial = work / target.name
            packages = build_root(partial / "root", mirror)
            take_or_build_site(partial / "site", runtimes)
            manifest = {"packages": packages, "wheels": requirements(runtimes),
                        "installed": site_versions(partial / "site"),
                        "runtimes": list(runtimes), "qemu": qemu_version("qemu-aarch64")}
            (partial / MANIFEST).write_text(json.dumps(manifest, indent=1))
            # The old build leaves by one rename: the folder is always whole or absent
            if target.exists():
                os.replace(target, work / "old")
            os.replace(partial, target)
    return manifest


def site_versions(site: Path) -> dict[str, str]:
    """{distribution: version} of what pip put into ``site`` (its dist-info)."""
    from importlib import metadata
    return {dist.metadata["Name"].lower(): dist.version
            for dist in metadata.distributions(path=[str(site)])}


def ensure(out: Path | str, runtimes=DEFAULT_RUNTIMES,
           prefix: Path | str | None = None) -> dict:
    """The userland with ``runtimes``, built unless a complete, current one is there; its
    manifest written to ``out`` (atomically: the workflow's mark that Arm devices can
    run)."""
    from bitdrift.atomic import atomic_output

    manifest = install(prefix, runtimes=runtimes, force=False)
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
