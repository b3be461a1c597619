"""Atlas entries (bitdrift.atlas.entries) from hand-made records of the reference model:
the entry against digests computed here, the comparison against known equal and different
layers, and one line for each entry that cannot be read."""

import gzip
import hashlib
import json

import numpy as np
import pandas as pd
import pytest

from bitdrift.atlas import entries as atlas_entries
from bitdrift.atlas.entries import THIS_MACHINE, AtlasError, add, compare, read_atlas, read_entry
from bitdrift.cli import main
from bitdrift.inputs import reference_set
from bitdrift.record.writer import write_record
from bitdrift.report.figures.machines import plot_atlas

MODEL = reference_set.manifest()["model"]["model_sha256"]
SAMPLES = (0, 1)
LAYERS = ("conv2d", "dense")
ZEN4 = {"brand": "AMD EPYC", "vendor": "AuthenticAMD", "family": 25, "model": 17,
        "stepping": 1, "arch": "X86_64", "flags": ["avx2", "avx512f"], "count": 2}
HASWELL = {**ZEN4, "brand": "Intel Xeon E5-2680 v3", "vendor": "GenuineIntel", "family": 6,
           "model": 63, "flags": ["avx2", "fma"]}
CONFIG = {"accelerator": "cpu", "backend": "tensorflow", "threads": 1, "repeats": 2}


def tensors(seed):
    """Per sample: per layer a float32 tensor (the final output last), deterministic in
    ``seed``."""
    rng = np.random.default_rng(seed)
    return {sample: {layer: rng.standard_normal(6).astype(np.float32)
                     for layer in (*LAYERS, "output")} for sample in SAMPLES}


def flipped(values, bit):
    """``values`` with mantissa bit ``bit`` (0: the lowest) of its first element flipped."""
    raw = values.view(np.uint32).copy()
    raw[0] ^= np.uint32(1 << bit)
    return raw.view(np.float32)


def record(path, device, cpu, values, tensorflow="2.21.0", model=MODEL, accelerator=None,
           platform="Linux-6-x86_64", python="3.11.7", quantization=None):
    """A record of ``device`` on a machine of ``cpu``: two equal repeats of each tensor;
    ``quantization``: of the reference model quantized (``model`` the quantized file's
    digest), as the workflow's fingerprint says it (bitdrift.run.record_attrs)."""
    fingerprint = {"hostname": "h", "platform": platform, "cpu": cpu,
                   "accelerator": accelerator or {"accelerator": "cpu"},
                   "versions": {"python": python, "tensorflow": tensorflow}}
    if quantization is not None:
        fingerprint["quantization"] = {"model": "atlas_reference", "model_file": "r.keras",
                                       "model_sha256": MODEL, **quantization}
    write_record(path, {"model": "atlas_reference", "device": device, "backend": "tensorflow",
                        "precision": "float32", "fingerprint": fingerprint,
                        "model_sha256": model, "input_sha256": "i" * 64,
                        "device_config": json.dumps(CONFIG)},
                 {sample: {"output": np.stack([layers["output"]] * 2),
                           "layers": [(name, np.stack([layers[name]] * 2)) for name in LAYERS]}
                  for sample, layers in values.items()})
    return path


def digest(values):
    """SHA-256 of format, shape and bytes (bitdrift.atlas.digest_index.output_digest), spelled
    here."""
    found = hashlib.sha256(f"float32:{values.shape}:".encode())
    found.update(values.tobytes())
    return found.hexdigest()[:atlas_entries.DIGEST_HEX]


def test_add_then_read_gives_the_records_digests_and_bits(tmp_path):
    values = {"d1": tensors(1), "d2": tensors(2)}
    paths = [record(tmp_path / f"{d}.h5", d, ZEN4, values[d]) for d in values]
    [(path, _)] = add(paths, tmp_path / "atlas")
    entry = read_entry(path, MODEL)
    assert path.stat().st_size < 4096  # kilobytes
    assert entry["format_version"] == atlas_entries.FORMAT_VERSION
    assert entry["machine"]["cpu"]["family"] == 25 and "hostname" not in json.dumps(entry)
    assert entry["software"]["versions"] == {"python": "3.11.7", "tensorflow": "2.21.0"}
    for device, samples in values.items():
        part = entry["devices"][device]
        assert part["layers"] == [*LAYERS, "output"]
        assert part["config"] == CONFIG
        for sample, layers in samples.items():
            assert part["digests"][str(sample)] == [digest(layers[name])
                                                    for name in (*LAYERS, "output")]
            bits, form = atlas_entries.output_values(part["outputs"][str(sample)])
            assert form == "float32"
            assert bits.tolist() == layers["output"].view(np.uint32).tolist()


def test_compare_names_the_first_layer_and_software_against_hardware(tmp_path):
    here, same_cpu, other_cpu = tensors(1), tensors(1), tensors(1)
    same_cpu[1]["dense"] = flipped(same_cpu[1]["dense"], 2)  # apart from the 2nd layer
    same_cpu[1]["output"] = flipped(same_cpu[1]["output"], 4)  # 5 low bits differ: 18 left
    other_cpu[0]["conv2d"] = flipped(other_cpu[0]["conv2d"], 0)  # from the 1st layer
    atlas = tmp_path / "atlas"
    add([record(tmp_path / "b.h5", "d1", ZEN4, same_cpu, tensorflow="2.20.0")], atlas)
    add([record(tmp_path / "c.h5", "d1", HASWELL, other_cpu)], atlas)
    add([record(tmp_path / "e.h5", "d1", HASWELL, here, tensorflow="2.19.0")], atlas)
    this = atlas_entries.entries_from_records([record(tmp_path / "a.h5", "d1", ZEN4, here)])
    rows = compare(this, read_atlas(atlas))
    assert len(rows) == 4 and rows[0].machine == THIS_MACHINE
    own = rows[0]
    assert (own.cls, own.same_as_this, own.remaining_precision) == (1, True, 23.0)
    software = next(r for r in rows if r.difference.startswith("software only"))
    assert software.difference == ("software only, same hardware (tensorflow 2.21.0 vs "
                                   "2.20.0)")
    assert (software.same_as_this, software.first_difference) == (False, "dense")
    assert software.remaining_precision == 23 - 5 and software.cls == 2
    hardware = [r for r in rows if r.difference.startswith("other hardware")]
    apart = next(r for r in hardware if not r.same_as_this)
    assert apart.difference == "other hardware" and apart.first_difference == "conv2d"
    assert apart.remaining_precision == 23.0 and apart.cls == 3  # the output agrees
    same = next(r for r in hardware if r.same_as_this)  # other CPU and version, same bits
    assert same.cls == 1 and same.difference.startswith("other hardware and software")
    # read as machines x devices: the cells and the versions named once per machine
    grid = atlas_entries.machines_by_devices(rows)
    assert grid.columns.tolist() == ["machine", "d1", atlas_entries.DIFFERS_COLUMN]
    assert grid.values.tolist() == [
        ["AMD EPYC Zen 4 (fam 25 model 17)", "parts at `dense`, 18 bits left",
         "tensorflow 2.20.0 (here 2.21.0)"],
        # two entries of one CPU: told apart by the version they differ in
        ["Intel Xeon E5-2680 v3 Haswell-EP (fam 6 model 63), tensorflow 2.19.0", "same bits",
         "tensorflow 2.19.0 (here 2.21.0)"],
        ["Intel Xeon E5-2680 v3 Haswell-EP (fam 6 model 63), tensorflow 2.21.0",
         "parts at `conv2d`, 23 bits left", "none"]]
    assert atlas_entries.agreeing(rows) == [grid.values[1][0]]
    # the table read back gives the same rows (what the findings read)
    atlas_entries.rows_table(rows).to_csv(tmp_path / "atlas.csv", index=False)
    assert atlas_entries.rows_from_table(pd.read_csv(tmp_path / "atlas.csv")) == rows


KERNEL_BUILDS = ("Linux-6.18.44-fc-v657-x86_64-with-glibc2.36",
                 "Linux-6.18.44-fc-v669-x86_64-with-glibc2.36")


def test_a_kernel_build_string_is_no_software_difference(tmp_path):
    """Two machines whose platforms differ in the kernel's build string alone (as this
    machine's and the atlas's AMD entry did): the same hardware gives "none", another
    gives "other hardware", never "software" naming the OS; the C library's version still
    counts (its libm computes transcendental functions)."""
    here = tensors(1)
    atlas = tmp_path / "atlas"
    add([record(tmp_path / "b.h5", "d1", ZEN4, here, platform=KERNEL_BUILDS[1])], atlas)
    add([record(tmp_path / "c.h5", "d1", HASWELL, here, platform=KERNEL_BUILDS[1])], atlas)
    add([record(tmp_path / "e.h5", "d1", HASWELL, here, tensorflow="2.19.0",
                platform=KERNEL_BUILDS[1].replace("glibc2.36", "glibc2.39"))], atlas)
    this = atlas_entries.entries_from_records([record(tmp_path / "a.h5", "d1", ZEN4, here,
                                                      platform=KERNEL_BUILDS[0])])
    rows = compare(this, read_atlas(atlas))
    by_kind = sorted(row.difference for row in rows if row.machine != THIS_MACHINE)
    assert by_kind == ["none", "other hardware",
                       "other hardware and software (tensorflow 2.21.0 vs 2.19.0, libc "
                       "glibc 2.36 vs glibc 2.39)"]
    assert all(row.same_as_this for row in rows)
    assert sorted(row.differs for row in rows if row.machine != THIS_MACHINE) == [
        "", "", "tensorflow 2.19.0 (here 2.21.0), glibc 2.39 (here 2.36)"]
    named = " ".join(row.differs + row.difference for row in rows)
    assert "v657" not in named and "os " not in named


def test_python_numpy_and_h5py_are_no_arithmetic_difference(tmp_path):
    """The interpreter's version computes nothing of the model: never named as a software
    difference, the runtime's version is."""
    here = tensors(1)
    atlas = tmp_path / "atlas"
    add([record(tmp_path / "b.h5", "d1", HASWELL, here, python="3.12.3")], atlas)
    this = atlas_entries.entries_from_records([record(tmp_path / "a.h5", "d1", ZEN4, here)])
    [_, other] = compare(this, read_atlas(atlas))
    assert (other.difference, other.differs) == ("other hardware", "")
    assert atlas_entries.version_differences(
        {"versions": {"python": "3.11.7", "numpy": "2.4", "h5py": "3.14", "torch": "2.13"}},
        {"versions": {"python": "3.12.3", "numpy": "2.5", "h5py": "3.16", "torch": "2.11"}}) \
        == {"torch": ("2.13", "2.11")}


def write_entry(path, entry):
    path.write_bytes(gzip.compress(json.dumps(entry).encode()))


def test_each_bad_entry_is_left_out_with_one_line(tmp_path, capsys):
    atlas = tmp_path / "atlas"
    [(good, entry)] = add([record(tmp_path / "a.h5", "d1", ZEN4, tensors(1))], atlas)
    write_entry(atlas / "newer.json.gz", {**entry, "format_version": 99})
    (atlas / "truncated.json.gz").write_bytes(good.read_bytes()[:40])
    (atlas / "damaged.json.gz").write_bytes(gzip.compress(b'{"format_version": 1, "ref'))
    write_entry(atlas / "other_model.json.gz",
                {**entry, "machine": {**entry["machine"], "cpu": HASWELL},
                 "reference": {**entry["reference"], "model_sha256": "f" * 64}})
    write_entry(atlas / "zz_twin.json.gz", entry)  # one machine and version twice
    short = json.loads(json.dumps(entry))
    short["devices"]["d1"]["outputs"]["0"]["bits"] = short["devices"]["d1"]["outputs"]["0"][
        "bits"][:-8]
    write_entry(atlas / "short_bits.json.gz", short)
    found = read_atlas(atlas)
    assert list(found.entries) == [good.name]
    reasons = {line.split(": ", 1)[0].rsplit("/", 1)[-1]: line for line in found.refused}
    assert set(reasons) == {"newer.json.gz", "truncated.json.gz", "damaged.json.gz",
                            "other_model.json.gz", "zz_twin.json.gz", "short_bits.json.gz"}
    assert "sample 0's output bits are not hex of its shape and format" in \
        reasons["short_bits.json.gz"]
    assert "format 99, newer than this bitdrift reads (1)" in reasons["newer.json.gz"]
    assert "damaged or truncated gzip" in reasons["truncated.json.gz"]
    assert "not JSON" in reasons["damaged.json.gz"]
    assert "model digest ffffffffffff..., not the reference model's" in \
        reasons["other_model.json.gz"]
    assert f"second entry of one machine and versions (also {good})" in \
        reasons["zz_twin.json.gz"]
    # the command goes on: a warning line per refused entry, then the comparison
    assert main(["atlas", "compare", str(tmp_path / "a.h5"), "--atlas", str(atlas)]) == 0
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 6 and all(
        line.startswith("bitdrift: warning: ") for line in err.strip().splitlines())
    assert out.startswith("1 machine of the atlas ran this machine's atlas devices (1 real, 0 "
                          "emulated by QEMU); 1 gives this machine's bits on every device both "
                          "ran: AMD EPYC Zen 4 (fam 25 model 17).\n")
    assert out.rstrip().splitlines()[-1].split() == [
        "AMD", "EPYC", "Zen", "4", "(fam", "25", "model", "17)", "same", "bits", "none"]


def test_add_never_overwrites_an_entry_silently(tmp_path, capsys):
    atlas = tmp_path / "atlas"
    first = record(tmp_path / "a.h5", "d1", ZEN4, tensors(1))
    [(path, _)] = add([first], atlas)
    before = path.read_bytes()
    # the same machine and versions, another device: refused, the entry as it was
    second = record(tmp_path / "b.h5", "d2", ZEN4, tensors(2))
    assert main(["atlas", "add", str(second), "--atlas", str(atlas)]) == 3
    assert "already holds this machine and these versions" in capsys.readouterr().err
    assert path.read_bytes() == before
    assert main(["atlas", "add", str(first), str(second), "--atlas", str(atlas),
                 "--replace"]) == 0
    assert sorted(read_entry(path)["devices"]) == ["d1", "d2"]
    # another library version is another entry beside it
    third = record(tmp_path / "c.h5", "d1", ZEN4, tensors(1), tensorflow="2.22.0")
    add([third], atlas)
    assert len(read_atlas(atlas).entries) == 2


def test_add_refuses_a_record_of_another_model(tmp_path):
    other = record(tmp_path / "a.h5", "d1", ZEN4, tensors(1), model="e" * 64)
    with pytest.raises(AtlasError, match="a.h5: model digest eeeeeeeeeeee... is not the "
                       "reference model's"):
        add([other], tmp_path / "atlas")
    assert not (tmp_path / "atlas").exists()


def test_identify_against_the_atlas(tmp_path, capsys):
    atlas = tmp_path / "atlas"
    add([record(tmp_path / "a.h5", "d1", ZEN4, tensors(1)),
         record(tmp_path / "a2.h5", "d2", ZEN4, tensors(2))], atlas)
    assert main(["identify", str(tmp_path / "a.h5"), "--atlas", str(atlas)]) == 0
    assert capsys.readouterr().out.rstrip().endswith("family 25 model 17 "
                                                     f"[{next(atlas.iterdir()).name}]: d1")
    near = tensors(1)
    near[0]["output"] = flipped(near[0]["output"], 6)  # 7 low bits apart from d1: 16 left
    assert main(["identify", str(record(tmp_path / "q.h5", "q", HASWELL, near)),
                 "--atlas", str(atlas)]) == 1
    said = capsys.readouterr().out
    assert "no match in the atlas; nearest by remaining precision of the final output " \
        "(16 bits)" in said and said.rstrip().endswith(": d1")


def test_atlas_devices_are_the_configs_scheduled_devices():
    import yaml

    from bitdrift.config import validate_config
    from bitdrift.errors import ConfigError
    from tests.utils import ROOT

    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    assert validate_config(dict(config))["atlas"]["devices"] == [
        "tf_2threads", "tf_no_onednn", "torch_1thread"]
    config["atlas"] = {"devices": ["tf_2threads", "tf_nowhere"]}
    with pytest.raises(ConfigError, match="config key atlas.devices: unknown device "
                       "'tf_nowhere'"):
        validate_config(config)


def gpu(name, driver):
    """A GPU as bitdrift.backends.keras.torch.check_accelerator describes it."""
    return {"accelerator": "gpu", "gpu_name": name, "compute_capability": "9.0",
            "cuda_version": "12.8", "cudnn_version": 91000, "driver_version": driver,
            "gpu_count": 1, "cudnn_deterministic": False, "cudnn_benchmark": False}


def test_gpu_machines_driver_is_software_and_the_findings_section(tmp_path):
    from bitdrift.report.findings import findings
    from bitdrift.report.findings.atlas import ATLAS_HEADING

    atlas = tmp_path / "atlas"
    h100 = gpu("NVIDIA H100 80GB HBM3", "570.1")
    here = [record(tmp_path / "h100.h5", "torch_gpu", ZEN4, tensors(1), accelerator=h100),
            record(tmp_path / "h100_cpu.h5", "torch_1thread", ZEN4, tensors(3))]
    h200 = tensors(1)
    h200[0]["dense"] = flipped(h200[0]["dense"], 3)
    add([record(tmp_path / "h200.h5", "torch_gpu", ZEN4, h200,
                accelerator=gpu("NVIDIA H200", "570.1")),
         record(tmp_path / "h200_cpu.h5", "torch_1thread", ZEN4, tensors(3))], atlas)
    [(_, entry)] = add([record(tmp_path / "h100b.h5", "torch_gpu", ZEN4, tensors(1),
                               accelerator=gpu("NVIDIA H100 80GB HBM3", "580.2"))], atlas)
    assert entry["machine"]["gpus"] == [{"accelerator": "gpu", "compute_capability": "9.0",
                                         "gpu_count": 1, "gpu_name": "NVIDIA H100 80GB HBM3"}]
    assert entry["software"]["versions"]["driver_version"] == "580.2"
    this = atlas_entries.entries_from_records(here)
    rows = compare(this, read_atlas(atlas))
    # a GPU machine's CPU device ran on its host CPU, its GPU device on the GPU
    ran_on = {(row.label, row.device): row.name for row in rows}
    zen4 = "AMD EPYC Zen 4 (fam 25 model 17)"
    assert ran_on[(f"{zen4} with NVIDIA H200", "torch_1thread")] == zen4
    assert ran_on[(f"{zen4} with NVIDIA H200", "torch_gpu")] == "NVIDIA H200"
    assert not any(".json.gz" in row.label for row in rows)
    atlas_entries.rows_table(rows).to_csv(tmp_path / "atlas.csv", index=False)
    pd.DataFrame(columns=list(atlas_entries.REFUSED_COLUMNS)).to_csv(
        tmp_path / "refused.csv", index=False)
    sections = dict(findings({"atlas": tmp_path / "atlas.csv",
                              "atlas_refused": tmp_path / "refused.csv"}, {}))
    [summary, explained, table] = sections[ATLAS_HEADING]
    assert summary == ("2 machines of the atlas ran this machine's atlas devices (2 real, 0 "
                       "emulated by QEMU); 1 gives this machine's bits on every device both "
                       f"ran: {zen4} with NVIDIA H100 80GB HBM3.")
    assert explained.startswith('A cell: "same bits" on every layer and sample, or ')
    # the other driver of the same H100: software only, named once; the H200: apart at dense
    assert table.values.tolist() == [
        [f"{zen4} with NVIDIA H100 80GB HBM3", "same bits", "not run",
         "driver_version 580.2 (here 570.1)"],
        [f"{zen4} with NVIDIA H200", "parts at `dense`, 23 bits left", "same bits", "none"]]
    assert table.columns.tolist() == ["machine", "torch_gpu", "torch_1thread",
                                      atlas_entries.DIFFERS_COLUMN]
    # a table's line, as Markdown writes it: its cells and the bars between them
    assert all(len(line) < 300 for line in [summary, explained, *(
        "| " + " | ".join(map(str, row)) + " |" for row in table.values)])


def test_the_findings_table_holds_four_devices_at_most_per_table():
    """Many devices: a table per four (lines of a readable length), the versions that differ
    in the first; every machine in each."""
    from bitdrift.report.findings.atlas import atlas as section

    devices = [f"device_{n}" for n in range(6)]
    rows = [atlas_entries.Row(d, THIS_MACHINE, "CPU", 1, True, "", "none", 23.0, label="here")
            for d in devices]
    rows += [atlas_entries.Row(d, "b.json.gz", "CPU", 1 + n % 2, n % 2 == 0,
                               "" if n % 2 == 0 else "conv2d", "other hardware", 15.0,
                               label="Other CPU", differs="torch 2.11 (here 2.13)")
             for n, d in enumerate(devices)]
    items = section(atlas_entries.rows_table(rows), pd.DataFrame())
    first, second = items[2:]
    assert first.columns.tolist() == ["machine", *devices[:4], atlas_entries.DIFFERS_COLUMN]
    assert second.columns.tolist() == ["machine", *devices[4:]]
    assert first.values.tolist() == [["Other CPU", "same bits", "parts at `conv2d`, 15 bits left",
                                      "same bits", "parts at `conv2d`, 15 bits left",
                                      "torch 2.11 (here 2.13)"]]
    assert items[0] == ("1 machine of the atlas ran this machine's atlas devices (1 real, 0 "
                        "emulated by QEMU); 0 give this machine's bits on every device both "
                        "ran.")


def test_no_device_ran_the_reference_model(tmp_path):
    """Every record a failure record: the comparison, its table and figure still written."""
    from bitdrift.record.writer import write_failure

    failed = tmp_path / "d1.h5"
    write_failure(failed, {"model": "atlas_reference", "device": "d1",
                           "backend": "tensorflow"}, "out of memory")
    atlas = tmp_path / "atlas"
    add([record(tmp_path / "a.h5", "d1", ZEN4, tensors(1))], atlas)
    table = atlas_entries.compare_records([failed], read_atlas(atlas), table=tmp_path / "t.csv")
    plot_atlas(table, tmp_path / "f.pdf")
    from bitdrift.report.findings.atlas import atlas as section

    assert section(table, pd.DataFrame()) == ["No device ran the reference model."]
    assert pd.read_csv(tmp_path / "t.csv").empty and (tmp_path / "f.png").stat().st_size


def test_many_agreeing_machines_are_counted_not_named():
    from bitdrift.report.findings.atlas import atlas as section

    rows = [atlas_entries.Row("d1", THIS_MACHINE, "CPU", 1, True, "", "none", 23.0,
                              label="here")]
    rows += [atlas_entries.Row("d1", f"m{n}.json.gz", "CPU", 1, True, "", "other hardware",
                               23.0, label=f"Intel Xeon Emerald Rapids (fam 6 model 207) #{n}")
             for n in range(5)]
    [summary, _, table] = section(atlas_entries.rows_table(rows), pd.DataFrame())
    assert summary.endswith("; 5 give this machine's bits on every device both ran.")
    assert table["d1"].tolist() == ["same bits"] * 5


FULL_INTEGER = {"tool": "litert", "mode": "full_integer", "inference_input_type": "float32",
                "inference_output_type": "float32"}
QUANTIZED = "q" * 64  # the quantized file's SHA-256
SKYLAKE = {**HASWELL, "brand": "Intel Core i7-6700", "model": 94}
SAPPHIRE = {**HASWELL, "brand": "Intel Xeon Platinum 8480", "model": 143,
            "flags": ["avx2", "avx512f", "avx512_vnni", "amx_int8"]}


def test_quantized_devices_compare_only_with_the_same_quantization(tmp_path):
    """A hand-built atlas of the quantized device d1+quantized: one machine with the same
    bits, one parting at `dense`, one of other quantization settings and one whose
    quantizer wrote other bytes (neither compared: configured otherwise)."""
    here = tensors(5)
    parting = tensors(5)
    parting[0]["dense"] = flipped(parting[0]["dense"], 1)  # apart from the 2nd layer on
    parting[0]["output"] = flipped(parting[0]["output"], 6)  # 7 low bits differ: 16 left
    dynamic = {"tool": "litert", "mode": "dynamic_range"}
    atlas = tmp_path / "atlas"

    def quantized(name, cpu, values, settings=FULL_INTEGER, model=QUANTIZED):
        return record(tmp_path / f"{name}.h5", "d1", cpu, values, model=model,
                      quantization=settings)

    add([quantized("same", HASWELL, tensors(5))], atlas)
    add([quantized("parting", SKYLAKE, parting)], atlas)
    add([quantized("settings", SAPPHIRE, tensors(5), settings=dynamic)], atlas)
    add([quantized("bytes", {**SAPPHIRE, "model": 207}, tensors(5), model="b" * 64)], atlas)
    this = atlas_entries.entries_from_records([
        record(tmp_path / "float.h5", "d1", ZEN4, tensors(1)),
        quantized("here", ZEN4, here)])
    [entry] = this
    # the float run and the quantized run of d1 side by side, the quantized one's
    # configuration its quantizer's settings and the quantized file's digest
    assert list(entry["devices"]) == ["d1", "d1+quantized"]
    assert entry["devices"]["d1+quantized"]["config"] == {
        **CONFIG, "quantize": {**FULL_INTEGER, "model_sha256": QUANTIZED}}
    assert "quantize" not in entry["devices"]["d1"]["config"]
    assert entry["devices"]["d1+quantized"]["digests"]["0"] == [
        digest(here[0][name]) for name in (*LAYERS, "output")]
    rows = compare(this, read_atlas(atlas))
    grid = atlas_entries.machines_by_devices(rows)
    assert grid.columns.tolist() == ["machine", "d1", "d1+quantized",
                                     atlas_entries.DIFFERS_COLUMN]
    cells = {row[0]: row[2] for row in grid.values.tolist()}
    assert cells == {
        "Intel Xeon E5-2680 v3 Haswell-EP (fam 6 model 63)": "same bits",
        "Intel Core i7-6700 Skylake (fam 6 model 94)": "parts at `dense`, 16 bits left",
        "Intel Xeon Platinum 8480 Sapphire Rapids (fam 6 model 143)": "configured otherwise",
        "Intel Xeon Platinum 8480 Emerald Rapids (fam 6 model 207)": "configured otherwise"}
    # no machine of the atlas ran the float d1
    assert {row[1] for row in grid.values.tolist()} == {atlas_entries.NOT_RUN}
    quantized_rows = {row.label: row for row in rows if row.device == "d1+quantized"}
    assert quantized_rows["Intel Core i7-6700 Skylake (fam 6 model 94)"].first_difference \
        == "dense"
    # classes across machines: this machine's and the same bits one class, each other its own
    assert sorted(row.cls for row in quantized_rows.values()) == [1, 1, 2, 3, 4]
    assert atlas_entries.agreeing(rows) == ["Intel Xeon E5-2680 v3 Haswell-EP (fam 6 model 63)"]
    # the figure draws the quantized device's column
    plot_atlas(atlas_entries.rows_table(rows), tmp_path / "atlas.pdf")
    assert (tmp_path / "atlas.pdf").stat().st_size > 0


def test_a_quantized_record_of_another_float_model_is_refused(tmp_path):
    other = record(tmp_path / "a.h5", "d1", ZEN4, tensors(1), model=QUANTIZED,
                   quantization={**FULL_INTEGER, "model_sha256": "e" * 64})
    with pytest.raises(AtlasError, match="a.h5: model quantized from digest eeeeeeeeeeee... "
                       "is not the reference model's"):
        add([other], tmp_path / "atlas")


def test_atlas_quantized_devices_are_the_quantizers_runtimes():
    import yaml

    from bitdrift import paths
    from bitdrift.config import validate_config
    from bitdrift.errors import ConfigError
    from bitdrift.plan import Plan
    from tests.utils import ROOT

    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    checked = validate_config(yaml.safe_load((ROOT / "config.yaml").read_text()))
    assert checked["atlas"]["quantize"] == FULL_INTEGER
    assert checked["atlas"]["quantized_devices"] == ["litert_xnnpack"]
    plan = Plan(checked)
    plan.add_atlas_model()
    assert plan.atlas_record_files()[-1] == paths.atlas_quantized_record_file("litert_xnnpack")
    assert plan.quantization(paths.ATLAS_QUANTIZED_MODEL)["tool"] == "litert"
    assert plan.model_devices(paths.ATLAS_QUANTIZED_MODEL) == [
        device for device, entry in checked["devices"].items()
        if entry["backend"] == "litert"]
    # the core's quantization tables stay the config's own models
    assert paths.ATLAS_QUANTIZED_MODEL not in plan.quantized_models
    for atlas, message in (
            ({"quantized_devices": ["tf_2threads"]}, "config key atlas.quantized_devices: "
             "device 'tf_2threads' runs tensorflow; the litert quantizer's model runs on "
             "litert"),
            ({"quantize": {"tool": "onnxruntime"}, "quantized_devices": ["ort_all"]},
             "config key atlas.quantize.tool: the onnxruntime quantizer takes onnx, not the "
             "Keras reference model"),
            ({"quantize": {"mode": "int4"}}, "config key atlas.quantize.mode: 'int4' is none")):
        with pytest.raises(ConfigError, match=message):
            validate_config({**config, "atlas": atlas})


def test_merge_adds_quantized_devices_to_the_machines_entry(tmp_path, capsys):
    atlas = tmp_path / "atlas"
    [(first, before)] = add([record(tmp_path / "f.h5", "d1", ZEN4, tensors(1))], atlas)
    quantized = record(tmp_path / "q.h5", "d1", ZEN4, tensors(2), model=QUANTIZED,
                       quantization=FULL_INTEGER)
    assert main(["atlas", "add", str(quantized), "--atlas", str(atlas)]) == 3
    assert "already holds this machine and these versions" in capsys.readouterr().err
    [(path, entry)] = add([quantized], atlas, merge=True)
    assert sorted(atlas.iterdir()) == [path] and path == first  # the versions are the same
    assert list(read_entry(path, MODEL)["devices"]) == ["d1", "d1+quantized"]
    assert read_entry(path)["devices"]["d1"] == before["devices"]["d1"]  # kept as it was
    with pytest.raises(AtlasError, match=r"already holds device\(s\) d1\+quantized; not "
                       "merged"):
        add([quantized], atlas, merge=True)


def test_the_quantized_reference_model_is_the_same_bytes_each_time(tmp_path):
    """The atlas compares a quantized device only where the quantized files' SHA-256 match:
    the quantizer must write the same bytes for the same versions (here: twice)."""
    from bitdrift.backends import quantizers

    digests = []
    for name in ("a.tflite", "b.tflite"):
        quantizers.quantize_model(reference_set.model_file(), tmp_path / name,
                                  {"tool": "litert"}, reference_set.inputs_file())
        digests.append(hashlib.sha256((tmp_path / name).read_bytes()).hexdigest())
    assert digests[0] == digests[1]


def test_the_shipped_atlas_holds_a_quantized_device_of_two_machines():
    """The shipped entries with litert_xnnpack+quantized: each of the same quantized file,
    one CPU emulated on two hosts told apart by the host."""
    atlas = read_atlas(atlas_entries.default_folder(), MODEL)
    holding = [entry["devices"]["litert_xnnpack+quantized"] for entry in atlas.entries.values()
               if "litert_xnnpack+quantized" in entry["devices"]]
    assert len(holding) >= 2
    assert len({part["config"]["quantize"]["model_sha256"] for part in holding}) == 1
    labels = {row.label for row in compare(None, atlas)}
    assert {"emulated Intel Core Haswell (fam 6 model 60) on AMD EPYC",
            "emulated Intel Core Haswell (fam 6 model 60) on Intel Xeon"} <= labels
