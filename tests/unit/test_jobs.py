"""A workflow job's frame (bitdrift.jobs.workflow_job), in a real child process."""

import subprocess
import sys

CODE = """
import os, sys
from bitdrift.jobs import workflow_job
from bitdrift.errors import RecordError
with workflow_job(sys.argv[1]):
    os.write(2, b"C-level line, as TensorFlow's C++ logging writes it\\n")
    print("python line", file=sys.stderr)
    raise RecordError("x.h5: not a record")
"""


def test_c_level_output_goes_to_the_log_and_the_error_line_to_both(tmp_path):
    log = tmp_path / "job.log"
    result = subprocess.run([sys.executable, "-c", CODE, str(log)], capture_output=True,
                            text=True)
    assert result.returncode == 3  # RecordError's status
    text = log.read_text()
    assert "C-level line" in text and "python line" in text
    assert text.rstrip().endswith("bitdrift: error: x.h5: not a record")
    assert result.stderr.strip() == "bitdrift: error: x.h5: not a record"  # nothing else
    assert "Traceback" not in text + result.stderr


TIMED = """
import sys, time
from bitdrift.jobs import framework_imported, workflow_job
with workflow_job(sys.argv[1]):
    time.sleep(1.0)  # stands for a framework's import: start-up
    framework_imported()
    time.sleep(0.1)  # the work
    framework_imported()  # a later import (an exporter's runtime) is work
    time.sleep(0.1)
"""


def test_a_job_that_ends_well_logs_its_work_after_the_framework_import(tmp_path):
    log = tmp_path / "job.log"
    subprocess.run([sys.executable, "-c", TIMED, str(log)], check=True)
    lines = [line for line in log.read_text().splitlines() if line.startswith("bitdrift: job")]
    assert len(lines) == 1
    seconds = float(lines[0].split()[3])
    # 0.2 s of work after the first mark; the second second of sleep before it is not work
    assert 0.2 <= seconds < 1.0, lines


WAITED = """
import sys, time
from bitdrift.jobs import waiting_on_workers, workflow_job
with workflow_job(sys.argv[1]):
    time.sleep(0.1)
    with waiting_on_workers():  # a worker's work, logged by the worker
        time.sleep(1.0)
    time.sleep(0.1)
    sys.exit(0)  # as a command-line call ends
"""


def test_a_jobs_own_work_leaves_out_its_waits_on_workers(tmp_path):
    log = tmp_path / "job.log"
    subprocess.run([sys.executable, "-c", WAITED, str(log)], check=True)
    lines = [line for line in log.read_text().splitlines() if line.startswith("bitdrift: job")]
    assert len(lines) == 1
    assert 0.2 <= float(lines[0].split()[3]) < 1.0, lines
