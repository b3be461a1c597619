"""A record's root attributes (docs/record-format.md), made by the parent once the repeats
are merged: what ran (model, device, digests of the inputs and files), and the checks made
from the values the record holds: effective precision, the replay of the revealed
summation orders, the observer check, the agreement with TensorFlow's classes."""

from __future__ import annotations

import json

import numpy as np

from bitdrift.analysis.effective_precision import describe_reduced
from bitdrift.errors import InferenceError
from bitdrift.inputs.datasets import file_digest, input_sha256, read_test_images
from bitdrift.inputs.models import model_digest
from bitdrift.progress import progress
from bitdrift.record.hdf5 import DEPLOYED, OUTPUT
from bitdrift.record.repeats import FirstRepeats
from bitdrift.record.writer import RecordWriter


def record_attrs(writer: RecordWriter, meta: dict, weights: dict, classes, expected,
                 full: list[int], selected: set[int], deployed: bool, *, model_name,
                 device_name, device, model_path, dataset_path, samples, layers, export,
                 deployed_export, replay, log, quantization=None) -> dict:
    """The record's root attributes, the checks among them made from the values the
    record holds (read back from ``writer``, a layer at a time)."""
    layer_names = [name for position, (name, _) in enumerate(meta["layers"])
                   if position in selected]
    sample_images = read_test_images(dataset_path, list(samples))
    full_images = sample_images[[list(samples).index(sample) for sample in full]]
    # no check without a sample whose layers keep their values (analysis.full_samples: 0):
    # the record then says unchecked (bitdrift.analysis.effective_precision.unchecked_reason)
    effective = check_effective_precision(
        meta.get("checked", {}), weights, lambda sample, name: writer.read(
            sample, name).values if name in layer_names else None,
        full, full_images, device["precision"],
        log=log, what=f"{model_name} on {device_name}") if layers and full else None
    orders = meta.get("orders")
    if orders:
        from bitdrift.analysis.accumulation.replay import replay_layers

        # Every revealed order is named; without recorded layers there is nothing to
        # replay it against, and replay_layers says so per layer
        first = FirstRepeats(writer, layer_names if full else [], full)
        replayed = progress(None, "orders replayed", total=len(orders), file=log)

        def report(layer, number, count, entry, seconds):  # a line per layer: minutes in all
            said = "none, its order not revealed" if entry["order"] == "not revealed" \
                else entry["replay"]
            print(f"bitdrift: {model_name} on {device_name}: replay of {layer} ({number}/"
                  f"{count}): {said}, {seconds:.1f} s", file=log, flush=True)
            replayed.update()

        with replayed:
            orders = replay_layers(orders, meta.get("checked", {}) if layers else {},
                                   weights, first, device["precision"],
                                   full_images.astype(np.float32), **(replay or {}),
                                   report=report)
    finding = describe_reduced(effective or {}, device, device_name, model_name)
    if finding:
        print(finding, file=log, flush=True)
    from bitdrift.run.devices import emulation_host

    fingerprint = emulation_host(meta["fingerprint"])
    if quantization is not None and fingerprint is not None:
        # the model is the quantizer's output: how it was made, from which float model
        fingerprint["quantization"] = {
            **quantization, "model_sha256": model_digest(quantization["model_file"])}
    attrs = {
        "model": model_name, "device": device_name, "backend": device["backend"],
        "precision": device["precision"], "fingerprint": fingerprint,
        "model_sha256": model_digest(model_path), "input_sha256": input_sha256(sample_images),
        "accelerator": device["accelerator"], "batch_size": device["batch_size"],
        "repeats": device["repeats"], "device_config": json.dumps(device, sort_keys=True),
        # the rows the samples ran in (the record lists them sorted): bitdrift.run.repro
        "samples_order": json.dumps([int(sample) for sample in samples]),
    }
    if list(full) != list(samples):
        attrs["full_samples"] = json.dumps([int(sample) for sample in full])
    if effective is not None:
        attrs["effective_precision"] = json.dumps(effective, sort_keys=True)
    if meta.get("unmapped"):
        attrs["unmapped_layers"] = json.dumps(meta["unmapped"])
    if orders:
        attrs["accumulation_orders"] = json.dumps(orders, sort_keys=True)
    if export:
        attrs["export_sha256"] = file_digest(export)
    if deployed:
        from bitdrift.analysis.observer import observer_check

        bfloat16 = bool(meta["bfloat16"])
        check = observer_check({sample: {
            OUTPUT: writer.read(sample, OUTPUT, final=True).values,
            DEPLOYED: writer.read(sample, DEPLOYED, final=True).values,
            "bfloat16": bfloat16} for sample in samples}, meta.get("deployed_program", ""))
        attrs["observer_check"] = json.dumps(check, sort_keys=True)
        if deployed_export:
            attrs["deployed_export_sha256"] = file_digest(deployed_export)
        if not check["equal"]:
            print(f"bitdrift: warning: device {device_name!r}: {check['summary']}", file=log,
                  flush=True)
    if expected is not None and classes is not None:
        reduced = bool(finding) or (meta["fingerprint"] or {}).get("accelerator", {}).get(
            "final_output_mapping") == "reduced"
        agreement = check_agreement(classes, expected, device, device_name, model_name,
                                    reduced=reduced)
        attrs["argmax_agreement"] = json.dumps(agreement, sort_keys=True)
    return attrs


def check_agreement(classes, reference, device: dict, device_name: str,
                    model_name: str, reduced: bool = False) -> dict:
    """The device's agreement with TensorFlow's classes; a float32 or float64 device below
    ARGMAX_AGREEMENT is a bug in a runtime or an export, not a class of its own. A device
    found computing in a narrower format (``reduced``) must still reach
    ARGMAX_AGREEMENT_REDUCED: a wrong export classes near chance."""
    from bitdrift.backends.keras.export import (
        ARGMAX_AGREEMENT,
        ARGMAX_AGREEMENT_REDUCED,
        argmax_agreement,
    )

    agreement = argmax_agreement(classes, reference)
    floor = ARGMAX_AGREEMENT_REDUCED if reduced else ARGMAX_AGREEMENT
    if device["precision"] in ("float32", "float64") and agreement["share"] < floor:
        computed = " (it computes in a narrower format)" if reduced else ""
        raise InferenceError(
            f"device {device_name!r}, model {model_name!r}: its class agrees with "
            f"TensorFlow's on {agreement['agreeing']} of {agreement['images']} test images "
            f"({agreement['share']:.1%}, below {floor:.0%}{computed}): a bug in the runtime "
            "or the export, not a class of its own")
    return agreement


def check_effective_precision(checked: dict, weights: dict, read, samples: list[int],
                              sample_images: np.ndarray, precision: str, log=None,
                              what: str = "") -> dict:
    """{layer: effective-precision result} over ``samples`` (the worst), from the record's
    own activations (see bitdrift.analysis.effective_precision): ``read(sample, layer)`` gives a
    layer's (repeats, ...) values, None where the layer is not recorded. A layer whose
    check fails (a shape it does not model) is ``unchecked`` with the reason, said in a
    line of ``log`` (``what``: model on device): never the device's failure."""
    from bitdrift.analysis.effective_precision import check_layer, merge, unchecked_layer
    from bitdrift.inputs.models import numpy_dtype

    def as_float(values):
        return values.view(numpy_dtype("bfloat16")) if precision == "bfloat16" else values

    images = sample_images.astype(numpy_dtype(precision))
    results, failed = {}, set()
    pairs = [(row, sample, name, spec) for row, sample in enumerate(samples)
             for name, spec in checked.items()]
    for row, sample, name, spec in progress(pairs, "layers checked for effective precision",
                                            file=log):
        outputs = read(sample, name)
        if outputs is None:
            continue
        if spec["inbound"]:
            inputs = read(sample, spec["inbound"])
            if inputs is None:
                results.setdefault(name, []).append({"unchecked": (
                    f"its input {spec['inbound']} is not recorded (analysis.layer_select)")})
                continue
        else:
            inputs = np.repeat(images[row][None], outputs.shape[0], axis=0)
        try:
            if spec["class_name"] == "MatMul":  # its second operand, as recorded
                kernel = read(sample, spec["operand"])
                if kernel is None:
                    results.setdefault(name, []).append({"unchecked": (
                        f"its operand {spec['operand']} is not recorded "
                        "(analysis.layer_select)")})
                    continue
                kernel = as_float(kernel)
            else:
                kernel = weights[f"weights/{name}/0"]
            bias = weights.get(f"weights/{name}/1") if spec["use_bias"] else None
            result = check_layer(spec, as_float(inputs), as_float(outputs), kernel, bias,
                                 precision)
        except Exception as error:  # noqa: BLE001 - one layer's check, not the device
            result = {"unchecked": unchecked_layer(error)}
            if log is not None and name not in failed:
                print(f"bitdrift: {what}: effective precision of {name}: "
                      f"{result['unchecked']}", file=log, flush=True)
            failed.add(name)
        results.setdefault(name, []).append(result)
    return {name: merge(parts) for name, parts in results.items()}
