"""Atomic outputs: an interrupted job never leaves a half file that looks complete."""

from __future__ import annotations

import contextlib
import contextvars
import errno
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bitdrift.errors import ConfigError, OutputError

# A full disk, a read-only file system or folder, a quota: the output cannot be written.
# Also a path in the way (a file where a folder must be, a folder where the file goes, a
# mount point that a rename cannot replace), should it appear after check_output.
WRITE_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES, errno.EPERM,
                errno.ENOTDIR, errno.EISDIR, errno.EBUSY}


# The outputs of one command, renamed into place together at its end (output_group): a
# command that cannot write its last output leaves none of them looking complete.
_GROUP: contextvars.ContextVar[list | None] = contextvars.ContextVar("outputs", default=None)
# ... and the folders made for them, removed again (when empty) if the command fails
_MADE: contextvars.ContextVar[list | None] = contextvars.ContextVar("folders", default=None)


@contextlib.contextmanager
def output_group() -> Iterator[None]:
    """Every atomic_output inside is renamed into place only when the whole block
    succeeds; on any error none is, their temporaries are removed, and so are the
    folders made for them that are still empty."""
    pending: list[tuple[Path, Path]] = []
    made: list[Path] = []
    tokens = _GROUP.set(pending), _MADE.set(made)
    done = False
    try:
        yield
        for tmp, path in pending:
            os.replace(tmp, path)
        done = True
    finally:
        _GROUP.reset(tokens[0])
        _MADE.reset(tokens[1])
        for tmp, _ in pending:
            _WRITING.discard(str(tmp))
            if tmp.exists():
                tmp.unlink()
        for folder in reversed(made if not done else []):  # the deepest first
            with contextlib.suppress(OSError):
                folder.rmdir()  # only an empty one


def _output_error(path: Path, error: OSError) -> OutputError:
    reason = os.strerror(error.errno) if error.errno is not None else \
        f"a short write, {error}: the disk is full or over quota"
    return OutputError(f"{path}: cannot be written ({reason}); nothing of this command's "
                       "output was left")


def _existing(path: Path) -> Path:
    """The nearest of ``path`` and its ancestors that exists (a file or a folder)."""
    path = path.absolute()
    return next(one for one in (path, *path.parents) if one.exists() or one.is_symlink())


def check_output(flag: str, path: str | Path, folder: bool = False,
                 whole: bool = False) -> None:
    """The check every output of a command passes before the command runs (the command
    line's options and defaulted outputs, bitdrift.commands.common.refuse_overwriting):
    a folder where the file goes, a file where a folder goes or on the way to it, and a
    read-only or unwritable folder are refused in one line naming the path; a missing
    folder is made when the output is written, and a disk that fills up then is met by
    the writers (OutputError; nothing half-written is left). ``folder``: the output is a
    folder of files; ``whole``: a folder replaced whole by one rename (not a mount point)."""
    path = Path(path)
    if path.is_dir() and not folder:
        raise ConfigError(f"{flag} {path} is a folder; give a file name")
    if (path.exists() or path.is_symlink()) and not path.is_dir() and folder:
        raise ConfigError(f"{flag} {path} is a file, not a folder")
    found = _existing(path if folder and not whole else path.parent)
    if not found.is_dir():
        raise ConfigError(f"{flag} {path}: {found} is a file, not a folder")
    if whole and path.is_dir() and os.path.ismount(path):
        raise OutputError(f"{path}: cannot be written ({flag} is a mount point, which a "
                          "folder written whole cannot replace: give a folder inside it)")
    if os.statvfs(found).f_flag & os.ST_RDONLY:
        raise _output_error(path, OSError(errno.EROFS, os.strerror(errno.EROFS)))
    if not os.access(found, os.W_OK | os.X_OK):
        raise _output_error(path, OSError(errno.EACCES, os.strerror(errno.EACCES)))


def make_folder(folder: Path, path: Path) -> None:
    """``folder`` (``path``'s, or ``path`` itself), made with its parents if missing; a file
    in the way is named (mkdir says only 'File exists')."""
    missing = [one for one in (folder, *folder.parents) if not one.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if _MADE.get() is not None:
            _MADE.get().extend(reversed(missing))
    except FileExistsError as error:
        raise OutputError(f"{path}: cannot be written ({_existing(folder)} is a file, not a "
                          "folder); nothing of this command's output was left") from error
    except OSError as error:
        if error.errno not in WRITE_ERRNOS:
            raise
        raise _output_error(path, error) from error


# A partial output's name says which process writes it: ``.NAME.HOST-PID-XXXXXXXX.partial``
# (tempfile's random part). A process killed outright (SIGKILL, a node lost) leaves it; the
# next write of the same output removes those of its dead writers (_remove_stale): this
# host's, whose process is gone. Another output's, a live process's, and another host's
# (its processes are not seen from here) are left.
PARTIAL = ".partial"
# The partial files and folders this process is writing now: a dead process's pid may be
# this one's (a container's processes are numbered anew)
_WRITING: set[str] = set()


def _host() -> str:
    name = re.sub(r"[^A-Za-z0-9]", "", socket.gethostname().split(".")[0])
    return name[:32] or "host"


def _owner() -> str:
    return f"{_host()}-{os.getpid()}-"


def _remove_stale(folder: Path, head: str, tail: str) -> None:
    """Remove ``folder/{head}HOST-PID-XXXXXXXX{tail}`` where HOST is this one and PID a
    process that is gone (or this one, and not writing it)."""
    pattern = re.compile(re.escape(head) + r"([A-Za-z0-9]+)-([0-9]+)-[a-z0-9_]{8}"
                         + re.escape(tail))
    try:
        names = os.listdir(folder)
    except OSError:
        return  # no folder yet: nothing left there
    host = _host()
    for name in names:
        found = pattern.fullmatch(name)
        if not found or found.group(1) != host:
            continue
        stale, pid = folder / name, int(found.group(2))
        if str(stale) in _WRITING or (pid != os.getpid() and _alive(pid)):
            continue
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                stale.unlink()


def _short_write(error: OSError) -> bool:
    """numpy's tofile (np.save) on a disk that fills midway: an OSError with no errno,
    '40960 requested and 15328 written'."""
    return error.errno is None and re.fullmatch(r"\d+ requested and \d+ written",
                                                str(error)) is not None


def _is_write_error(error: BaseException) -> bool:
    return isinstance(error, OSError) and not isinstance(error, OutputError) and (
        getattr(error, "errno", None) in WRITE_ERRNOS or _short_write(error))


@contextlib.contextmanager
def atomic_output(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it into place only on success (at
    the end of the enclosing output_group, if there is one).

    The temporary name keeps the suffix (Keras and h5py look at it) and lives in the same
    directory so that ``os.replace`` is an atomic rename on the same filesystem. It names
    its writer (PARTIAL): the partial files of this output that killed writers left are
    removed first.
    """
    path = Path(path)
    tmp = None
    group = _GROUP.get()
    try:
        make_folder(path.parent, path)
        head, tail = f".{path.stem}.", f"{PARTIAL}{path.suffix}"
        _remove_stale(path.parent, head, tail)
        handle, tmp_name = tempfile.mkstemp(prefix=f"{head}{_owner()}", suffix=tail,
                                            dir=path.parent)
        os.close(handle)
        tmp = Path(tmp_name)
        _WRITING.add(str(tmp))
        tmp.unlink()  # writers create the file themselves (h5py, keras refuse existing ones)
        yield tmp
        if group is None:
            os.replace(tmp, path)
        else:
            group.append((tmp, path))
            tmp = None  # the group renames or removes it
    except OSError as error:
        if not _is_write_error(error):
            raise
        raise _output_error(path, error) from error
    finally:
        if tmp is not None:
            _WRITING.discard(str(tmp))
            if tmp.exists():
                tmp.unlink()


@contextlib.contextmanager
def atomic_folder(path: str | Path) -> Iterator[Path]:
    """Yield a staging folder beside ``path``; on success it takes the place of ``path``
    (a folder, an earlier one moved aside by one rename and removed after), on any error it
    is removed and ``path`` left as it was. A full or read-only disk, or a mount point as
    ``path``, is an OutputError naming ``path``. The staging folders of this output that
    killed writers left are removed first (PARTIAL)."""
    path = Path(path)
    staging = None
    try:
        make_folder(path.parent, path)
        head = f".{path.name}."
        _remove_stale(path.parent, head, PARTIAL)
        staging = Path(tempfile.mkdtemp(prefix=f"{head}{_owner()}", suffix=PARTIAL,
                                        dir=path.parent))
        _WRITING.add(str(staging))
        yield staging
        aside = staging.with_suffix(".old")  # the earlier folder, moved aside whole
        if path.exists():
            os.replace(path, aside)
        try:
            os.replace(staging, path)
        except OSError:
            if aside.exists():
                os.replace(aside, path)
            raise
        _WRITING.discard(str(staging))
        staging = None
        shutil.rmtree(aside, ignore_errors=True)
    except OSError as error:
        if not _is_write_error(error):
            raise
        raise _output_error(path, error) from error
    finally:
        if staging is not None:
            _WRITING.discard(str(staging))
            shutil.rmtree(staging, ignore_errors=True)


def write_bytes(path: str | Path, data: bytes) -> None:
    """``data`` at ``path``, atomically: writers that build their file in memory first
    (HDF5 files, figures) meet a full disk here, in one plain write, instead of deep in
    h5py's or matplotlib's own file handling."""
    with atomic_output(path) as tmp:
        Path(tmp).write_bytes(data)


def read_table(path: str | Path, columns, producer: str):
    """A CSV table that must have ``columns``: a table from another command is refused
    naming the file and the command that makes the right one."""
    import pandas as pd

    from bitdrift.errors import RecordError

    try:
        table = pd.read_csv(path)
    except (OSError, ValueError) as error:
        raise RecordError(f"{path}: cannot read the table ({error})") from error
    missing = [column for column in columns if column not in table.columns]
    if missing:
        raise RecordError(f"{path}: not a table from `{producer}` (missing columns "
                          f"{', '.join(missing)})")
    return table


def save_figure(figure, out: str | Path, **options) -> None:
    """A matplotlib figure at ``out`` (its suffix picks the format, PDF by default) and,
    beside it, as PNG: the HTML report embeds the PNG, which every browser shows inline
    (a PDF in an iframe needs the browser's PDF viewer and shows blank in a headless one).
    Both are written atomically; the figure is closed."""
    import matplotlib.pyplot as plt

    out = Path(out)
    formats = [(out, out.suffix.lstrip(".").lower() or "pdf")]
    if out.suffix.lower() != ".png":
        formats.append((out.with_suffix(".png"), "png"))
    import io

    rendered = []
    try:
        for path, kind in formats:  # rendered in memory: the disk is met in one write
            buffer = io.BytesIO()
            figure.savefig(buffer, format=kind, **({"dpi": 110} if kind == "png" else {}),
                           **options)
            rendered.append((path, buffer.getvalue()))
    finally:
        plt.close(figure)
    with output_group() if _GROUP.get() is None else contextlib.nullcontext():
        for path, data in rendered:
            write_bytes(path, data)


def write_csv(table, path: str | Path, columns: list[str] | None = None,
              html: bool = True) -> None:
    """A table as CSV (no index) and, beside it, as HTML (the report shows HTML inline; a
    CSV there is download-only), both written atomically; ``html=False`` for a workflow's
    intermediate parts, which no report shows. ``table`` is a pandas table, or with
    ``columns`` a list of dicts written with the csv module as pandas would write it (NaN
    and None as empty fields), for commands that need not pay pandas' import."""
    path = Path(path)
    if columns is None:
        columns = [str(column) for column in table.columns]
        rows = table.itertuples(index=False, name=None)
    else:
        rows = ([row[column] for column in columns] for row in table)
    rows = [[_cell(value) for value in row] for row in rows]
    import csv
    import io

    text = io.StringIO(newline="")
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(rows)
    data = text.getvalue().encode()
    with output_group() if _GROUP.get() is None else contextlib.nullcontext():
        write_bytes(path, data)
        if html and path.suffix.lower() != ".html":
            write_table_html(columns, rows, path.with_suffix(".html"), path.name,
                             csv_bytes=data)


def write_tables(tables: dict, names: dict[str, str], out_dir: str | Path) -> None:
    """Each ``tables[key]`` as ``out_dir/NAME.csv`` (and .html) for ``names`` {key: NAME}."""
    for key, name in names.items():
        write_csv(tables[key], Path(out_dir) / f"{name}.csv")


def _cell(value):
    """A CSV field as pandas writes it: NaN and None empty, everything else as is."""
    import math

    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return value


HTML_ROW_LIMIT = 1000  # a report page stays light; the CSV beside holds every row
# The HTML carries its CSV as a download link (the report shows the HTML, so the table can
# be taken from the report alone), up to this size.
EMBEDDED_CSV_LIMIT = 8 * 1024 * 1024


def write_table_html(columns, rows, path: str | Path, source: str,
                     csv_bytes: bytes | None = None) -> None:
    """A plain, self-contained HTML table (the first HTML_ROW_LIMIT rows) with a link that
    downloads the whole CSV, atomically."""
    import base64
    import html

    def text(value):
        if isinstance(value, float):
            return f"{value:.6g}"
        return html.escape(str(value))

    shown = rows[:HTML_ROW_LIMIT]
    note = (f"{len(rows)} rows" if len(rows) <= HTML_ROW_LIMIT
            else f"the first {HTML_ROW_LIMIT} of {len(rows)} rows")
    head = "".join(f"<th>{html.escape(str(column))}</th>" for column in columns)
    body = "\n".join("<tr>" + "".join(f"<td>{text(value)}</td>" for value in row) + "</tr>"
                     for row in shown)
    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(source)}</title><style>"
        "body{font:13px sans-serif;margin:8px}table{border-collapse:collapse}"
        "th,td{border:1px solid #ccc;padding:2px 6px;text-align:right;white-space:nowrap}"
        "th{background:#eee;position:sticky;top:0}tr:nth-child(even){background:#f8f8f8}"
        f"</style></head><body><p>{html.escape(source)}: {note}, {len(columns)} columns "
        "(the CSV holds every row at full precision)"
        + (f" &middot; <a download='{html.escape(source)}' href='data:text/csv;base64,"
           f"{base64.b64encode(csv_bytes).decode()}'>download {html.escape(source)}</a>"
           if csv_bytes is not None and len(csv_bytes) <= EMBEDDED_CSV_LIMIT else "")
        + "</p>"
        f"<table><thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table>"
        "</body></html>\n")
    with atomic_output(path) as tmp:
        Path(tmp).write_text(page)


HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
DATA_SUFFIXES = {".h5", ".hdf5", ".keras", ".npz"}


def is_data_file(path: str | Path) -> bool:
    """A record, model or dataset: by its suffix, or an existing file's HDF5 signature
    or zip (Keras) header, whatever its name."""
    path = Path(path)
    if path.suffix.lower() in DATA_SUFFIXES:
        return True
    if not path.is_file():
        return False
    with open(path, "rb") as handle:
        head = handle.read(8)
    return head == HDF5_SIGNATURE or head.startswith(b"PK\x03\x04")


WORK_MARK = ".work-"


@contextlib.contextmanager
def work_folder(out: str | Path) -> Iterator[Path]:
    """A temporary folder for the worker processes of the job that writes ``out``, beside
    it (``.NAME.work-PID-XXXX``), removed on the way out. A job killed outright (SIGKILL)
    leaves it where the job's output belongs, not in /tmp; the next start of the same job
    removes the folders of such dead jobs."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{out.name}{WORK_MARK}"
    for stale in out.parent.glob(f"{prefix}*"):
        pid = stale.name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix=f"{prefix}{os.getpid()}-", dir=out.parent) as tmp:
        yield Path(tmp)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
