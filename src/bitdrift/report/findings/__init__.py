"""Findings, generated per machine: sentences written from the run's own tables about the
CPU it ran on (``results/findings.md``, and the report's first section). Nothing here is a
fact about CPUs in general: another machine's run writes its own findings.

One module per section's concept: ``answer`` (the answer in short, first: classes, bits
lost, labels between devices, the setting that explains most), ``machine`` (the CPU, its
instruction sets, the emulated devices), ``classes`` (equivalence classes, what explains
them, reduced precision, the argmax agreement), ``divergence`` (where devices part),
``orders`` (how the layers sum), ``quantization`` (quantized models against their float
model), ``quantized_parting`` (where a quantized model's devices part, and how their
integers do), ``checks`` (the observer check, the devices that
failed), ``atlas`` (this machine among the machines); ``text`` holds the list-shortening
helpers they share, and ``document`` reads the tables and the records' fingerprints, puts
the sections in order and writes them as Markdown and reStructuredText (a section's item:
a sentence, or a DataFrame written as a table). The names other code uses are here.
"""

from bitdrift.report.findings.document import (  # noqa: F401  (the public names)
    TABLES,
    StudySection,
    findings,
    write_findings,
)
