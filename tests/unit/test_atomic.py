"""Tables as CSV and HTML: the two write paths agree with pandas, and the HTML beside the
CSV is what the report shows. Outputs written atomically: what a killed writer left is
removed by the next write of the same output, and nothing else is."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from bitdrift.atomic import HTML_ROW_LIMIT, write_csv


def test_both_paths_write_what_pandas_writes_and_html_beside(tmp_path):
    table = pd.DataFrame({"model": ["a", "b"], "value": [0.1 + 0.2, np.nan],
                          "count": [3, 4], "flag": [True, False], "note": [None, "x<y"]})
    write_csv(table, tmp_path / "frame.csv")
    write_csv(table.to_dict("records"), tmp_path / "rows.csv", columns=list(table.columns))
    expected = table.to_csv(index=False)
    assert (tmp_path / "frame.csv").read_text() == expected
    assert (tmp_path / "rows.csv").read_text() == expected
    page = (tmp_path / "frame.html").read_text()
    assert "<th>value</th>" in page and "<td>0.3</td>" in page and "x&lt;y" in page
    assert "2 rows, 5 columns" in page
    assert (tmp_path / "rows.html").read_text() == page.replace("frame.csv", "rows.csv")


def test_long_tables_show_the_first_rows_in_html_and_keep_all_in_csv(tmp_path):
    table = pd.DataFrame({"i": range(HTML_ROW_LIMIT + 5)})
    write_csv(table, tmp_path / "long.csv")
    assert len((tmp_path / "long.csv").read_text().splitlines()) == HTML_ROW_LIMIT + 6
    page = (tmp_path / "long.html").read_text()
    assert f"the first {HTML_ROW_LIMIT} of {HTML_ROW_LIMIT + 5} rows" in page
    assert page.count("<tr>") == HTML_ROW_LIMIT + 1  # header row + the rows shown


def test_an_intermediate_part_gets_no_html(tmp_path):
    write_csv(pd.DataFrame({"i": [1]}), tmp_path / "part.csv", html=False)
    assert [p.name for p in tmp_path.iterdir()] == ["part.csv"]


def test_a_folder_output_replaces_the_old_one_whole_or_leaves_it_as_it_was(tmp_path):
    """atomic_folder: the new folder takes the old one's place by renames; an error while
    it is written leaves the old folder as it was and no staging folder beside it, and the
    folders made for a failed command's outputs are removed again (output_group)."""
    import pytest

    from bitdrift.atomic import atomic_folder, output_group

    out = tmp_path / "repro"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(RuntimeError), atomic_folder(out) as staging:
        (staging / "new.txt").write_text("new")
        raise RuntimeError("cut off")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["repro"]
    assert [path.name for path in out.iterdir()] == ["old.txt"]
    with atomic_folder(out) as staging:
        (staging / "new.txt").write_text("new")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["repro"]
    assert [path.name for path in out.iterdir()] == ["new.txt"]
    deep = tmp_path / "a" / "b" / "t.csv"
    with pytest.raises(RuntimeError), output_group():
        write_csv([{"x": 1}], deep, columns=["x"])
        raise RuntimeError("the command failed after writing")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["repro"]


# A writer killed outright (SIGKILL) while it writes its output: its partial file names it
KILLED_WRITER = """
import sys, time
from pathlib import Path
from bitdrift.atomic import atomic_output
with atomic_output(sys.argv[1]) as partial:
    Path(partial).write_bytes(b"half a record")
    print(partial, flush=True)
    time.sleep(600)
"""


def _killed_writer(out) -> Path:
    """The partial file a writer of ``out`` left when it was killed (SIGKILL)."""
    writer = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(out)],
                              stdout=subprocess.PIPE, text=True)
    partial = Path(writer.stdout.readline().strip())
    writer.kill()
    writer.wait(timeout=60)
    writer.stdout.close()
    assert partial.read_bytes() == b"half a record"
    return partial


def test_the_next_write_of_an_output_removes_the_partial_files_of_its_killed_writers(
        tmp_path):
    """SIGKILL left `.r.*.partial.h5` beside the record, even after a successful rerun. The
    next write of the same output removes those of writers that are gone; it keeps another
    output's (`r.b.h5`, `r.csv`), a live writer's, another host's (its processes are not
    seen from here) and one named in the form before writers were named (whose writer is
    not known)."""
    from bitdrift.atomic import atomic_output, write_bytes

    out = tmp_path / "r.h5"
    killed = [_killed_writer(out), _killed_writer(out)]
    other_outputs = [_killed_writer(tmp_path / "r.b.h5"), _killed_writer(tmp_path / "r.csv")]
    with atomic_output(out) as partial:
        assert not any(path.exists() for path in killed)
        partial.write_bytes(b"whole")
        write_bytes(out, b"whole")  # the same process writing it again: its own is kept
        assert partial.exists()
    assert out.read_bytes() == b"whole"
    assert all(path.exists() for path in other_outputs)
    host, dead = killed[0].name.split(".")[2].split("-")[:2]  # .r.HOST-PID-XXXXXXXX...
    kept = [tmp_path / f".r.{host}-{os.getppid()}-abcdefgh.partial.h5",  # alive
            tmp_path / f".r.otherhost-{dead}-abcdefgh.partial.h5",
            tmp_path / ".r.abcdefgh.partial.h5"]
    for path in kept:
        path.write_bytes(b"kept")
    write_bytes(out, b"again")
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        path.name for path in [out, *other_outputs, *kept])


def test_a_killed_folder_writers_staging_folder_is_removed_by_the_next(tmp_path):
    from bitdrift.atomic import atomic_folder

    code = ("import sys, time\nfrom bitdrift.atomic import atomic_folder\n"
            "with atomic_folder(sys.argv[1]) as staging:\n"
            "    (staging / 'part.npy').write_bytes(b'half')\n"
            "    print(staging, flush=True)\n    time.sleep(600)\n")
    writer = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "repro")],
                              stdout=subprocess.PIPE, text=True)
    staging = Path(writer.stdout.readline().strip())
    writer.kill()
    writer.wait(timeout=60)
    writer.stdout.close()
    assert (staging / "part.npy").exists()
    with atomic_folder(tmp_path / "repro") as mine:
        (mine / "whole.npy").write_bytes(b"whole")
    assert [path.name for path in tmp_path.iterdir()] == ["repro"]
    assert [path.name for path in (tmp_path / "repro").iterdir()] == ["whole.npy"]
