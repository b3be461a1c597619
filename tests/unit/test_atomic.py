"""Tables as CSV and HTML: the two write paths agree with pandas, and the HTML beside the
CSV is what the report shows."""

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
