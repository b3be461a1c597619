"""How far a quantized model lies from its float model (config key models.NAME.quantize):
per device that ran both, per output and per layer whose name the float model's record
holds too, the signal-to-quantization-noise ratio (SQNR, dB) and the largest error, in
units of the tensor's quantization scale where the quantized graph fixes one (static
quantization's QuantizeLinear; dynamic quantization computes it per batch, unknown here),
and the predicted labels (argmax over the last axis) that change."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

COLUMNS = ["model", "float_model", "device", "layer", "quantized_layer", "samples",
           "sqnr_db", "largest_error", "scale", "largest_error_in_scales", "labels",
           "changed_labels"]
QUANTIZE_INPUT = "_QuantizeLinear_Input"  # ONNX Runtime's name of a graph output's producer
# ONNX Runtime's QDQ name of a tensor X after its QuantizeLinear-DequantizeLinear pair: X
# as the quantized model passes it on (X itself may differ in meaning: the quantizer drops
# a Relu after a Conv, whose QuantizeLinear clips at zero, and X is then the Conv's output)
DEQUANTIZED = "_DequantizeLinear_Output"


def sqnr_db(reference, quantized) -> float:
    """10 log10(sum reference^2 / sum (reference - quantized)^2), in float64; inf where the
    two are equal, -inf where the reference is all zeros and they differ."""
    reference = np.asarray(reference, np.float64)
    noise = reference - np.asarray(quantized, np.float64)
    signal, error = float(np.sum(reference ** 2)), float(np.sum(noise ** 2))
    if error == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / error)


def largest_error(reference, quantized) -> float:
    return float(np.max(np.abs(np.asarray(reference, np.float64)
                               - np.asarray(quantized, np.float64)), initial=0.0))


def changed_labels(reference, quantized) -> tuple[int, int]:
    """(labels, how many changed): the argmax over the last axis of each."""
    before, after = np.argmax(reference, axis=-1), np.argmax(quantized, axis=-1)
    return int(before.size), int(np.count_nonzero(before != after))


def tensor_scales(model_path) -> dict[str, float]:
    """{tensor name: its quantization scale} of the tensors a QuantizeLinear of the
    quantized ONNX graph quantizes with a constant scalar scale; the graph's output
    (which ONNX Runtime's QDQ format renames to NAME_QuantizeLinear_Input) under its own
    name. A quantized .tflite's output, and a quantized torch.export program's recorded
    calls (:func:`program_scales`), have their own."""
    from bitdrift import formats

    format = formats.detect(model_path)
    if format == "tflite":
        return _tflite_output_scale(model_path)
    if format == "pt2":
        return program_scales(model_path)
    import onnx
    from onnx import numpy_helper

    from bitdrift.record.hdf5 import OUTPUT

    graph = onnx.load(str(model_path), load_external_data=False).graph
    constants = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    scales = {}
    for node in graph.node:
        if node.op_type != "QuantizeLinear" or len(node.input) < 2:
            continue
        scale = constants.get(node.input[1])
        if scale is not None and scale.size == 1:
            scales[node.input[0].removesuffix(QUANTIZE_INPUT)] = float(scale.reshape(()))
    if len(graph.output) == 1 and graph.output[0].name in scales:  # the final output
        scales[OUTPUT] = scales[graph.output[0].name]
    return scales


def _tflite_output_scale(model_path) -> dict[str, float]:
    """{output: its scale} of a quantized .tflite whose one output a DEQUANTIZE node
    writes from an int8 tensor of one scale (LiteRT's full-integer file with float32
    edges; an int8 output is its own int8 tensor), read from the file; {} otherwise."""
    from bitdrift.formats.tflite import load_interpreter
    from bitdrift.record.hdf5 import OUTPUT

    loaded = load_interpreter(model_path)
    details = {int(detail["index"]): detail for detail in loaded.get_tensor_details()}
    finals = [int(detail["index"]) for detail in loaded.get_output_details()]
    if len(finals) != 1:
        return {}
    feeding = {int(op["outputs"][0]): int(op["inputs"][0])
               for op in loaded._get_ops_details() if op["op_name"] == "DEQUANTIZE"}
    source = feeding.get(finals[0], finals[0])
    scales = details[source]["quantization_parameters"]["scales"]
    return {OUTPUT: float(scales[0])} if len(scales) == 1 and scales[0] > 0 else {}


def program_scales(model_path) -> dict[str, float]:
    """{recorded module call: its output's quantization scale} of a quantized
    torch.export program (PT2E's convert_pt2e): the constant scale of the
    ``quantize_per_tensor`` that quantizes the tensor the call hands on, named as the
    torch devices record it (bitdrift.formats.pt2.module_outputs)."""
    from bitdrift.formats.pt2 import load_program, module_outputs

    graph = load_program(model_path).module().graph
    recorded, _ = module_outputs(graph)
    names: dict[str, str] = {}
    for call in recorded:
        names.setdefault(call.node, call.name)
    scales = {}
    for node in graph.nodes:
        if str(node.target) != "quantized_decomposed.quantize_per_tensor.default":
            continue
        source, scale = node.args[0], node.args[1]
        if isinstance(scale, float) and getattr(source, "name", None) in names:
            scales[names[source.name]] = scale
    return scales


def compare_records(float_record, quantized_record, scales: dict[str, float],
                    float_model: str) -> list[dict]:
    """The rows of one device: its quantized model's record against its float model's,
    per layer both hold by name (the final output as `output`, its scale the graph
    output's: tensor_scales; a QDQ model's X as DequantizeLinear passes it on, where its
    record holds that), over the samples whose values both hold (the first repeat)."""
    from bitdrift.record.hdf5 import OUTPUT

    samples = [sample for sample in quantized_record.value_samples
               if sample in float_record.value_samples]
    if not samples:
        return []
    first = samples[0]
    float_layers = float_record.layer_labels(first)
    held = quantized_record.layer_labels(first)
    rows = []
    for layer in quantized_record.layers(first):
        if layer.label not in float_layers:
            continue
        name = OUTPUT if layer.final else layer.name
        compared = name + DEQUANTIZED if name + DEQUANTIZED in held else name
        reference = np.stack([float_record.tensor(sample, name).values[0]
                              for sample in samples])
        quantized = np.stack([quantized_record.tensor(sample, compared).values[0]
                              for sample in samples])
        if reference.shape != quantized.shape:
            continue  # the same name, another tensor
        scale = scales.get(name)
        largest = largest_error(reference, quantized)
        row = {"model": quantized_record.model, "float_model": float_model,
               "device": quantized_record.device, "layer": name,
               "quantized_layer": compared, "samples": len(samples),
               "sqnr_db": sqnr_db(reference, quantized), "largest_error": largest,
               "scale": scale, "largest_error_in_scales": largest / scale if scale else None,
               "labels": None, "changed_labels": None}
        if layer.final:
            row["labels"], row["changed_labels"] = changed_labels(reference, quantized)
        rows.append(row)
    return rows


def quantization_error_table(pairs) -> list[dict]:
    """The rows of every (float model name, float record path, quantized record path,
    quantized model file) in ``pairs``."""
    from bitdrift.record.reader import Record, read_failure

    rows, scales_of = [], {}  # a quantized model's scales, read once for all its devices
    for float_model, float_path, quantized_path, model_file in pairs:
        if read_failure(float_path) is not None or read_failure(quantized_path) is not None:
            continue  # a device that failed: device_failures.csv says why
        if model_file not in scales_of:
            try:
                scales_of[model_file] = tensor_scales(model_file)
            except Exception as error:  # no scales: the errors in scales stay empty
                print(f"bitdrift: {model_file}: no quantization scales read "
                      f"({type(error).__name__}: {error})"[:300])
                scales_of[model_file] = {}
        scales = scales_of[model_file]
        with Record(float_path) as float_record, Record(quantized_path) as quantized:
            rows += compare_records(float_record, quantized, scales, float_model)
    return rows


def write_quantization_error_table(pairs, out) -> None:
    """quantization_error_table's rows as a CSV (and HTML), written atomically."""
    from bitdrift.atomic import write_csv

    rows = quantization_error_table(pairs)
    write_csv(rows, out, columns=COLUMNS)
    outputs = [row for row in rows if row["changed_labels"] is not None]
    print(f"bitdrift: {len(rows)} tensors of quantized models compared with their float "
          f"models; predicted labels changed: "
          + (", ".join(f"{row['model']} on {row['device']} {row['changed_labels']}/"
                       f"{row['labels']}" for row in outputs) or "none compared")
          + f"; wrote {out}")


# -- the table read back: per quantized model, what its devices show ----------------------
def graph_order(sequences) -> list[str]:
    """One layer order from each device's layers in graph order (devices record different
    layers: an optimized graph fuses a MatMul and its Add, an unoptimized one keeps both):
    the longest sequence, each other layer inserted after the layer it follows in its own
    device's sequence (first: at the start)."""
    sequences = [list(dict.fromkeys(sequence)) for sequence in sequences]
    if not sequences:
        return []
    merged = list(max(sequences, key=len))
    for sequence in sequences:
        for index, layer in enumerate(sequence):
            if layer in merged:
                continue
            before = next((sequence[k] for k in range(index - 1, -1, -1)
                           if sequence[k] in merged), None)
            merged.insert(merged.index(before) + 1 if before is not None else 0, layer)
    return merged


# A device parts from the others where its shortfall grows by more than this: below it,
# devices differ by round-off (another kernel's float epilogue), not in their integers
# (0.1 dB: the noise power 2.3 % apart)
PARTS_DB = 0.1


@dataclass
class ModelSummary:
    """One quantized model's devices against its float model (rows of
    quantization_error.csv): each device's SQNR at the final output, the device furthest
    from the float model (the lowest final SQNR, the first of equals in the table's order)
    and where it parts from the others: the first layer where its shortfall below the best
    other device at the same layer grows the most (``parts_by`` dB), None where it grows
    by PARTS_DB at most (or one device ran); the largest error in scale units over
    devices and layers (None: no fixed scale, as in dynamic quantization) and the labels
    each device changes."""

    model: str
    float_model: str
    devices: list[str]
    layers: list[str]  # graph order (graph_order), the final output last
    output_sqnr: dict[str, float]
    furthest: str
    parts_at: str | None
    parts_by: float
    largest_in_scales: float | None
    largest_in_scales_at: tuple[str, str] | None  # (device, layer)
    labels: dict[str, tuple[int, int]]  # device: (labels, changed)
    samples: int
    per_layer: bool  # layers besides the final output were compared

    first_layers: dict[str, str] = field(default_factory=dict)  # device: its first layer

    def first_layer(self, device: str) -> str | None:
        return self.first_layers.get(device)

    @property
    def sqnr_range(self) -> tuple[float, float]:
        return min(self.output_sqnr.values()), max(self.output_sqnr.values())


def _shortfall(sqnr: pd.DataFrame, device: str) -> pd.Series:
    """Per layer (graph order), how many dB ``device``'s SQNR falls below the best other
    device's at that layer (0 where it is the best; NaN where one of them lacks the
    layer). Equal tensors (SQNR inf) count as equal."""
    others = sqnr.drop(columns=device)
    if others.empty:
        return pd.Series(np.nan, index=sqnr.index)
    best, own = others.max(axis=1), sqnr[device]
    both_inf = np.isinf(best) & np.isinf(own)
    return (best - own).where(~both_inf, 0.0).clip(lower=0.0)


def summarize(table: pd.DataFrame) -> list[ModelSummary]:
    """quantization_error.csv's rows (a DataFrame) read back, per quantized model in the
    table's order."""
    from bitdrift.record.hdf5 import OUTPUT

    summaries = []
    for model, part in table.groupby("model", sort=False):
        devices = list(dict.fromkeys(part["device"]))
        layers = graph_order(part.loc[part["device"] == device, "layer"].astype(str)
                             for device in devices)
        if OUTPUT in layers:  # the final output last, whatever the records' order
            layers = [layer for layer in layers if layer != OUTPUT] + [OUTPUT]
        sqnr = part.pivot_table(index="layer", columns="device", values="sqnr_db",
                                aggfunc="first").reindex(index=layers, columns=devices)
        final = sqnr.loc[OUTPUT] if OUTPUT in sqnr.index else sqnr.ffill().iloc[-1]
        output_sqnr = {device: float(final[device]) for device in devices
                       if not pd.isna(final[device])}
        if not output_sqnr:
            continue  # no device's output compared (its shape differs): rows only
        furthest = min(output_sqnr, key=output_sqnr.get) if output_sqnr else devices[0]
        shortfall = _shortfall(sqnr, furthest).dropna()
        growth = shortfall.diff().fillna(shortfall)  # before the first layer: none
        parts_at, parts_by = None, 0.0
        if len(growth) and growth.max() > PARTS_DB:
            parts_at, parts_by = str(growth.idxmax()), float(growth.max())
        in_scales = pd.to_numeric(part["largest_error_in_scales"], errors="coerce")
        largest, at = None, None
        if in_scales.notna().any():
            row = part.loc[in_scales.idxmax()]
            largest, at = float(in_scales.max()), (str(row["device"]), str(row["layer"]))
        outputs = part[pd.to_numeric(part["changed_labels"], errors="coerce").notna()]
        labels = {str(row["device"]): (int(row["labels"]), int(row["changed_labels"]))
                  for _, row in outputs.iterrows()}
        summaries.append(ModelSummary(
            model=str(model), float_model=str(part["float_model"].iloc[0]),
            devices=devices, layers=layers, output_sqnr=output_sqnr, furthest=furthest,
            parts_at=parts_at, parts_by=parts_by, largest_in_scales=largest,
            largest_in_scales_at=at, labels=labels, samples=int(part["samples"].max()),
            per_layer=any(layer != OUTPUT for layer in layers),
            first_layers={device: next((layer for layer in layers
                                        if not pd.isna(sqnr.at[layer, device])), None)
                          for device in devices}))
    return summaries
