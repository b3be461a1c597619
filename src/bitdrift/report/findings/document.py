"""The findings as a document: the tables read when a section needs them, the records'
fingerprints read through the record package, the sections in their order (the core's,
then the studies'), and the text as Markdown (findings.md, the EQC figure linked) and
reStructuredText (the report's first section, the figure inline)."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from bitdrift import paths
from bitdrift.report.findings.answer import HEADING as ANSWER_HEADING
from bitdrift.report.findings.answer import answer, final_outputs, labels_line
from bitdrift.report.findings.atlas import ATLAS_HEADING, atlas
from bitdrift.report.findings.checks import failures, observer, planned_devices
from bitdrift.report.findings.classes import (
    agreement,
    classes,
    explanations,
    reduced_precision,
)
from bitdrift.report.findings.divergence import divergence
from bitdrift.report.findings.machine import emulated, machine
from bitdrift.report.findings.orders import orders
from bitdrift.report.findings.quantization import HEADING as QUANTIZATION_HEADING
from bitdrift.report.findings.quantization import quantization, quantization_answer
from bitdrift.report.findings.quantized_parting import HEADING as PARTING_HEADING
from bitdrift.report.findings.quantized_parting import quantized_parting

# The tables the findings may read: the core's (bitdrift.paths, the one list), the
# comparison with the atlas and the quantized models' tables; each is read when a section
# needs it.
TABLES = (*paths.CORE_TABLES, *paths.ATLAS_TABLES, paths.QUANTIZATION_ERROR_TABLE,
          paths.QUANTIZED_PARTING_TABLE)


class StudySection(NamedTuple):
    """A study's own section of the findings, which the study registers (its package's
    ``findings.SECTION``, gathered by bitdrift.studies.findings_sections): the core knows
    no study, and whoever writes the findings passes the sections in."""

    title: str
    # the tables it reads (results/tables/NAME.csv); the section is written where each
    # is there and not empty (the study has run)
    tables: tuple[str, ...]
    # its items from those tables (DataFrames, in the order of ``tables``): sentences, or
    # DataFrames written as tables
    sentences: Callable[..., list]
    # its place among the studies' sections, which follow the core's
    place: int


def _read(path) -> pd.DataFrame:
    return pd.read_csv(path) if path and Path(path).is_file() else pd.DataFrame()


class _Tables(dict):
    """{name: table}, each read from its path on first use (an absent one: empty), so the
    findings read only the tables their sections quote."""

    def __init__(self, files: dict):
        super().__init__()
        self.files = files

    def __missing__(self, name: str) -> pd.DataFrame:
        self[name] = _read(self.files.get(name))
        return self[name]


def findings(tables: dict, fingerprints: dict, study_sections=(),
             planned=None, outputs=None) -> list[tuple[str, list]]:
    """(heading, items) sections from the tables (``tables``: name -> CSV path) and the
    records' fingerprints ({device: fingerprint}: the first native one names the machine);
    then the studies' sections (StudySection) whose tables are there. An item is a
    sentence (str) or a table (DataFrame). The first section is the answer in short
    (bitdrift.report.findings.answer), its bits and labels from ``outputs``
    (answer.final_outputs of the records; None: said from the tables alone). ``planned``:
    the plan's notes on the devices of each model (bitdrift.plan.Plan.device_plan): devices
    left out, for their runtime cannot run the model's format, and models with one device."""
    fingerprint = next((found for found in fingerprints.values()
                        if not found.get("emulation")), None)
    read = _Tables(tables)
    precisions = dict(zip(read["eqc_layers"].get("device", []),
                          read["eqc_layers"].get("precision", []), strict=False)) \
        if not read["eqc_layers"].empty else {}
    eqc = read["eqc"]
    ran = sorted(set(eqc["device"])) if not eqc.empty else []
    skipped, lone = planned_devices(planned or {})
    quantized = read[paths.QUANTIZATION_ERROR_TABLE]
    sections = [(ANSWER_HEADING, answer(eqc, precisions, read["explain"],
                                        read["device_classes"], outputs,
                                        read["effective_precision"],
                                        quantization_answer(quantized)))]
    sections.append(("Machine", (machine(fingerprint) if fingerprint else ["No record ran."])
                 + [f"Devices that ran: {len(ran)}; failed: {len(read['device_failures'])}."]
                 + skipped + emulated(fingerprints)))
    sections.append(("Equivalence classes", lone + (classes(eqc, precisions) if not eqc.empty
                                                    else ["No classes: no record."])))
    if not read["explain"].empty:
        sections.append(("What explains the classes", explanations(read["explain"])))
    sections.append(("Devices computing below their declared format",
                     reduced_precision(read["effective_precision"])))
    if not read["divergence"].empty:
        sections.append(("Where devices part", divergence(read["divergence"],
                                                          read["kernel_coverage"])))
    if not read[paths.QUANTIZED_PARTING_TABLE].empty:
        sections.append((PARTING_HEADING,
                         quantized_parting(read[paths.QUANTIZED_PARTING_TABLE])))
    if not read["accumulation_orders"].empty:
        sections.append(("How the layers sum", orders(read["accumulation_orders"])))
    between = {model: line for model, line in
               ((model, labels_line(model, found)) for model, found in (outputs or {}).items())
               if line}
    if not read["argmax_agreement"].empty or between:
        sections.append(("Predicted labels", agreement(read["argmax_agreement"], between)))
    if not quantized.empty:
        sections.append((QUANTIZATION_HEADING, quantization(quantized)))
    if not read["observer_check"].empty:
        sections.append(("Instrumentation and the deployed model",
                         observer(read["observer_check"])))
    if not read["atlas"].empty or not read["atlas_refused"].empty:
        sections.append((ATLAS_HEADING, atlas(read["atlas"], read["atlas_refused"])))
    sections.append(("Devices that failed", failures(read["device_failures"])))
    for study in sorted(study_sections, key=lambda section: section.place):
        frames = [read[name] for name in study.tables]
        if not any(frame.empty for frame in frames):
            sections.append((study.title, study.sentences(*frames)))
    return sections


TITLE = "Findings on this machine"
PREAMBLE = ("Written by the run from its own tables (results/tables/): what this machine "
            "showed. Another CPU, runtime version or configuration gives other findings.")


def _table_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """A section's table with its index as a first column where the index says something
    (a named or non-range index), every cell as text on one line."""
    if frame.index.name is not None or not isinstance(frame.index, pd.RangeIndex):
        frame = frame.reset_index()
    return frame.astype(object).where(frame.notna(), "").map(
        lambda cell: " ".join(str(cell).split()))


def markdown_table(frame: pd.DataFrame) -> list[str]:
    """A DataFrame as a Markdown pipe table (its columns the header), a '|' in a cell
    escaped."""
    frame = _table_frame(frame)

    def row(cells) -> str:
        return "| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |"

    return [row(frame.columns), "|" + "|".join("---" for _ in frame.columns) + "|",
            *(row(cells) for cells in frame.itertuples(index=False))]


def _items_markdown(items) -> list[str]:
    """A section's items: a string is a bullet, a DataFrame a table (blank lines around)."""
    out = []
    for item in items:
        if isinstance(item, pd.DataFrame):
            out += ([""] if out else []) + markdown_table(item) + [""]
        else:
            out.append(f"- {item}")
    return out


def markdown(sections, figure=None, out_path=None) -> str:
    out = [f"# {TITLE}", "", PREAMBLE, ""]
    for heading, items in sections:
        out += [f"## {heading}", ""] + _items_markdown(items)
        out += [] if out[-1] == "" else [""]
        if figure and heading == FIGURE_AFTER:
            import os

            where = os.path.relpath(figure, Path(out_path).parent) if out_path else figure
            # a paragraph's lines join: wrapped, the source keeps short lines
            out += [f"![equivalence classes]({where})", "",
                    *textwrap.wrap(FIGURE_CAPTION, 100), ""]
    return "\n".join(out)


FIGURE_AFTER = "Equivalence classes"  # the section the EQC figure follows
FIGURE_CAPTION = ("The equivalence classes (eqc.png): a column per test sample, a row per "
                  "device of every precision; equal numbers in a column are bit-identical "
                  "outputs, so the grid's classes count every device at once (a device of "
                  "another precision shares no class with a float32 one), where the lines "
                  "above count each precision apart; a colour follows one group of devices. "
                  "The dendrogram joins the devices of the analysed precision (float32 by "
                  "default) by the leading mantissa bits their outputs share (its axis, "
                  "remaining precision): bit-identical devices join at the format's full "
                  "mantissa (23 bits in float32), at its right edge, and the further left "
                  "two groups join, the fewer bits they share.")


def embedded_figure(png) -> list[str]:
    """reST lines showing the PNG inline (a data URI: the report is one file)."""
    import base64

    # wrapped: docutils refuses a line over 10,000 characters, and a data URI's base64
    # may hold line breaks (browsers drop whitespace when they decode it)
    data = base64.encodebytes(Path(png).read_bytes()).decode().split()
    return [".. raw:: html", "",
            '   <figure><img alt="equivalence classes" style="max-width:100%"',
            '   src="data:image/png;base64,', *(f"   {line}" for line in data),
            f'   "><figcaption>{FIGURE_CAPTION}</figcaption></figure>', ""]


def _literal(sentence: str) -> str:
    """Markdown's `code` as reST's literal (double backticks)."""
    import re

    return re.sub(r"`([^`]+)`", r"``\1``", sentence)


def _rst_cell(cell: str) -> str:
    """A table cell's text as reST that reads as the text: markup characters escaped, and
    a start that reST would take for a list or an enumeration escaped too."""
    import re

    cell = re.sub(r"([\\`*_|])", r"\\\1", str(cell))
    return "\\" + cell if re.match(r"^([-+#]|\d+[.)]|[a-zA-Z][.)]\s)", cell) else cell


def rst_table(frame: pd.DataFrame) -> list[str]:
    """A DataFrame as a reST list-table (its columns the header row)."""
    frame = _table_frame(frame)
    out = [".. list-table::", "   :header-rows: 1", ""]
    for cells in [list(frame.columns), *(list(row) for row in frame.itertuples(index=False))]:
        for number, cell in enumerate(cells):
            text = _rst_cell(cell)
            out.append(f"   {'* -' if number == 0 else '  -'}{' ' + text if text else ''}")
    return out + [""]


def restructured_text(sections, figure=None) -> str:
    """The same sections as reStructuredText, for the report's first screen; ``figure``
    (the EQC figure's PNG) is shown after the classes."""
    out = [TITLE, "=" * len(TITLE), "", PREAMBLE, ""]
    for heading, items in sections:
        out += [heading, "-" * len(heading), ""]
        for item in items:
            if isinstance(item, pd.DataFrame):
                out += ([""] if out[-1] != "" else []) + rst_table(item)
            else:
                out.append(f"- {_literal(item)}")
        out += [] if out[-1] == "" else [""]
        if figure and heading == FIGURE_AFTER:
            out += embedded_figure(figure)
    return "\n".join(out)


def fingerprints(records) -> dict:
    """{device: fingerprint} of the records that ran, the first record of a device kept;
    records without one (failure records, unreadable files) and empty fingerprints are
    left out, and a fingerprint of the wrong shape is refused (RecordError)."""
    from bitdrift.record.reader import read_fingerprint

    found = {}
    for path in records:
        read = read_fingerprint(path)
        if read and read[1]:
            device, fingerprint = read
            found.setdefault(device, fingerprint)
    return found


def write_findings(tables: dict, records, out_markdown, out_rst=None, figure=None,
                   study_sections=(), planned=None) -> list:
    """findings.md (and the report's .rst) from the tables and the first record, with the
    studies' sections (StudySection) and the plan's notes on the devices (``planned``:
    :func:`findings`); the EQC figure's PNG (``figure``) follows the classes (linked in the
    Markdown, inline in the report)."""
    from bitdrift.atomic import atomic_output

    sections = findings(tables, fingerprints(records), study_sections, planned,
                        final_outputs(records))
    for path, text in ((out_markdown, markdown(sections, figure, out_markdown)),
                       (out_rst, restructured_text(sections, figure) if out_rst else None)):
        if path:
            with atomic_output(path) as tmp:
                Path(tmp).write_text(text)
    return sections
