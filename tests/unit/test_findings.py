"""Findings are generated from the tables: hand-built tables whose answers are known."""

import pandas as pd

from bitdrift.findings import findings, machine, markdown, restructured_text

# Four float32 devices over two samples: a and b agree on both, c apart on both, d joins c
# on sample 1 only; one bfloat16 device.
EQC = [("a", 0, 1), ("b", 0, 1), ("c", 0, 2), ("d", 0, 3), ("e", 0, 1),
       ("a", 1, 1), ("b", 1, 1), ("c", 1, 2), ("d", 1, 2), ("e", 1, 1)]
PRECISION = {"a": "float32", "b": "float32", "c": "float32", "d": "float32", "e": "bfloat16"}


def _tables(tmp_path, failed=True):
    eqc = pd.DataFrame([{"model": "m", "sample": sample, "device": device, "eqc": eqc,
                         "deterministic": True, "distinct_outputs": 1, "majority_count": 2}
                        for device, sample, eqc in EQC])
    layers = pd.DataFrame([{"model": "m", "sample": 0, "layer": "dense", "device": device,
                            "precision": precision} for device, precision in PRECISION.items()])
    effective = pd.DataFrame([
        {"model": "m", "device": "c", "precision": "float32", "layer": "conv",
         "reduced": True, "format": "bfloat16", "effective_bits": 7.6},
        {"model": "m", "device": "c", "precision": "float32", "layer": "dense",
         "reduced": False, "format": "float32", "effective_bits": 22.0},
        {"model": "m", "device": "a", "precision": "float32", "layer": "conv",
         "reduced": False, "format": "float32", "effective_bits": 23.0}])
    failures = pd.DataFrame([{"model": "m", "device": "ov_gpu", "backend": "openvino",
                              "reason": "asks for a GPU", "log": "logs/x.log"}] if failed
                            else [], columns=["model", "device", "backend", "reason", "log"])
    paths = {}
    for name, table in (("eqc", eqc), ("eqc_layers", layers), ("effective_precision",
                                                               effective),
                        ("device_failures", failures)):
        paths[name] = tmp_path / f"{name}.csv"
        table.to_csv(paths[name], index=False)
    return paths


FINGERPRINT = {"platform": "Linux", "cpu": {
    "brand": "Test CPU", "vendor": "GenuineIntel", "family": 6, "model": 1, "count": 2,
    "arch": "X86_64", "flags": ["sse4_1", "avx", "avx2", "fma", "avx512f", "avx512_bf16"]}}


HASWELL = {"cpu": {"brand": "Intel Core Processor (Haswell)", "flags": ["avx", "avx2", "fma"]},
           "emulation": {"model": "Haswell-v4", "qemu": "7.2"}}


def test_findings_say_what_the_tables_hold(tmp_path):
    sections = dict(findings(_tables(tmp_path), {"a": FINGERPRINT, "haswell": HASWELL}))
    classes = sections["Equivalence classes"]
    # sample 0: {a, b}, c, d -> 3 classes; sample 1: {a, b}, {c, d} -> 2
    assert "m, float32: 3/2 classes among 4 devices on test samples #0, #1 (final output)." \
        in classes
    assert "m, float32: bit for bit identical on every sample: {a, b}. In a class of their " \
        "own: c, d." in classes
    assert any(line.startswith("m, bfloat16: 1/1 classes among 1 devices") for line in classes)
    (reduced,) = sections["Devices computing below their declared format"]
    assert reduced.startswith("c (m) declares float32 but computes bfloat16-like: 7.6 "
                              "effective bits at worst, in 1 of 2 checked layers (conv)")
    assert sections["Devices that failed"] == ["ov_gpu (m): asks for a GPU (log: logs/x.log)"]
    assert "Devices that ran: 5; failed: 1." in sections["Machine"]
    assert "Emulated by QEMU 7.2 as Haswell-v4 (Intel Core Processor (Haswell); it saw AVX, " \
        "AVX2, FMA): haswell." in sections["Machine"]
    assert "Test CPU" in sections["Machine"][0]  # the machine is the native record's
    text = markdown(findings(_tables(tmp_path), {"a": FINGERPRINT, "haswell": HASWELL}))
    assert text.startswith("# Findings on this machine") and "## Devices that failed" in text


def test_the_machine_is_named_with_the_instruction_sets_it_has_and_lacks():
    lines = machine(FINGERPRINT)
    assert "Test CPU" in lines[0]
    assert lines[1] == ("Instruction sets that steer the kernels: SSE4.1, AVX, AVX2, FMA, "
                        "AVX-512, AVX512_BF16; not present: AVX512_VNNI, AVX512_FP16, AMX.")


def test_no_failure_and_the_report_text_is_valid_rest(tmp_path):
    from docutils.core import publish_parts
    from docutils.utils import Reporter

    sections = findings(_tables(tmp_path, failed=False), {"a": FINGERPRINT})
    assert dict(sections)["Devices that failed"] == ["None: every scheduled device ran."]
    html = publish_parts(restructured_text(sections), writer="html",
                         settings_overrides={"halt_level": Reporter.WARNING_LEVEL})["body"]
    assert "Findings on this machine" in html or "Machine" in html


def test_the_replay_count_leaves_out_what_was_not_revealed_or_replayed():
    """Five Dense layers by hand: two reproduced, one that differs, one whose order was not
    revealed, one not replayed (float64): "2 of 3", and the one that differs is named."""
    import pandas as pd

    from bitdrift.findings import orders

    table = pd.DataFrame({
        "model": ["m"] * 5, "device": ["a", "b", "c", "d", "e"], "layer": ["dense"] * 5,
        "order": ["sequential, bias last"] * 3 + ["not revealed", "sequential, bias last"],
        "replay": ["bit-identical with FMA", "bit-identical without FMA",
                   "differs: 3 of 10 values bit-identical at best (with FMA)",
                   "the runtime computes in bfloat16", "not replayed: float64"]})
    lines = orders(table)
    assert lines[0].endswith("for 2 of 3 (device, layer) pairs.")
    assert any(line.startswith("m, c, dense: not reproduced (differs: 3 of 10") for line in lines)
    assert not any(", d, dense: not reproduced" in line for line in lines)
    assert any(line == "m: order not revealed (the runtime computes in bfloat16): d."
               for line in lines)


def test_the_eqc_figure_follows_the_classes_inline_in_the_report(tmp_path):
    """The report's first screen shows the EQC figure after the classes: docutils renders
    an <img> whose data URI decodes to the PNG's own bytes, between the classes and the
    next section; findings.md links it relative to itself."""
    import base64
    import re

    from docutils.core import publish_parts
    from docutils.utils import Reporter

    png = tmp_path / "figures" / "eqc.png"
    png.parent.mkdir()
    # larger than docutils' 10,000 characters a line: the base64 is wrapped
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 64)
    sections = findings(_tables(tmp_path, failed=False), {"a": FINGERPRINT})
    html = publish_parts(restructured_text(sections, png), writer="html",
                         settings_overrides={"halt_level": Reporter.WARNING_LEVEL})["body"]
    (data,) = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert base64.b64decode("".join(data.split())) == png.read_bytes()
    assert html.index("Equivalence classes") < html.index("<img") < html.index(
        "Devices computing below")
    text = markdown(sections, png, tmp_path / "findings.md")
    assert "![equivalence classes](figures/eqc.png)" in text
    assert text.index("## Equivalence classes") < text.index("![") < text.index(
        "## Devices computing")
