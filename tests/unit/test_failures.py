"""A failing device costs nothing else: its job writes a failure record, the analysis
leaves it out and names it, and the end of the run names it and removes it for a retry."""

import subprocess
import sys

import numpy as np
import pytest

from bitdrift.errors import RecordError
from bitdrift.record.failures import end_of_run, failure_rows
from bitdrift.record.hdf5 import FailedDevice
from bitdrift.record.reader import Record, open_records, read_failure
from bitdrift.record.writer import write_record
from tests.utils import BASE_ATTRS

ATTRS = {"model": "m", "device": "ov_gpu", "backend": "openvino", "log": "logs/x.log"}


def _record(path, device):
    write_record(path, {**BASE_ATTRS, "model": "m", "device": device},
                 {0: {"output": np.zeros((1, 3), np.float32)}})
    return path


def test_a_failure_record_is_named_and_left_out(tmp_path, capsys):
    from bitdrift.record.writer import write_failure

    good = _record(tmp_path / "good.h5", "tf")
    failed = tmp_path / "failed.h5"
    write_failure(failed, ATTRS, "device 'ov_gpu' asks for a GPU but OpenVINO sees CPU")
    assert read_failure(good) is None and read_failure(tmp_path / "missing.h5") is None
    found = read_failure(failed)
    assert found["device"] == "ov_gpu" and found["reason"].startswith("device 'ov_gpu' asks")
    with pytest.raises(FailedDevice, match="did not run .*asks for a GPU"):
        Record(failed)
    records = open_records([good, failed])
    assert [record.device for record in records] == ["tf"]
    assert "left out" in capsys.readouterr().err
    with pytest.raises(FailedDevice):
        open_records([good, failed], leave_out_failed=False)
    with pytest.raises(RecordError, match="every device failed"):
        open_records([failed])
    rows = failure_rows([good, failed])
    assert rows == [{"model": "m", "device": "ov_gpu", "backend": "openvino",
                     "reason": found["reason"], "log": "logs/x.log"}]


def test_the_end_of_a_run_names_each_failure_and_clears_it_for_a_retry(tmp_path, capsys):
    from bitdrift.record.writer import write_failure

    good = _record(tmp_path / "good.h5", "tf")
    failed = tmp_path / "failed.h5"
    write_failure(failed, ATTRS, "runtime crashed (exit 139)")
    assert [found["device"] for found in end_of_run([good, failed, tmp_path / "none.h5"],
                                                    sys.stderr)] == ["ov_gpu"]
    said = capsys.readouterr().err
    assert "1 device(s) failed" in said and "ov_gpu (model m): runtime crashed (exit 139)" in said
    assert not failed.exists() and good.exists()  # the next run makes it again
    assert end_of_run([good], sys.stderr) == [] and capsys.readouterr().err == ""


SCRIPT = """
import sys
from bitdrift.record.failures import failure_recorder
from bitdrift.jobs import workflow_job
out, log, kind = sys.argv[1:]
with workflow_job(log, on_failure=failure_recorder(out, "m", "d", "openvino", log)):
    if kind == "domain":
        from bitdrift.errors import InferenceError
        raise InferenceError("device 'd': the runtime is missing")
    if kind == "bug":
        raise ZeroDivisionError("division by zero")
    raise KeyboardInterrupt
"""


@pytest.mark.parametrize("kind", ["domain", "bug", "interrupt"])
def test_a_device_job_records_its_failure_but_never_an_interruption(tmp_path, kind):
    """A domain error or a crash in a device's job: the job ends 0 with a failure record
    and one line on the terminal; an interruption is no failure of the device: the job
    fails and writes nothing."""
    out, log = tmp_path / "d.h5", tmp_path / "d.log"
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(out), str(log), kind],
                          capture_output=True, text=True)
    if kind == "interrupt":
        assert done.returncode != 0 and not out.exists()
        return
    assert done.returncode == 0, done.stderr
    found = read_failure(out)
    expected = "the runtime is missing" if kind == "domain" else \
        "ZeroDivisionError: division by zero"
    assert expected in found["reason"]
    assert f"device 'd' (model 'm') failed: {found['reason']}" in done.stderr
    if kind == "bug":
        assert "Traceback" in log.read_text()  # a bug keeps its traceback in the log


def test_when_no_device_ran_the_findings_say_so_and_no_earlier_answer_stays(tmp_path, capsys):
    """Every analysed device failed: findings.md is written anew with each reason, the
    earlier run's report and findings.rst are removed, and the terminal says why."""
    from bitdrift.record.writer import write_failure

    findings, rst, report = (tmp_path / name for name in ("findings.md", "findings.rst",
                                                          "report.html"))
    for old in (findings, rst, report):
        old.write_text("- Devices that ran: 30; failed: 0.")
    reasons = {"ov_gpu": "asks for a GPU but OpenVINO sees CPU", "ort_gpu": "exit 139"}
    failed = []
    for device, reason in reasons.items():
        failed.append(tmp_path / f"{device}.h5")
        write_failure(failed[-1], {**ATTRS, "device": device}, reason)
    study = _record(tmp_path / "study.h5", "tf")  # a study's record is no analysed device
    end_of_run([*failed, study], sys.stderr, findings=findings, stale=[rst, report],
               analysed=failed)
    said = capsys.readouterr().err
    written = findings.read_text()
    assert "Devices that ran: 30" not in written
    assert "No device ran: 2 of the 2 scheduled devices failed" in written
    for device, reason in reasons.items():
        assert f"- {device} (m): {reason} (log: logs/x.log)" in written
    assert not rst.exists() and not report.exists()
    assert f"{findings} says so" in said and str(report) in said
    assert not any(path.exists() for path in failed)


def test_one_device_that_ran_keeps_the_findings_to_the_analysis(tmp_path, capsys):
    """A device ran, or nothing failed: the findings and report are the analysis's to
    write, and end_of_run leaves them as they are."""
    from bitdrift.record.writer import write_failure

    findings, report = tmp_path / "findings.md", tmp_path / "report.html"
    for old in (findings, report):
        old.write_text("earlier")
    good = _record(tmp_path / "good.h5", "tf")
    failed = tmp_path / "failed.h5"
    write_failure(failed, ATTRS, "exit 139")
    end_of_run([good, failed], sys.stderr, findings=findings, stale=[report])
    never_started = tmp_path / "never.h5"  # a step before the device failed: no record
    end_of_run([never_started], sys.stderr, findings=findings, stale=[report])
    assert findings.read_text() == "earlier" and report.read_text() == "earlier"
    assert "no device ran" not in capsys.readouterr().err


def test_findings_that_cannot_be_written_still_leave_the_failures_cleared(tmp_path, capsys):
    """No device ran and findings.md cannot be written (a file stands where its folder
    goes): one line says so, and the failure records are removed all the same, so the next
    run retries the devices."""
    from bitdrift.record.writer import write_failure

    failed = tmp_path / "failed.h5"
    write_failure(failed, ATTRS, "exit 139")
    (tmp_path / "results").write_text("a file, not a folder")
    findings = tmp_path / "results" / "findings.md"
    end_of_run([failed], sys.stderr, findings=findings, stale=[])
    said = capsys.readouterr().err
    assert f"{findings} could not be rewritten to say so" in said
    assert not failed.exists()
