"""The summation order of a device's Dense and Conv2D layers, revealed in the first repeat
through the device's own runtime (bitdrift.analysis.accumulation's search, FPRev's method),
for the record's ``accumulation_orders`` (checked by bitdrift.record.orders)."""

from __future__ import annotations

import json

from bitdrift.progress import progress


def reveal_orders(session, device: dict, positions: int | None = None, *,
                  reuse: bool = True, log=None, what: str = "") -> dict:
    """{layer: {"trees", ...} or {"error"}}: the order each Dense and Conv2D layer sums in,
    revealed through this runtime at the layer's shapes and the device's batch size
    (bitdrift.analysis.accumulation): at every batch row and, for a Conv2D, every output pixel
    (a Dense layer over (batch, ..., terms): every leading position, dense_grid) of
    a grid of at most ``positions`` (analysis.replay_positions; None: its default), else
    at the replay's sample of that many; in every format a device runs (float16 and
    bfloat16 with the probe values they hold).

    A layer whose probe is the same program as an earlier layer's (probe_key: its spec,
    the batch, the precision, the positions) takes that layer's entry with
    ``searched_at`` naming it, instead of a search of its own: the probe replaces the
    weights and runs on ones, so its calls, and thus what the search finds, are the
    same (``reuse=False`` searches every layer). ``log``: a line per layer, ``what``
    (model on device) first. A layer whose search fails, whatever the error (the probe's
    node refused by the runtime), is that layer's ``error``: never the device's."""
    import time

    from bitdrift.analysis.accumulation.names import order_name
    from bitdrift.analysis.accumulation.probes import PROBE_VALUES, conv_grid, dense_grid
    from bitdrift.analysis.accumulation.replay import REPLAY_POSITIONS, conv_border
    from bitdrift.analysis.accumulation.reveal import reveal_places
    from bitdrift.analysis.accumulation.trees import OrderError, from_flat

    orders, searched = {}, {}  # searched: {probe key: the layer searched with it}
    computes = session.accelerator.get("inference_precision") or device["precision"]
    count = len(session.order_layers)
    for number, (layer, spec) in enumerate(progress(list(session.order_layers.items()),
                                                    "orders searched", file=log), start=1):
        started = time.perf_counter()
        key = probe_key(spec, device["batch_size"], device["precision"], computes,
                        positions or REPLAY_POSITIONS)
        terms, units, use_bias = spec["terms"], spec["units"], spec["use_bias"]
        if reuse and key in searched:
            first = searched[key]
            orders[layer] = {**orders[first], "searched_at": first}
            said = f"the same probe as {first}, reused"
        elif device["precision"] not in PROBE_VALUES:
            orders[layer] = {"error": f"{device['precision']}: no probe for this format"}
        elif computes in ("bfloat16", "float16") and computes != device["precision"]:
            # OpenVINO's bfloat16 default: ones are not exact there, nothing swamps alike
            orders[layer] = {"error": f"the runtime computes in {computes}"}
        else:
            try:
                grid, live = conv_grid(spec) if spec["class_name"] == "Conv2D" \
                    else (dense_grid(spec), None)
                found = reveal_places(session.order_probe(spec, device["batch_size"]),
                                      terms, units, device["precision"], use_bias,
                                      device["batch_size"], grid, live,
                                      positions=positions or REPLAY_POSITIONS,
                                      border=conv_border(spec["config"], spec["kernel_shape"]))
                orders[layer] = found.entry(terms + (1 if use_bias else 0), use_bias)
            except OrderError as error:
                orders[layer] = {"error": str(error)}
            except Exception as error:  # noqa: BLE001 - one layer's probe, not the device
                # the probe of one layer failing in the runtime (a node it will not run
                # alone, a shape it refuses) leaves that layer unrevealed, said why; the
                # device's inference ran and its record is written
                said = (str(error).strip().splitlines() or [""])[0][:300]
                orders[layer] = {"error": f"the probe failed: {type(error).__name__}: {said}"}
            searched[key] = layer
        if "searched_at" not in orders[layer]:
            entry = orders[layer]
            said = (f"not revealed ({entry['error']})" if "error" in entry else order_name(
                [from_flat(tree, entry["terms"]) for tree in entry["trees"]],
                entry["places"], use_bias)) + f", {time.perf_counter() - started:.1f} s"
        if log is not None:
            print(f"bitdrift: {what}: order of {layer} ({number}/{count}): {said}", file=log,
                  flush=True)
    return orders


def probe_key(spec: dict, batch: int, precision: str, computes: str, positions: int) -> str:
    """What an order probe's calls depend on, as text: the layer's probe spec (its shapes
    and settings; an ONNX file's node by name, whose probe is that node cut from the
    file), the batch, the device's precision and the runtime's, and the positions
    searched; two layers of one key get bit-identical probe calls."""
    return json.dumps({"spec": spec, "batch": batch, "precision": precision,
                       "computes": computes, "positions": positions}, sort_keys=True)
