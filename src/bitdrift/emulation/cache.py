"""What the emulation installers fetch and build, kept for this user outside any checkout
(``${XDG_CACHE_HOME:-~/.cache}/bitdrift``, as pip keeps its downloads), so a fresh clone
does not fetch and unpack again what an earlier one already has:

- Debian's packages (the arm64 root's, QEMU's), by the SHA-256 the suite's index gives;
- the aarch64 site of wheels, by its pins: pip unpacking 2.3 GB of wheels is most of a
  userland's build (measured: 116 s of about 165 s on a 2-core Intel Xeon, Emerald Rapids).

Every entry is checked against its SHA-256 when used; one that does not match is said in
one line, removed and made anew. A cache that cannot be written is said once and done
without: it only saves time.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from bitdrift.errors import InstallError

DEBS = "debs"
SITES = "aarch64-site"
# An entry's pins and {path in the site: SHA-256 of its bytes, or "-> target" of a link},
# written last: an entry without it is not whole
HASHES = "hashes.json"


def folder() -> Path:
    """The cache's folder: ``$XDG_CACHE_HOME/bitdrift``, else ``~/.cache/bitdrift``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bitdrift"


_SAID: set[str] = set()


def _say(line: str, once: bool = False) -> None:
    """One line on stderr; ``once``: once per process (a cache that cannot be written is
    met by each of a build's downloads)."""
    if not (once and line in _SAID):
        _SAID.add(line)
        print(f"bitdrift: {line}", file=sys.stderr)


def _sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def fetch(url: str) -> bytes:
    """The bytes at ``url``; a failure is one line (InstallError)."""
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=120) as response:
            return response.read()
    except (OSError, ValueError) as error:  # ValueError: a URL urllib cannot parse
        raise InstallError(f"cannot fetch {url} ({error})") from error


def fetch_deb(url: str, sha256: str, command: str) -> bytes:
    """The Debian package at ``url`` whose index gives ``sha256``: the cache's copy when it
    has one that matches, else downloaded, checked and kept there (when the cache can be
    written). A download that does not match is refused in one line naming ``command``
    (InstallError)."""
    kept = folder() / DEBS / sha256[:2] / f"{sha256}.deb"
    if kept.is_file():
        data = kept.read_bytes()
        if hashlib.sha256(data).hexdigest() == sha256:
            return data
        _say(f"the cached {kept} does not match its SHA-256 (damaged); fetching it again")
        kept.unlink()
    data = fetch(url)
    if hashlib.sha256(data).hexdigest() != sha256:
        raise InstallError(f"{command}: {url} does not match the SHA-256 of its index (a "
                           "broken download or mirror)")
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        handle, partial = tempfile.mkstemp(prefix=f".{kept.name}.", dir=kept.parent)
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(data)
            os.replace(partial, kept)
        finally:
            Path(partial).unlink(missing_ok=True)
    except OSError as error:
        _say(f"cannot keep downloads in {folder()} ({error.strerror}); going on without",
             once=True)
    return data


def site_entry(pins: dict) -> Path:
    """The cache's folder of the site built with ``pins`` (wheels, platforms, Python):
    named by their SHA-256, so only the very same pins find it."""
    key = hashlib.sha256(json.dumps(pins, sort_keys=True).encode()).hexdigest()
    return folder() / SITES / key[:32]


def _files(tree: Path) -> list[str]:
    """The paths of ``tree``'s files and links, relative to it, sorted."""
    return sorted(str(Path(top, name).relative_to(tree))
                  for top, folders, names in os.walk(tree)
                  for name in (*names, *(one for one in folders
                                         if os.path.islink(os.path.join(top, one)))))


def _fingerprint(path: Path) -> str:
    """A file's SHA-256, or a link's target (a link is kept as a link)."""
    return f"-> {os.readlink(path)}" if path.is_symlink() else _sha256(path)


def take_site(pins: dict, site: Path) -> Path | None:
    """Make ``site`` (which must not exist) from the cache's site of ``pins``, each file
    hard-linked (copied across file systems) once its SHA-256 matches the one recorded when
    the entry was kept: the entry, else None (none is kept, or a damaged one was removed,
    said in one line)."""
    entry = site_entry(pins)
    try:
        recorded = json.loads((entry / HASHES).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        return _damaged(entry, site, f"its {HASHES} is unreadable ({error})")
    if not isinstance(recorded, dict) or recorded.get("pins") != pins:
        return _damaged(entry, site, f"its {HASHES} is not of these pins")
    kept, hashes = entry / "site", recorded.get("files") or {}
    if _files(kept) != sorted(hashes):
        return _damaged(entry, site, "its files are not those recorded")
    site.mkdir(parents=True)
    for name, expected in hashes.items():
        source, copy = kept / name, site / name
        if _fingerprint(source) != expected:
            return _damaged(entry, site, f"{name} does not match its SHA-256")
        copy.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            copy.symlink_to(os.readlink(source))
            continue
        _link_or_copy(source, copy)
    return entry


def _damaged(entry: Path, site: Path, why: str) -> None:
    _say(f"the cached aarch64 site {entry} is damaged ({why}); building it anew")
    shutil.rmtree(entry, ignore_errors=True)
    shutil.rmtree(site, ignore_errors=True)
    return None


def keep_site(pins: dict, site: Path) -> Path | None:
    """Keep the freshly built ``site`` as the cache's site of ``pins`` (hard links, else
    copies, and each file's SHA-256), whole or not at all: the entry, else None (the cache
    cannot be written, said in one line)."""
    entry = site_entry(pins)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    except OSError as error:
        _say(f"cannot keep the aarch64 site in {folder()} ({error.strerror}); going on "
             "without")
        return None
    try:
        shutil.copytree(site, partial / "site", symlinks=True, copy_function=_link_or_copy)
        hashes = {name: _fingerprint(partial / "site" / name)
                  for name in _files(partial / "site")}
        (partial / HASHES).write_text(json.dumps({"pins": pins, "files": hashes}))
        shutil.rmtree(entry, ignore_errors=True)  # a damaged one
        os.replace(partial, entry)
    except OSError as error:
        if (entry / HASHES).is_file():  # another build with these pins kept it first
            return entry
        _say(f"cannot keep the aarch64 site in {entry} ({error}); going on without")
        return None
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return entry


def _link_or_copy(source: str, copy: str) -> None:
    try:
        os.link(source, copy)
    except OSError:  # another file system, or one without hard links
        shutil.copy2(source, copy)
