"""The probe study's section of the findings (bitdrift.report.findings.StudySection):
how finely the best probe splits the held-out devices, against the best natural sample."""

from __future__ import annotations

from bitdrift.report.findings import StudySection
from bitdrift.studies.probes.paths import PROBE_TABLES


def probe_sentences(summary) -> list[str]:
    """The sentence of probe_summary.csv (`bitdrift probe-evaluate`)."""
    by = {row["measure"]: row for row in summary.to_dict("records")}
    held = by.get("held-out devices", {})
    best, natural = by.get("best probe", {}), by.get("best natural sample", {})
    return [f"Forensic probes on {held.get('classes')} held-out devices: the best probe "
            f"splits them into {best.get('classes')} classes, the best natural test sample "
            f"into {natural.get('classes')}."]


SECTION = StudySection("Forensic probes", (PROBE_TABLES["summary"],), probe_sentences,
                       place=1)
