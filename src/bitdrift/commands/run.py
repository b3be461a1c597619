"""The commands that make the data: a dataset, a trained model, a device's record, the
exports. Each imports its framework only when it runs."""

from __future__ import annotations

import sys

from bitdrift import paths
from bitdrift.commands.common import (
    model_spec,
    read_config,
    refuse_overwriting,
)
from bitdrift.errors import ConfigError


def cmd_prepare_dataset(args) -> None:
    from bitdrift.inputs.datasets import prepare_dataset

    config = read_config(args.config)
    prepare_dataset(args.dataset, config["datasets"][args.dataset],
                    args.out or paths.dataset_file(args.dataset))


def cmd_train(args) -> None:
    from bitdrift.run.training import train_model

    config = read_config(args.config)
    spec = model_spec(config, args.model)
    if "architecture" not in spec:
        raise ConfigError(f"model {args.model!r} is a file used as is; nothing to train")
    dataset = args.dataset_file or paths.dataset_file(spec["dataset"])
    outputs = {"--out-model": args.out_model or paths.trained_model_file(args.model, args.seed),
               "--out-history": args.out_history or paths.training_history_file(args.model,
                                                                               args.seed),
               "--out-logits": args.out_logits or paths.test_logits_file(args.model,
                                                                         args.seed)}
    refuse_overwriting({"--config": args.config, "--dataset-file": dataset}, outputs)
    train_model(spec=spec, seed=args.seed, dataset_path=dataset,
                out_model=outputs["--out-model"], out_history=outputs["--out-history"],
                out_logits=outputs["--out-logits"], threads=args.threads, log=sys.stderr)


def cmd_infer(args) -> None:
    from pathlib import Path

    from bitdrift.backends.keras.export import inference_inputs
    from bitdrift.config import replay_settings
    from bitdrift.run.inference import infer

    config = read_config(args.config)
    model_spec(config, args.model)  # refuses an unknown model
    if args.device not in config["devices"]:
        raise ConfigError(f"unknown device {args.device!r} "
                          f"(config has {sorted(config['devices'])})")
    model_path = args.model_file or paths.model_file(config, args.model)
    dataset_path = args.dataset_file or paths.model_inputs_file(config, args.model)
    out = args.out or paths.record_file(args.model, args.device)
    refuse_overwriting({"--config": args.config, "--model-file": model_path,
                        "--dataset-file": dataset_path}, {"--out": out})
    device = config["devices"][args.device]
    from bitdrift import formats

    # a model of another format than Keras runs as it is: no export, no reference
    inputs = inference_inputs(args.model, device["backend"]) \
        if formats.planned_format(model_path) == "keras" else {}
    reference = args.reference or inputs.get("reference")
    export = args.export or inputs.get("export")
    deployed = args.deployed_export or inputs.get("deployed_export")
    if deployed and not args.deployed_export and not Path(deployed).is_file():
        # an export made before the observer check: the run is complete without it
        print(f"bitdrift: {deployed} does not exist: no observer check (`bitdrift export` "
              "makes it)", file=sys.stderr)
        deployed = None
    unchecked = None
    if reference and not args.reference and "export" not in inputs and Path(reference).is_file():
        from bitdrift.backends.exported.expected import read_reference
        from bitdrift.inputs.models import model_digest

        if read_reference(reference).model_sha256 != model_digest(model_path):
            # The workflow's reference is of the workflow's model; --model-file ran another.
            unchecked, reference = f"{reference} is of another model", None
    for option, path in (("--reference", reference), ("--export", export),
                         ("--deployed-export", deployed)):
        if path and not Path(path).is_file():
            if option == "--reference" and not args.reference and "export" not in inputs:
                # A Keras runtime without TensorFlow's reference: its run is complete, only
                # the argmax check is left out (and the record says unchecked).
                unchecked, reference = f"{path} does not exist", None
                continue
            raise ConfigError(f"{option} {path}: file does not exist (backend "
                              f"{device['backend']!r} needs it; make it with `bitdrift export "
                              f"--config {args.config} --model {args.model}`)")
    infer(model_name=args.model, device_name=args.device, device=device,
          model_path=model_path, dataset_path=dataset_path, samples=config["samples"],
          out=out, layers=config["analysis"]["layers"], reference=reference, export=export,
          kernels=config["analysis"]["kernels"], deployed_export=deployed,
          replay=replay_settings(config),
          full_samples=config["analysis"].get("full_samples"),
          layer_select=config["analysis"].get("layer_select"),
          traced_samples=config["analysis"]["traced_samples"])
    if unchecked:
        print(f"bitdrift: wrote {out} without the argmax check against TensorFlow ({unchecked}; "
              "`bitdrift export` makes one)", file=sys.stderr)


def cmd_export(args) -> None:
    from bitdrift.backends.exported.expected import FORMATS
    from bitdrift.backends.keras.export import export_model, write_reference

    config = read_config(args.config)
    spec = model_spec(config, args.model)
    model_path = args.model_file or paths.model_file(config, args.model)
    dataset_path = args.dataset_file or paths.dataset_file(spec["dataset"])
    reference = paths.export_reference_file(args.model)
    write_reference(model_path, dataset_path, reference)
    written = [reference]
    for name in FORMATS:
        export_model(model_path, name, paths.export_file(args.model, name),
                     paths.deployed_export_file(args.model, name))
        written += [paths.export_file(args.model, name),
                    paths.deployed_export_file(args.model, name)]
    print(f"bitdrift: wrote {', '.join(written)}")


def _on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise ValueError(text)  # argparse: "invalid _on_off value"
    return text == "on"


def _quantizer_settings():
    """(tool, setting, its values, its default, help) of every quantizer's settings that
    an option can take (bitdrift.runtimes.QUANTIZERS; a mapping is the config's alone)."""
    from bitdrift.backends import quantizers
    from bitdrift.runtimes import QUANTIZERS

    for tool in QUANTIZERS:
        module = quantizers.module(tool)
        for key, (values, default) in module.SETTINGS.items():
            if key in module.HELP:
                yield tool, key, values, default, module.HELP[key]


def cmd_quantize(args) -> None:
    from bitdrift.backends.quantizers import quantize_model

    # the options given, of whichever tool: a tool refuses another's by its option
    given = {key: getattr(args, key) for _, key, _, _, _ in _quantizer_settings()
             if getattr(args, key, None) is not None}
    used = quantize_model(args.model_file, args.out, {"tool": args.tool, **given},
                          args.inputs, named=lambda key: "--" + key.replace("_", "-"))
    print(f"bitdrift: wrote {args.out} ({used.pop('tool')}'s quantizer: "
          f"{', '.join(f'{key} {value}' for key, value in used.items())})")


def add_commands(sub) -> None:
    """Register these commands on the `bitdrift` subparsers."""
    p = sub.add_parser("prepare-dataset", help="load a dataset source into HDF5")
    p.add_argument("--config", required=True, help="config file (config.yaml or a preset)")
    p.add_argument("--dataset", required=True, help="a key of datasets")
    p.add_argument("--out", help="dataset HDF5 (default results/datasets/DATASET.h5)")
    p.set_defaults(func=cmd_prepare_dataset, writes_data=True)

    p = sub.add_parser("train", help="train one model with one seed")
    p.add_argument("--config", required=True, help="config file (config.yaml or a preset)")
    p.add_argument("--model", required=True, help="a key of models with an architecture")
    p.add_argument("--seed", type=int, required=True, help="seed of every source of randomness")
    p.add_argument("--threads", type=int, help="framework threads (default: its own)")
    p.add_argument("--dataset-file", help="dataset HDF5 (default: the workflow's)")
    p.add_argument("--out-model", help="default results/models/MODEL/seed_SEED/model.keras")
    p.add_argument("--out-history", help="default results/models/MODEL/seed_SEED/history.csv")
    p.add_argument("--out-logits",
                   help="default results/models/MODEL/seed_SEED/test_logits.h5")
    p.set_defaults(func=cmd_train, writes_data=True)

    p = sub.add_parser("infer", help="run one device: all repeats, every layer, one record")
    p.add_argument("--config", required=True, help="config file (config.yaml or a preset)")
    p.add_argument("--model", required=True, help="a key of models")
    p.add_argument("--device", required=True, help="a key of devices")
    p.add_argument("--out", help="record path (default results/inference/MODEL/DEVICE.h5)")
    p.add_argument("--model-file", help="model to run (default: the workflow's trained model)")
    p.add_argument("--dataset-file", help="dataset HDF5 (default: the workflow's)")
    p.add_argument("--reference", help="TensorFlow's reference of the model (default: the "
                   "workflow's results/exports/MODEL/reference.npz)")
    p.add_argument("--export", help="the exported model an exported runtime runs (default: "
                   "the workflow's results/exports/MODEL/model.onnx or .tflite)")
    p.add_argument("--deployed-export", help="the model exported with its final output "
                   "alone, for the observer check (default: the workflow's "
                   "results/exports/MODEL/deployed.onnx or .tflite)")
    p.set_defaults(func=cmd_infer, writes_data=True)

    p = sub.add_parser("export", help="export a model for the exported runtimes (ONNX, "
                       "LiteRT) and write TensorFlow's reference, at the workflow's paths")
    p.add_argument("--config", required=True, help="config file (config.yaml or a preset)")
    p.add_argument("--model", required=True, help="a key of models")
    p.add_argument("--model-file", help="model to export (default: the workflow's trained model)")
    p.add_argument("--dataset-file", help="dataset HDF5 (default: the workflow's)")
    p.set_defaults(func=cmd_export, writes_data=True)

    from bitdrift.runtimes import DEFAULT_QUANTIZER, QUANTIZERS

    p = sub.add_parser("quantize", help="quantize a model with a runtime's own quantizer "
                       "(dynamic, or static calibrated on the model's inputs)")
    p.add_argument("--tool", choices=list(QUANTIZERS), default=DEFAULT_QUANTIZER,
                   help=f"whose quantizer (default {DEFAULT_QUANTIZER}); each option below "
                   "names its tool")
    p.add_argument("--model-file", required=True, help="the float model")
    p.add_argument("--out", required=True, help="the quantized model to write")
    p.add_argument("--inputs", help="the model's inputs (.npy, or .npz of one array per "
                   "input): static quantization calibrates on them")
    settings = list(_quantizer_settings())
    seen = set()
    for tool, key, values, default, text in settings:
        if key in seen:  # a setting two tools share: one option, its help the first's
            continue
        seen.add(key)
        others = [other for other, same, *_ in settings if same == key and other != tool]
        option, help = "--" + key.replace("_", "-"), f"--tool {tool}: {text}" + (
            f" (also --tool {', '.join(others)})" if others else "")
        if values is int:
            p.add_argument(option, type=int, help=f"{help} (default {default})")
        elif set(values) == {False, True}:
            p.add_argument(option, type=_on_off, metavar="{on,off}",
                           help=f"{help} (default {'on' if default else 'off'})")
        else:
            p.add_argument(option, choices=[value for value in values if value is not None],
                           help=help + (f" (default {default})" if default else ""))
    p.set_defaults(func=cmd_quantize, writes_data=True)
