"""The observer check (bitdrift.analysis.observer): the model as deployed beside the instrumented
run. A real case where exposing a tensor changes the output (ONNX Runtime's MatMul+Add ->
Gemm fusion, blocked by the exposed MatMul output), and records built by hand whose truth
is known: the record keeps both outputs, the classes are the deployed outputs', the table
and the findings name the device whose instrumentation changed its output."""

import json

import numpy as np
import pandas as pd
import pytest

from bitdrift import backends
from bitdrift.analysis.eqc import eqc_tables
from bitdrift.analysis.observer import changed_devices, observer_check, observer_table, record_check
from bitdrift.backends.exported.common import deployed_session
from bitdrift.record.hdf5 import DEPLOYED, OUTPUT
from bitdrift.record.reader import Record
from bitdrift.record.writer import write_record
from bitdrift.report.findings.checks import observer
from tests.utils import BASE_ATTRS

# A Dense layer whose sum cancels: the first term 2**24, the last -2**24, the others 0, and
# a bias of 1. Every partial sum is exact in float32 (2**24 is, and 2**24 + 0 is), so
# adding the bias last gives exactly 1, in any order of the terms. Adding the bias into
# the accumulator before the last term gives 2**24 + 1, which float32 rounds to 2**24
# (ties to even), and 0 after the -2**24: what a GEMM that takes the bias as its C
# operand (beta = 1) and sums the inner dimension in blocks does. K spans several of
# MLAS's K blocks (128 or 256 terms) on any x86 CPU.
TERMS, UNITS, ROWS = 1024, 128, 4


def dense_onnx(expose: bool):
    """x -> MatMul -> Add(bias) -> y as ONNX; ``expose`` also lists the MatMul's output as a
    graph output, as recording every tensor would."""
    from onnx import TensorProto, helper, numpy_helper

    kernel = np.zeros((TERMS, UNITS), np.float32)
    kernel[0], kernel[-1] = 2.0**24, -(2.0**24)
    bias = np.ones(UNITS, np.float32)
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if expose:
        outputs.insert(0, helper.make_tensor_value_info("t", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "kernel"], ["t"]),
         helper.make_node("Add", ["t", "bias"], ["y"])], "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, TERMS])], outputs,
        [numpy_helper.from_array(kernel, "kernel"), numpy_helper.from_array(bias, "bias")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), kernel, bias


def ort_device(level: str) -> dict:
    return {"backend": "onnxruntime", "accelerator": "cpu", "threads": 1,
            "graph_optimization_level": level}


@pytest.fixture(scope="module")
def dense_files(tmp_path_factory):
    import onnx

    folder = tmp_path_factory.mktemp("dense")
    for name, expose in (("model.onnx", True), ("deployed.onnx", False)):
        onnx.save(dense_onnx(expose)[0], folder / name)
    return folder


def test_exposing_a_tensor_blocks_a_fusion_that_changes_the_output(dense_files, tmp_path):
    """The instrumented graph (MatMul output exposed) cannot fuse MatMul and Add; the
    deployed one runs one Gemm that adds the bias before the sum ends. The unfused program
    gives the exact result; the check, through bitdrift's deployed session, says the
    deployed output differs."""
    runtime = backends.get("onnxruntime")
    device = ort_device("all")
    accelerator = runtime.check_accelerator("dense", device)
    _, kernel, bias = dense_onnx(False)
    batch = np.ones((ROWS, TERMS), np.float32)
    exact = batch.astype(np.float64) @ kernel.astype(np.float64) + bias  # all ones
    assert np.all(exact == 1.0)

    run, describe = runtime.compile(dense_files / "model.onnx", device, dict(accelerator),
                                    trace=True)
    instrumented = run(batch)[-1]
    instrumented_ops = {node.call.primitive for node in describe()[0] if node.call}
    deployed, program = deployed_session(runtime, dense_files / "deployed.onnx", device,
                                         accelerator, "dense")
    deployed_output = deployed(batch)
    _, describe_deployed = runtime.compile(dense_files / "deployed.onnx", device,
                                           dict(accelerator), trace=True)
    deployed_ops = {node.call.primitive for node in describe_deployed()[0] if node.call}

    assert {"MatMul", "Add"} <= instrumented_ops and "Gemm" not in instrumented_ops
    assert deployed_ops == {"Gemm"}  # the fusion the exposed tensor blocked
    assert np.array_equal(instrumented, exact.astype(np.float32))  # bias added last: exact
    assert not np.array_equal(deployed_output, instrumented)  # the fused Gemm rounds 2**24 + 1
    assert "deployed.onnx" in program

    content = {0: {OUTPUT: instrumented[None], DEPLOYED: deployed_output[None]}}
    check = observer_check(content, program)
    assert check["equal"] is False and check["samples"] == {"0": False}
    # recorded, the final output the analyses read is the deployed one
    path = tmp_path / "dense.h5"
    write_record(path, {**BASE_ATTRS, "model": "dense", "device": "ort_all",
                        "observer_check": json.dumps(check)}, content)
    with Record(path) as record:
        assert np.array_equal(record.tensor(0, OUTPUT).values[0], deployed_output)
        assert np.array_equal(record.instrumented_output(0).values[0], instrumented)
        assert record_check(record)["equal"] is False


def test_without_graph_optimisations_the_deployed_model_equals_the_instrumented(dense_files):
    """The same two graphs with ONNX Runtime's optimisations off: nothing fuses, both are
    the unfused program, and their outputs are equal bit for bit."""
    runtime = backends.get("onnxruntime")
    device = ort_device("disable_all")
    accelerator = runtime.check_accelerator("dense", device)
    batch = np.ones((ROWS, TERMS), np.float32)
    run, _ = runtime.compile(dense_files / "model.onnx", device, dict(accelerator))
    deployed, _ = deployed_session(runtime, dense_files / "deployed.onnx", device,
                                   accelerator, "dense")
    instrumented, deployed_output = run(batch)[-1], deployed(batch)
    assert np.all(instrumented == 1.0)
    assert observer_check({0: {OUTPUT: instrumented[None], DEPLOYED: deployed_output[None]}},
                          "deployed.onnx")["equal"]


def test_a_deployed_file_with_every_layer_is_refused(dense_files):
    """The deployed export has the final output alone: the instrumented file given in its
    place would compare the instrumented program with itself."""
    from bitdrift.errors import InferenceError

    runtime = backends.get("onnxruntime")
    device = ort_device("all")
    accelerator = runtime.check_accelerator("dense", device)
    deployed, _ = deployed_session(runtime, dense_files / "model.onnx", device, accelerator,
                                   "dense")
    with pytest.raises(InferenceError, match="final output alone"):
        deployed(np.ones((1, TERMS), np.float32))


def _record(tmp_path, device, outputs, deployed=None, layers=True, bfloat16=False):
    """A record of ``outputs`` ({sample: (repeats, ...)}), with ``deployed`` beside it."""
    samples = {}
    for sample, values in outputs.items():
        content = {OUTPUT: np.asarray(values)}
        if layers:
            content["layers"] = [("dense", np.asarray(values))]
        if deployed is not None and sample in deployed:
            content[DEPLOYED] = np.asarray(deployed[sample])
        if bfloat16:
            content["bfloat16"] = True
        samples[sample] = content
    attrs = {**BASE_ATTRS, "model": "net", "device": device}
    if deployed is not None:
        attrs["observer_check"] = json.dumps(observer_check(
            {sample: content for sample, content in samples.items() if DEPLOYED in content},
            "deployed.onnx"))
    path = tmp_path / f"{device}.h5"
    write_record(path, attrs, samples)
    return Record(path)


def test_the_table_counts_what_the_records_hold(tmp_path):
    """One device whose deployed output is the instrumented one, one whose deployed output
    is one unit in the last place off on one sample of two, one written without the check
    (an old record): yes, no naming the sample, unchecked; the final-output classes of the
    two that hold it are the deployed outputs', the layer the instrumented run's; with the
    old record among them, the instrumented run's (compare_final_outputs)."""
    base = np.array([[0.25, 0.5, 0.75]], np.float32).repeat(2, axis=0)
    nudged = base.copy()
    nudged[:, 1] = np.nextafter(nudged[:, 1], np.float32(1))
    outputs = {0: base, 3: base}
    records = [_record(tmp_path, "same", outputs, deployed={0: base, 3: base}),
               _record(tmp_path, "changed", outputs, deployed={0: base, 3: nudged}),
               _record(tmp_path, "old", outputs)]
    rows = observer_table(records)
    by = {row["device"]: row for row in rows}
    assert by["same"]["observer_equal"] == "yes" and by["same"]["equal_samples"] == 2
    assert by["changed"]["observer_equal"] == "no" and by["changed"]["equal_samples"] == 1
    assert by["changed"]["differing_samples"] == "3"
    assert by["old"]["observer_equal"] == "unchecked"
    assert [row["device"] for row in changed_devices(rows)] == ["changed"]
    # the attribute the inference wrote says the same as the recount
    assert records[1].observer_check["samples"] == {"0": True, "3": False}

    final, layers = eqc_tables(records[:2])
    classes = final.set_index(["sample", "device"])["eqc"]
    assert classes[(3, "changed")] != classes[(3, "same")]
    assert classes[(0, "changed")] == classes[(0, "same")]
    final, layers = eqc_tables(records)
    classes = final.set_index(["sample", "device"])["eqc"]
    assert classes[(3, "changed")] == classes[(3, "same")] == classes[(3, "old")]
    dense = layers[layers["layer"] == "dense"].set_index(["sample", "device"])["eqc"]
    assert dense[(3, "changed")] == dense[(3, "same")]  # instrumented: one class
    lines = observer(pd.DataFrame(rows))
    assert "2 of 3" not in lines[0] and "1 of 2 checked devices" in lines[0]
    assert len(lines) == 3 and "instrumented program" in lines[1]
    (changed,) = lines[2].to_dict("records")  # a row per device whose deployed model differs
    assert changed["device"] == "changed" and changed["model"] == "net"
    assert changed["samples differing"] == "1 of 2"
    for record in records:
        record.close()


def test_records_of_which_some_lack_the_deployed_output_compare_one_output(tmp_path,
                                                                          capsys):
    """A sample whose deployed output one record lacks is compared as the instrumented
    run's on every record, and a warning names the record and the sample: it was compared
    as one device's deployed output against the other's instrumented one (a class more,
    silently). The observer check of that record is of the samples that hold it, not
    'unchecked' as a whole."""
    base = np.array([[0.25, 0.5, 0.75]], np.float32).repeat(2, axis=0)
    nudged = base.copy()
    nudged[:, 1] = np.nextafter(nudged[:, 1], np.float32(1))
    outputs = {0: base, 3: base}
    full = _record(tmp_path, "full", outputs, deployed={0: base, 3: nudged})
    part = _record(tmp_path, "part", outputs, deployed={0: base})
    final, _ = eqc_tables([full, part])
    classes = final.set_index(["sample", "device"])["eqc"]
    assert classes[(3, "full")] == classes[(3, "part")]
    assert classes[(0, "full")] == classes[(0, "part")]
    warning = capsys.readouterr().err
    assert (f"bitdrift: warning: model 'net': records without the deployed model's final "
            f"output: {part.path} (sample 3); the final output of sample 3 is compared as "
            "the instrumented run's on every device") in warning, warning
    by = {row["device"]: row for row in observer_table([full, part])}
    assert (by["part"]["observer_equal"], by["part"]["samples"],
            by["part"]["equal_samples"]) == ("yes", 1, 1)
    assert (by["full"]["observer_equal"], by["full"]["differing_samples"]) == ("no", "3")
    assert f"{part.path}: samples 3 hold no deployed output" in capsys.readouterr().err
    eqc_tables([full, part])  # said once
    assert "warning" not in capsys.readouterr().err
    for record in (full, part):
        record.close()


def test_bfloat16_deployed_outputs_compare_as_bits(tmp_path):
    """bfloat16 outputs are stored as raw bits: equal bits are equal, one flipped bit is a
    difference, and both datasets are marked bfloat16."""
    raw = np.array([[0x3F80, 0x4000]], np.uint16).repeat(2, axis=0)
    flipped = raw ^ np.uint16(1)
    record = _record(tmp_path, "bf16", {0: raw}, deployed={0: flipped}, bfloat16=True)
    assert record.tensor(0, OUTPUT).bfloat16 and record.instrumented_output(0).bfloat16
    assert record_check(record)["samples"] == {"0": False}
    record.close()
    same = _record(tmp_path, "bf16_same", {0: raw}, deployed={0: raw.copy()}, bfloat16=True)
    assert record_check(same)["equal"]
    same.close()


def test_the_deployed_graphs_kernels_are_named_where_they_differ():
    """compare_kernels on graphs listed by hand: a fusion that drops the Relu nodes and
    turns two Gemms into FusedGemms is named as such; equal multisets in another order
    are the same kernels."""
    from bitdrift.analysis.observer import compare_kernels

    def calls(*names):
        return [{"implementation": name} for name in names]

    fused = compare_kernels({"deployed": calls("ort Conv", "ort FusedGemm", "ort FusedGemm"),
                             "instrumented": calls("ort Conv", "ort Gemm", "ort Relu",
                                                   "ort Gemm", "ort Relu")})
    assert fused["differs"]
    assert fused["only_deployed"] == ["ort FusedGemm x2"]
    assert fused["only_instrumented"] == ["ort Gemm x2", "ort Relu x2"]
    same = compare_kernels({"deployed": calls("b", "a"), "instrumented": calls("a", "b")})
    assert not same["differs"] and same["only_deployed"] == same["only_instrumented"] == []


def test_litert_names_the_nodes_a_delegate_took_when_only_the_final_output_is_known():
    """Plans as LiteRT lists them: a delegate whose outputs are every node's (the
    instrumented file) and one whose output is its last node's alone (the deployed file)
    take the same nodes; a node outside the delegate's inputs-to-outputs path is not taken."""
    from bitdrift.backends.exported.litert import _delegated

    def op(index, name, inputs, outputs):
        return {"index": index, "op_name": name, "inputs": inputs, "outputs": outputs}

    # tensors: 0 input, 1-2 weights; conv 0 -> 3, pool 1 -> 4, fc 2 (not delegated) -> 5
    nodes = [op(0, "CONV_2D", [0, 1], [3]), op(1, "MAX_POOL_2D", [3], [4]),
             op(2, "FULLY_CONNECTED", [4, 2, -1], [5])]
    instrumented = nodes + [op(3, "DELEGATE", [0, 1], [3, 4])]
    deployed = nodes + [op(3, "DELEGATE", [0, 1], [4])]
    assert _delegated(instrumented) == _delegated(deployed) == {0, 1}
    assert _delegated(nodes) == set()  # no delegate: the built-in kernels


@pytest.mark.parametrize("stored, message", [
    ("[]", "attribute 'observer_check' is a list, not an object"),
    ("not json", "attribute 'observer_check' is not JSON"),
    ('{"program": 3}', "attribute 'observer_check': 'program' is not text")])
def test_an_observer_check_of_the_wrong_type_is_refused_naming_the_file(tmp_path, stored,
                                                                        message):
    """A record from another tool may hold anything in `observer_check`: the reader
    refuses it naming the file and the attribute, where it is read."""
    import h5py

    from bitdrift.errors import RecordError

    base = np.array([[0.25, 0.5]], np.float32)
    record = _record(tmp_path, "odd", {0: base}, deployed={0: base})
    record.close()
    with h5py.File(record.path, "r+") as handle:
        handle.attrs["observer_check"] = stored
    with pytest.raises(RecordError, match=f"{record.path}.*{message}"):
        with Record(record.path) as reopened:
            observer_table([reopened])


def test_pairs_parted_only_at_the_deployed_output_name_the_deployment(tmp_path):
    """Three devices whose one recorded layer (``dense``) is equal bit for bit: ``keras``'s
    deployed model gives another final output than its instrumented run on sample 0 (as
    TensorFlow's predict did at float16), ``other`` gives its own final output from its
    instrumented run on sample 1 (the final op parts after the last recorded layer), and
    ``plain`` agrees with itself. divergence.csv names, per pair, the device whose deployed
    output differs (recounted here from the datasets), and the findings attribute the
    pairs parting at the output to it, and the other pair to the final output itself."""
    from bitdrift.analysis.divergence import class_pairs, divergence_table
    from bitdrift.analysis.explain import coverage
    from bitdrift.record.reader import open_records
    from bitdrift.report.findings.divergence import divergence

    layer = np.array([[0.25, 0.5, 0.75]], np.float32).repeat(2, axis=0)
    nudged = layer.copy()
    nudged[:, 0] = np.nextafter(nudged[:, 0], np.float32(1))
    final = {"keras": ({0: layer, 1: layer}, {0: nudged, 1: layer}),
             "other": ({0: layer, 1: nudged}, {0: layer, 1: nudged}),
             "plain": ({0: layer, 1: layer}, {0: layer, 1: layer})}
    paths = []
    for device, (instrumented, deployed) in final.items():
        samples = {sample: {OUTPUT: instrumented[sample], DEPLOYED: deployed[sample],
                            "layers": [("dense", layer)]} for sample in (0, 1)}
        path = tmp_path / f"{device}.h5"
        write_record(path, {**BASE_ATTRS, "model": "net", "device": device,
                            "observer_check": json.dumps(observer_check(samples, "p"))},
                     samples)
        paths.append(path)
    records = open_records(paths)
    table = divergence_table(records)
    parted = class_pairs(table)
    assert set(parted["first_layer"]) == {"output"}
    for row in parted.itertuples():
        expected = [device for device in (row.device_a, row.device_b)
                    if not np.array_equal(final[device][0][row.sample],
                                          final[device][1][row.sample])]
        assert row.deployed_differs.split() == expected
    # sample 0: keras against the class of other and plain; sample 1: other against the rest
    assert sorted(parted["deployed_differs"]) == ["", "keras"]
    eqc, _ = eqc_tables(records)
    rows = coverage(records, table, eqc)
    assert rows[0]["deployed_only"] == 2
    counted, said = divergence(table, pd.DataFrame(rows))[-2:]
    assert "2 part only at the deployed model's final output" in counted
    assert "the deployed model of keras (1) gives another final output than its own " \
        "instrumented run" in said
    assert "at 1 neither device's deployed model differs" in said
    for record in records:
        record.close()


@pytest.mark.parametrize("level", ["all", "disable_all"])
def test_a_users_onnx_model_exposes_the_graph_onnx_runtime_deploys(dense_files, tmp_path,
                                                                   level):
    """The dense model above as a user's ONNX file (MatMul, then Add: the fusion the
    exposed MatMul output blocked) run through bitdrift on ONNX Runtime: with every
    optimisation the recorded layers are the node outputs of the graph ONNX Runtime
    deploys (a Gemm: the MatMul's output ``t`` is fused away, unmapped, never given
    another value), its final output is the deployed model's bit for bit (the observer
    check passes, where exposing ``t`` gave the exact 1 against the deployed Gemm's 0),
    and the observer table says what was exposed; without optimisations nothing fuses
    and ``t`` is recorded, equal to numpy's product."""
    import onnx
    from onnx import TensorProto, helper

    from bitdrift.config import validate_config
    from bitdrift.run.inference import infer

    model = dense_onnx(False)[0]  # with its output's shape, which the ONNX checker asks
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                            [None, UNITS]))
    onnx.save(model, tmp_path / "user.onnx")
    np.save(tmp_path / "inputs.npy", np.ones((ROWS, TERMS), np.float32))
    device = {**ort_device(level), "repeats": 2, "batch_size": ROWS}
    config = validate_config({"models": {"user": {"file": str(tmp_path / "user.onnx"),
                                                  "inputs": str(tmp_path / "inputs.npy")}},
                              "devices": {"ort": device}, "samples": [0, 1]})
    out = tmp_path / "ort.h5"
    infer(model_name="user", device_name="ort", device=config["devices"]["ort"],
          model_path=tmp_path / "user.onnx", dataset_path=tmp_path / "inputs.npy",
          samples=[0, 1], out=out, layers=True, kernels=False)
    _, kernel, bias = dense_onnx(False)
    with Record(out) as record:
        check = record_check(record)
        assert check["equal"] and record.observer_check["equal"]
        deployed = record.tensor(0, OUTPUT).values[0]
        assert np.array_equal(record.instrumented_output(0).values[0], deployed)
        names = [info.name for info in record.layers(0) if not info.final]
        unmapped = record.json_attr("unmapped_layers", list, [])
        (row,) = observer_table([record])
    assert "optimised graph" in row["instrumented"]
    assert "optimised graph" in observer(pd.DataFrame([row]))[0]
    if level == "all":
        # ONNX Runtime's Gemm adds the bias inside the blocked sum: 2**24 + 1 rounds to
        # 2**24, and the sum ends at 0 (the unfused MatMul, then Add, gives exactly 1)
        assert np.all(deployed == 0.0)
        assert names == ["y"] and unmapped == ["t"]  # y: the final output, by its name
    else:
        assert np.all(deployed == 1.0) and names == ["t", "y"] and unmapped == []
        with Record(out) as record:
            product = record.tensor(0, "t").values[0]
        assert np.array_equal(product, (np.ones((1, TERMS)) @ kernel.astype(np.float64))
                              .astype(np.float32)[0])
        assert bias.shape == product.shape


def test_the_observer_sentence_says_what_each_instrumented_run_exposed(tmp_path):
    """Records of a Keras model (no model_format in the fingerprint), of a .tflite file
    and of a .pt2 program: the sentence counts the equal ones per instrumentation, each
    named by what it exposed, and a changed device's line names its own."""
    base = np.array([[0.25, 0.5]], np.float32).repeat(2, axis=0)
    nudged = base.copy()
    nudged[:, 1] = np.nextafter(nudged[:, 1], np.float32(1))
    records = []
    for device, model_format, deployed in (("keras_ok", None, base),
                                           ("tflite_ok", "tflite", base),
                                           ("pt2_changed", "pt2", nudged)):
        accelerator = {"accelerator": "cpu", **({"model_format": model_format}
                                                if model_format else {})}
        samples = {0: {OUTPUT: base, DEPLOYED: deployed, "layers": [("dense", base)]}}
        path = tmp_path / f"{device}.h5"
        write_record(path, {**BASE_ATTRS, "model": "net", "device": device,
                            "fingerprint": {"hostname": "h", "accelerator": accelerator},
                            "observer_check": json.dumps(observer_check(samples, "p"))},
                     samples)
        records.append(Record(path))
    lines = observer(pd.DataFrame(observer_table(records)))
    assert lines[:4] == [
        "The deployed model (final output only) gives the instrumented run's final output "
        "bit for bit on 2 of 3 checked devices.",
        "Of those whose instrumented run exposed one output per Keras layer: 1 of 1.",
        "Of those whose instrumented run exposed every tensor of the .tflite file: 1 of 1.",
        "Of those whose instrumented run exposed every module call of the .pt2 program: 0 "
        "of 1."]
    assert list(lines[-1]["instrumented run exposed"]) == ["every module call of the .pt2 "
                                                           "program"]
    for record in records:
        record.close()
