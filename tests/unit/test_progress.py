"""Long loops' progress (bitdrift.progress): a line per state in a job's log, the latest one
found again by the quiet view (src/snakemake_logger_plugin_bitdrift), and the view's line
for a running job, each checked against hand-written text."""

import io
import re

from bitdrift.progress import INTERVAL, PREFIX, latest_progress, progress
from snakemake_logger_plugin_bitdrift import counter, running_line

STATE = re.compile(r"^bitdrift: progress: layers merged (\d)/3 \[\d\d:\d\d<(\d\d:\d\d|\?)\]$")


def test_a_loop_in_a_log_writes_each_state_on_a_line_of_its_own(monkeypatch):
    """Every state a loop of three passes through (0 of 3 to 3 of 3), each on its own line,
    and the lines the loop prints between them left whole (tqdm's carriage returns would
    run them together)."""
    monkeypatch.setenv(INTERVAL, "0")  # every state, not one per 10 s
    log = io.StringIO()
    for layer in progress(["conv1", "conv2", "dense"], "layers merged", file=log):
        print(f"bitdrift: merged {layer}", file=log)
    text = log.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert lines == [lines[0], "bitdrift: merged conv1", lines[2], "bitdrift: merged conv2",
                     lines[4], "bitdrift: merged dense", lines[6]], text
    assert [int(STATE.match(lines[at]).group(1)) for at in (0, 2, 4, 6)] == [0, 1, 2, 3]


def test_a_loop_at_a_terminal_keeps_tqdms_bar():
    """At a terminal the bar is tqdm's own, redrawn in place (carriage returns), not the
    log's lines."""

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    for _ in progress(range(3), "repeats done", file=terminal):
        pass
    text = terminal.getvalue()
    assert "\r" in text and PREFIX not in text and "3/3" in text


def test_the_latest_progress_line_of_a_log(tmp_path):
    """The last progress line, whatever the job printed after it; tqdm's carriage returns
    split states as newlines do; none in a log without one, or no log yet."""
    log = tmp_path / "job.log"
    log.write_text("TensorFlow says hello\n"
                   f"{PREFIX}repeats done 0/3 [00:00<?]\n"
                   "bitdrift: m on d: repeat 1/3 in a forked child\n"
                   f"{PREFIX}repeat: batches run 1/4 [00:05<00:15]\n"
                   f"\r{PREFIX}orders searched 2/54 [00:40<17:20]\r"
                   "bitdrift: m on d: order of conv2 (2/54): sequential, 20.1 s\n"
                   "oneDNN warning\n")
    assert latest_progress(log) == "orders searched 2/54 [00:40<17:20]"
    log.write_text("TensorFlow says hello\nno progress here\n")
    assert latest_progress(log) is None
    assert latest_progress(tmp_path / "not_yet.log") is None


def test_the_quiet_views_line_for_a_running_job():
    """`[done/total elapsed] running <job> for <its time>: <its latest state>`, or its log's
    name where it has counted nothing."""
    job = "run_inference (model=resnet50, device=tf_1thread)"
    line = (f"{counter(5, 42, 3725)} "
            f"{running_line(job, 245, 'orders searched 3/54 [02:10<36:00]', 'logs/a.log')}")
    assert line == ("[ 5/42 1:02:05] running run_inference (model=resnet50, "
                    "device=tf_1thread) for 4:05: orders searched 3/54 [02:10<36:00]")
    assert running_line("export_model (model=resnet50)", 61, None, "logs/e.log") == (
        "running export_model (model=resnet50) for 1:01: nothing counted yet "
        "(log: logs/e.log)")
    assert running_line("all", 3600 + 61, None, None) == \
        "running all for 1:01:01: nothing counted yet"
