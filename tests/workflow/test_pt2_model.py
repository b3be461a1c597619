"""A user's PyTorch torch.export program (.pt2, a CNN with batch norm and a depthwise
convolution) with its own .npy inputs through the workflow: torch eager records every
module's output under its module path, torch.compile (Inductor) the final output alone and
says so, ONNX Runtime the program converted by torch.onnx.export; a program no converter
takes (torch.linalg.eigh) fails the converted device alone, the converter's reason in the
failure record, while torch eager and Inductor still run it."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from bitdrift.inputs.examples import torch_cnn
from bitdrift.record.reader import Record
from tests.utils import snakemake

pytestmark = pytest.mark.workflow
DEVICES = {
    "eager_1t": {"accelerator": "cpu", "backend": "torch_export", "threads": 1, "repeats": 2},
    "inductor_default": {"accelerator": "cpu", "backend": "torch_inductor", "threads": 1,
                         "inductor_options": ["default"], "repeats": 1},
    "ort_all": {"accelerator": "cpu", "backend": "onnxruntime", "threads": 1, "repeats": 2},
}
SAMPLES = [0, 1, 3]


class Eigh(torch.nn.Module):
    """A projection, then the eigenvalues of a symmetric 4x4 matrix: torch runs it, and
    no converter here has an op for aten._linalg_eigh."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 16)

    def forward(self, x):
        matrix = self.proj(x).reshape(-1, 4, 4)
        return torch.linalg.eigh(matrix @ matrix.transpose(1, 2))[0]


@pytest.fixture(scope="module")
def pt2_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("pt2_workflow")
    torch_cnn.write(workdir / "cnn.pt2", workdir / "cnn.npy", samples=6)
    torch.manual_seed(0)
    program = torch.export.export(Eigh().eval(), (torch.zeros(2, 4),), dynamic_shapes=(
        {0: torch.export.Dim("batch", max=1024)},))
    torch.export.save(program, workdir / "eigh.pt2")
    np.save(workdir / "eigh.npy", np.random.default_rng(2).standard_normal((6, 4))
            .astype(np.float32))
    config = workdir / "config.yaml"
    config.write_text(yaml.safe_dump({
        "samples": SAMPLES, "analysis": {"precision": "float32"}, "devices": DEVICES,
        "models": {"cnn": {"file": "cnn.pt2", "inputs": "cnn.npy"},
                   "eigh": {"file": "eigh.pt2", "inputs": "eigh.npy"}}}))
    result = snakemake(workdir, "all", configfile=config, check=False)
    return workdir, result.returncode, result.stdout + result.stderr


def test_eager_records_every_module_by_its_path_as_hooks_see_it(pt2_run):
    workdir, _, said = pt2_run
    module = torch_cnn.build_module()
    # the leaf modules, by their paths, from the module itself (not from the program)
    leaves = [name for name, child in module.named_modules()
              if name and not list(child.children())]
    captured = {}
    for name in leaves:
        module.get_submodule(name).register_forward_hook(
            lambda _, __, output, name=name: captured.__setitem__(name, output.numpy().copy()))
    inputs = np.load(workdir / "cnn.npy")
    with Record(workdir / "results/inference/cnn/eager_1t.h5") as record, torch.no_grad():
        for sample in SAMPLES:
            assert [info.name for info in record.layers(sample) if not info.final] == leaves
            module(torch.from_numpy(inputs[sample:sample + 1]))  # batch_size 1, as the device
            for name in leaves:
                np.testing.assert_array_equal(record.tensor(sample, name).values[0],
                                              captured[name][0], err_msg=name)
        assert record.fingerprint["accelerator"]["model_format"] == "pt2"
        assert record.fingerprint["versions"]["torch"] == torch.__version__


def test_inductor_records_the_final_output_alone_and_says_so(pt2_run):
    workdir, _, _ = pt2_run
    with Record(workdir / "results/inference/cnn/inductor_default.h5") as record:
        assert [info.label for info in record.layers(SAMPLES[0])] == ["output"]
        accelerator = record.fingerprint["accelerator"]
        assert "no per-layer outputs" in accelerator["per_layer"]
        assert any(name.startswith("cpp_fused_") for name in accelerator["compiled_kernels"])
        module = torch_cnn.build_module()
        inputs = torch.from_numpy(np.load(workdir / "cnn.npy")[SAMPLES])
        with torch.no_grad():
            expected = module(inputs).numpy()
        for row, sample in enumerate(SAMPLES):
            np.testing.assert_allclose(record.tensor(sample, "output").values[0],
                                       expected[row], rtol=1e-4, atol=1e-5)


def test_the_conversion_keeps_the_module_paths_it_can(pt2_run):
    workdir, _, _ = pt2_run
    with Record(workdir / "results/inference/cnn/ort_all.h5") as record:
        names = [info.name for info in record.layers(SAMPLES[0]) if not info.final]
        accelerator = record.fingerprint["accelerator"]
        unmapped = json.loads(record.attr("unmapped_layers"))
    assert accelerator["converter"] == "torch.onnx.export(dynamo=True)"
    assert accelerator["converter_versions"]["torch"] == torch.__version__
    # every eager layer is either recorded under its own path or listed as unmapped
    with Record(workdir / "results/inference/cnn/eager_1t.h5") as eager:
        eager_names = [info.name for info in eager.layers(SAMPLES[0]) if not info.final]
    assert sorted(names + unmapped) == sorted(eager_names)
    assert names == [name for name in eager_names if name in names]  # in the model's order
    assert "classifier" in names


def test_classes_recounted_from_the_records(pt2_run):
    workdir, _, _ = pt2_run
    eqc = pd.read_csv(workdir / "results/tables/eqc.csv")
    cnn = eqc[eqc["model"] == "cnn"]
    assert sorted(set(cnn["device"])) == sorted(DEVICES)
    for sample, rows in cnn.groupby("sample"):
        outputs = set()
        for device in DEVICES:
            with Record(workdir / f"results/inference/cnn/{device}.h5") as record:
                outputs.add(record.tensor(sample, "output").values[0].tobytes())
        assert rows["eqc"].nunique() == len(outputs)


def test_a_failed_conversion_fails_the_converted_device_alone(pt2_run):
    workdir, returncode, said = pt2_run
    assert returncode != 0 and "1 device(s) failed" in said
    failures = pd.read_csv(workdir / "results/tables/device_failures.csv")
    assert failures[["model", "device"]].values.tolist() == [["eigh", "ort_all"]]
    reason = failures["reason"].iloc[0]
    assert "torch.onnx.export(dynamo=True)" in reason and "aten._linalg_eigh" in reason
    inputs = np.load(workdir / "eigh.npy")
    torch.manual_seed(0)
    module = Eigh().eval()  # the same seeded weights as the saved program
    with torch.no_grad():
        expected = module(torch.from_numpy(inputs)).numpy()
    for device in ("eager_1t", "inductor_default"):
        with Record(workdir / f"results/inference/eigh/{device}.h5") as record:
            for sample in SAMPLES:
                np.testing.assert_allclose(record.tensor(sample, "output").values[0],
                                           expected[sample], rtol=1e-4, atol=1e-5)
    assert "ort_all" in (workdir / "results/findings.md").read_text()


def test_layered_devices_part_at_a_layer_beside_a_compiled_one(pt2_run):
    """Inductor records no layers; eager and the ONNX conversion still part at the first
    layer both record where their values differ, found here by numpy."""
    workdir, _, _ = pt2_run
    divergence = pd.read_csv(workdir / "results/tables/divergence.csv",
                             dtype={"first_layer": str, "note": str}).fillna(
        {"first_layer": "", "note": ""})
    rows = divergence[divergence["model"] == "cnn"]
    for row in rows.itertuples():
        pair = {row.device_a, row.device_b}
        if "inductor_default" in pair:
            assert row.first_layer == "" and row.note == "no layers recorded"
            continue
        with Record(workdir / f"results/inference/cnn/{row.device_a}.h5") as a, \
                Record(workdir / f"results/inference/cnn/{row.device_b}.h5") as b:
            shared = [info.name for info in a.layers(row.sample)
                      if not info.final and info.label in b.layer_labels(row.sample)]
            first = next((name for name in shared if not np.array_equal(
                a.tensor(row.sample, name).values[0], b.tensor(row.sample, name).values[0])),
                "")
        assert row.first_layer == first, row
