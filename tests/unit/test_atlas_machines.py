"""The atlas's machines in words (bitdrift.atlas.machines), the figure's cells
(bitdrift.report.figures.machines.atlas_grid) against hand-built cases, and docs/atlas.md's
list of machines against the shipped entries."""

import numpy as np
import pytest

from bitdrift.atlas import machines
from bitdrift.atlas.entries import THIS_MACHINE, Row, default_folder, read_atlas, rows_table
from bitdrift.cli import main
from bitdrift.report.figures import machines as figure
from tests.utils import ROOT

# CPUs as the fingerprint describes them (bitdrift.run.devices.fingerprint)
XEON = {"brand": "Intel(R) Xeon(R) Processor", "vendor": "GenuineIntel", "family": 6,
        "model": 207, "stepping": 2, "arch": "X86_64"}
ZEN4 = {"brand": "AMD EPYC 9R14 96-Core Processor", "vendor": "AuthenticAMD", "family": 25,
        "model": 17, "stepping": 1, "arch": "X86_64"}
DESKTOP = {"brand": "Intel(R) Core(TM) i7-9700K CPU @ 3.60GHz", "vendor": "GenuineIntel",
           "family": 6, "model": 158, "arch": "X86_64"}
HASWELL_QEMU = {"brand": "Intel Core Processor (Haswell, no TSX, IBRS)",
                "vendor": "GenuineIntel", "family": 6, "model": 60, "arch": "X86_64"}
NEOVERSE = {"brand": "Arm Neoverse-N1", "vendor": "0x41", "family": "8", "model": "0xd0c",
            "arch": "AARCH64"}
# one GPU as torch and as JAX describe it
H100 = [{"accelerator": "gpu", "gpu_count": 1, "gpu_name": "NVIDIA H100 80GB HBM3"},
        {"accelerator": "gpu", "compute_capability": "9.0", "gpu_count": 1,
         "gpu_name": "NVIDIA H100 80GB HBM3"}]


@pytest.mark.parametrize(("machine", "label"), [
    ({"cpu": XEON}, "Intel Xeon Emerald Rapids (fam 6 model 207)"),
    ({"cpu": ZEN4}, "AMD EPYC 9R14 96-Core Zen 4 (fam 25 model 17)"),
    ({"cpu": DESKTOP}, "Intel Core i7-9700K (fam 6 model 158)"),  # no microarchitecture known
    ({"cpu": HASWELL_QEMU, "emulated": {"model": "Haswell-v4", "host": "AMD EPYC"}},
     "emulated Intel Core Haswell (fam 6 model 60)"),
    ({"cpu": NEOVERSE, "emulated": {"model": "neoverse-n1", "host": "AMD EPYC"}},
     "emulated Arm Neoverse-N1"),  # an Arm family is the architecture's version
    ({"cpu": XEON, "gpus": H100},
     "Intel Xeon Emerald Rapids (fam 6 model 207) with NVIDIA H100 80GB HBM3"),
])
def test_a_machine_is_labelled_by_its_cpu_model_gpu_and_emulation(machine, label):
    assert machines.machine_label(machine) == label


def test_a_gpu_machines_cpu_device_ran_on_its_host_cpu():
    machine = {"cpu": XEON, "gpus": H100}
    cpu_device = {"accelerator": {"accelerator": "cpu"}}
    gpu_device = {"accelerator": {"accelerator": "gpu", "gpu_name": "NVIDIA H100 80GB HBM3"}}
    assert machines.processor(machine, cpu_device) == \
        "Intel Xeon Emerald Rapids (fam 6 model 207)"
    assert machines.processor(machine, gpu_device) == "NVIDIA H100 80GB HBM3"


def row(device, machine, same, first="", remaining=None, label=None):
    return Row(device, machine, "CPU", 1, same, first, "other hardware", remaining,
               label=label or machine)


def test_the_figures_cells_mean_the_same_in_every_column():
    """Hand-built: machine B gives this machine's bits on d1 and parts on d2, machine C is
    configured otherwise on d1 and did not run d2; a differing cell names the layer and the
    bits left."""
    rows = [row("d1", THIS_MACHINE, True, remaining=23.0, label="Here CPU"),
            row("d2", THIS_MACHINE, True, remaining=23.0, label="Here CPU"),
            row("d1", "c.json.gz", False, "configured otherwise", label="Intel C"),
            row("d1", "b.json.gz", True, remaining=23.0, label="AMD B"),
            row("d2", "b.json.gz", False, "a_very_long_layer_name", 15.0, label="AMD B"),
            row("d1", "e.json.gz", False, "conv2d", None, label="emulated A")]
    grid = figure.atlas_grid(rows_table(rows))
    assert grid.machines == ["this machine: Here CPU", "AMD B", "Intel C", "emulated A"]
    assert grid.devices == ["d1", "d2"]
    assert grid.kinds.tolist() == [[figure.THIS, figure.THIS],
                                   [figure.SAME, figure.DIFFERS],
                                   [figure.CONFIGURED, figure.NOT_RUN],
                                   [figure.DIFFERS, figure.NOT_RUN]]
    assert grid.texts[1][1] == "a_very_long…\n15 bits" and grid.texts[3][0] == "conv2d\n? bits"
    # one colour per meaning, whatever the column
    assert len(set(figure.CELL_COLOURS)) == len(figure.CELL_KINDS)
    assert np.unique(grid.kinds[:, 0]).size == 4


def test_the_figure_of_the_shipped_atlas_is_drawn(tmp_path):
    """The shipped atlas's Xeon entry as this machine against the others: rows by label,
    never by the entry's file."""
    from bitdrift.atlas.entries import compare

    atlas = read_atlas(default_folder())
    xeon = "intel-r-xeon-r-processor-family-6-model-207-bedae6846307.json.gz"
    this = [atlas.entries.pop(xeon)]
    table = rows_table(compare(this, atlas))
    figure.plot_atlas(table, tmp_path / "atlas.pdf")
    grid = figure.atlas_grid(table)
    assert grid.machines[0] == "this machine: Intel Xeon Emerald Rapids (fam 6 model 207)"
    assert not any(".json" in name for name in grid.machines)
    # the 30 default devices and two quantized ones (litert_*+quantized)
    assert len(grid.machines) == len(atlas.entries) + 1 and len(grid.devices) == 32
    assert (tmp_path / "atlas.png").stat().st_size


def test_the_shipped_xeon_entry_holds_the_30_default_devices_and_two_quantized():
    import yaml

    from bitdrift.config import validate_config

    atlas = read_atlas(default_folder())
    assert not atlas.refused
    entry = atlas.entries["intel-r-xeon-r-processor-family-6-model-207-bedae6846307.json.gz"]
    assert machines.machine_label(entry["machine"]) == \
        "Intel Xeon Emerald Rapids (fam 6 model 207)"
    config = validate_config(yaml.safe_load((ROOT / "config.yaml").read_text()))
    quantized = ["litert_builtin+quantized", "litert_xnnpack+quantized"]
    assert sorted(entry["devices"]) == sorted([*config["devices"], *quantized])
    assert len(entry["devices"]) == 32
    assert {entry["devices"][device]["config"]["quantize"]["tool"] for device in quantized} \
        == {"litert"}


def test_docs_list_of_machines_is_the_entries():
    """docs/atlas.md's list is generated: an entry added without it fails here."""
    doc = ROOT / "docs" / "atlas.md"
    expected = machines.machines_list(read_atlas(default_folder()).entries, default_folder())
    assert machines.listed(doc.read_text()) == expected, (
        "docs/atlas.md's list of machines is not the shipped entries'; regenerate it: "
        "bitdrift atlas list --doc docs/atlas.md")


def test_atlas_list_writes_the_list_into_a_document(tmp_path, capsys):
    doc = tmp_path / "doc.md"
    doc.write_text(f"before\n{machines.LIST_BEGIN}\nold\n{machines.LIST_END}\nafter\n")
    assert main(["atlas", "list", "--doc", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("before\n") and text.endswith("\nafter\n") and "old" not in text
    assert machines.listed(text) == machines.machines_list(read_atlas(default_folder()).entries,
                                                           default_folder())
    assert main(["atlas", "list", "--doc", str(tmp_path / "none.md")]) == 2
    assert "none.md: cannot be read" in capsys.readouterr().err


def test_the_shipped_atlas_and_reference_model_are_package_data():
    """A wheel carries the reference model and the atlas (pyproject's package-data globs,
    relative to the package): each shipped file matches one."""
    import fnmatch
    import json
    import re

    from bitdrift.inputs import reference_set

    # read by hand: tomllib is Python 3.11's, and the project runs on 3.10 too
    globs = json.loads(re.search(r"^\[tool\.setuptools\.package-data\]\nbitdrift = (\[.*\])$",
                                 (ROOT / "pyproject.toml").read_text(), re.MULTILINE)[1])
    package = ROOT / "src" / "bitdrift"
    shipped = [path for path in reference_set.FOLDER.rglob("*")
               if path.is_file() and path.suffix not in (".py", ".pyc")]
    assert len(shipped) >= 3 + len(read_atlas(default_folder()).entries)
    for path in shipped:
        name = path.relative_to(package).as_posix()
        assert any(fnmatch.fnmatch(name, pattern) for pattern in globs), \
            f"{name} is not in pyproject.toml's [tool.setuptools.package-data]"
