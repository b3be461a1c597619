"""The workflow's plan, from a validated config: which models run on which devices, what a
run of `all` makes, the checks made before any job, and the jobs' resources.

The Snakefile's helpers (``rules/common.smk``) keep what needs Snakemake's own objects
(wildcards, the profile's defaults, ``workflow``) and call in here with plain values, so
the planning is tested without Snakemake (tests/unit/test_plan.py). It sits at the top
with the config: the studies' registry adds the models of the studies.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from bitdrift import formats, paths
from bitdrift.errors import PlanError
from bitdrift.runtimes import QUANTIZERS

# Resources whose values are names; every other resource is a number.
TEXT_RESOURCES = frozenset({"slurm_partition", "slurm_account", "constraint", "gres",
                            "gpu_model", "qos"})


def workflow_path(path) -> str:
    """A file bitdrift ships (the reference set, the atlas), as the workflow names it:
    relative to the working directory where it lies inside it (a run in a checkout), so
    that a checkout moved or copied whole with its results names its jobs' inputs and
    parameters as before and reruns nothing (Snakemake reruns a job whose input files or
    parameters are named otherwise); else absolute (an installed bitdrift stays where it
    is when the working directory moves)."""
    found = os.path.realpath(path)
    here = os.path.realpath(os.getcwd())
    if os.path.commonpath([found, here]) == here:
        return os.path.relpath(found, here)
    return found


class Plan:
    """The plan of a run of the workflow on ``config`` (validated: bitdrift.config).

    ``models`` are the config's own models, the ones the core's tables are made of;
    ``all_models`` adds those of the studies (:meth:`add_study_models`) and the atlas's
    reference model (:meth:`add_atlas_model`), which the core's rules also make and run.
    """

    def __init__(self, config: dict):
        self.config = config
        self.models = list(config["models"])
        self.devices = list(config["devices"])
        # External devices are measured elsewhere (`bitdrift infer`): never scheduled
        self.scheduled_devices = [device for device in self.devices
                                  if not config["devices"][device]["external"]]
        self.trained_models = [model for model in self.models
                               if "architecture" in config["models"][model]]
        # Each bring-your-own model's format (bitdrift.formats); every other is Keras
        self.model_formats = {model: formats.planned_format(paths.model_file(config, model))
                              for model in self.models if "file" in config["models"][model]
                              or "quantize" in config["models"][model]}
        # Each model made by quantization (config key models.NAME.quantize): its settings
        self.quantized_models = {model: config["models"][model]["quantize"]
                                 for model in self.models
                                 if "quantize" in config["models"][model]}
        self.study_models: dict[str, dict] = {}
        self.all_models = list(self.models)
        self.atlas_devices = list(config["atlas"]["devices"])
        # the reference model quantized (atlas.quantize) on these devices: atlas entries'
        # quantized devices, kept out of the core's quantization tables
        self.atlas_quantized_devices = list(config["atlas"].get("quantized_devices", []))
        self.atlas_quantized: dict[str, dict] = {}

    # -- which device runs which model --------------------------------------------------
    def model_format(self, model: str) -> str:
        return self.model_formats.get(model, "keras")

    def runs_on(self, model: str, device: str) -> bool:
        """Whether the device runs the model: one the model's `devices` (if it lists any)
        names, whose runtime runs the model's format (a Keras model: every one); a model
        the workflow quantized, one of its quantizer's runtimes."""
        return self.chosen(model, device) and self.runtime_runs(model, device)

    def runtime_runs(self, model: str, device: str) -> bool:
        return self.config["devices"][device]["backend"] in self.model_runtimes(model)

    def chosen(self, model: str, device: str) -> bool:
        """Whether config key models.MODEL.devices (a quantized model without one: its
        float model's) leaves the device in (no such key: every device)."""
        spec = self.config["models"].get(model, {})
        if "devices" not in spec and "quantize" in spec:
            spec = self.config["models"].get(spec["quantize"]["model"], {})
        return device in spec.get("devices", [device])

    def model_runtimes(self, model: str) -> tuple[str, ...]:
        quantized = self.quantizations().get(model)
        if quantized is not None:
            return QUANTIZERS[quantized["tool"]][2]
        return formats.runtimes(self.model_format(model))

    def model_devices(self, model: str) -> list[str]:
        """The devices that run the model (external ones too), in config order."""
        return [device for device in self.devices if self.runs_on(model, device)]

    def skipped_devices(self, model: str) -> dict[str, list[str]]:
        """{runtime: its devices} of the devices left out of the model's run for their
        runtime cannot run the model's format (bitdrift.runtimes.FORMAT_RUNTIMES); not
        those its `devices` list leaves out, by the user's choice."""
        skipped: dict[str, list[str]] = {}
        for device in self.devices:
            if self.chosen(model, device) and not self.runtime_runs(model, device):
                skipped.setdefault(self.config["devices"][device]["backend"], []).append(device)
        return skipped

    def device_plan(self) -> dict[str, dict]:
        """{model: {devices, skipped, format}} of each of the config's models with a device
        left out (:meth:`skipped_devices`) or fewer than two devices; ``format`` says what
        the model's file is. What the terminal (:meth:`device_notes`) and the findings
        (bitdrift.report.findings.checks.planned_devices) say; empty where every device
        runs every model."""
        planned = {}
        for model in self.models:
            devices, skipped = self.model_devices(model), self.skipped_devices(model)
            if skipped or len(devices) < 2:
                what = formats.get(self.model_format(model)).WHAT
                if model in self.quantized_models:
                    what = (f"{what} quantized by the "
                            f"{self.quantized_models[model]['tool']} quantizer")
                planned[model] = {"devices": devices, "skipped": skipped, "format": what}
        return planned

    def device_notes(self) -> list[str]:
        """The lines the run starts with, one per model with devices left out and one per
        model that one device runs (:meth:`device_plan`)."""
        from bitdrift.report.findings.checks import lone_device, skipped_devices

        notes = []
        for model, entry in self.device_plan().items():
            if entry["skipped"]:
                notes.append(skipped_devices(model, entry["format"], entry["skipped"]))
            if len(entry["devices"]) == 1:
                notes.append(lone_device(model, entry["devices"]))
        return notes

    def record_files(self) -> list[str]:
        """Every record of the config's models, devices in config order (this order numbers
        the classes); a model has records of the devices whose runtime runs its format."""
        return [paths.record_file(model, device) for model in self.models
                for device in self.devices if self.runs_on(model, device)]

    def scheduled_record_files(self) -> list[str]:
        """Every record a device job of this workflow may write (the studies' models and
        the atlas's too): where the end of a run looks for failure records."""
        return [paths.record_file(model, device) for model in self.all_models
                for device in self.scheduled_devices if self.runs_on(model, device)]

    @staticmethod
    def export_formats() -> list[str]:
        """The formats a Keras model is exported to, for the runtimes that read them."""
        from bitdrift.backends.exported import expected

        return list(expected.FORMATS)

    # -- provenance: every record checked against the workflow's own files --------------
    def provenance(self) -> list[tuple[str, str, str]]:
        """(model, model file, inputs file) per model: every record, external ones included,
        is checked against the files the workflow itself uses (`bitdrift eqc --expect`)."""
        return [(model, paths.model_file(self.config, model),
                 paths.model_inputs_file(self.config, model)) for model in self.models]

    def provenance_files(self) -> list[str]:
        return [file for _, *files in self.provenance() for file in files]

    def expect_arguments(self) -> list[str]:
        """The `--expect MODEL MODEL_FILE INPUTS_FILE` options of every model."""
        return [argument for triple in self.provenance()
                for argument in ("--expect", *triple)]

    # -- checks before any job ------------------------------------------------------------
    def check_external_records(self, exists: Callable[[str], bool] = os.path.exists) -> None:
        """An external device's record comes from elsewhere; if it has not arrived, say so
        now (Snakemake would keep the existing analyses as current and report nothing)."""
        from bitdrift.run.provenance import infer_command

        missing = [(device, model, paths.record_file(model, device))
                   for model in self.models for device in self.devices
                   if self.config["devices"][device]["external"]
                   and self.runs_on(model, device)
                   and not exists(paths.record_file(model, device))]
        if missing:
            raise PlanError(
                "missing records of external devices (measured elsewhere, never scheduled):\n"
                + "\n".join(
                    f"  device {device!r}, model {model!r}: {path}; make it with\n    "
                    + infer_command(model, device, paths.model_file(self.config, model),
                                    paths.model_inputs_file(self.config, model), path)
                    for device, model, path in missing))

    def check_external_samples(self, exists: Callable[[str], bool] = os.path.exists) -> None:
        """An external device's record that ran other samples than config key samples, or
        them in another order (a record's input digest is of its samples in the order it ran
        them: bitdrift.run.provenance), would be refused by every analysis once the other
        devices have run: said now, naming the key, the record and the command that makes
        it anew. A record that cannot be read is said now too."""
        from bitdrift.errors import BitdriftError
        from bitdrift.record.reader import Record
        from bitdrift.run.provenance import infer_command
        from bitdrift.run.repro import run_order

        samples = [int(sample) for sample in self.config["samples"]]
        for model in self.models:
            inputs = paths.model_inputs_file(self.config, model)
            for device in self.devices:
                path = paths.record_file(model, device)
                if not (self.config["devices"][device]["external"]
                        and self.runs_on(model, device) and exists(path)):
                    continue
                try:
                    with Record(path) as record:
                        ran = run_order(record, inputs if exists(inputs) else None)
                except BitdriftError as error:
                    raise PlanError(f"external device {device!r}: {error}") from None
                if ran != samples:
                    again = infer_command(model, device, paths.model_file(self.config, model),
                                          inputs, path)
                    reordered = sorted(ran) == sorted(samples)
                    raise PlanError(
                        f"config key samples: {samples}, but external device {device!r}'s "
                        f"record {path} ran {ran} ("
                        + ("the same samples in another order" if reordered else
                           "other samples")
                        + "), which every analysis would refuse: "
                        + ("list the samples in its order, or " if reordered else "")
                        + f"measure it again with `{again}`")

    def rule_made_files(self) -> set[str]:
        """The model and inputs files a rule of the workflow makes (as normalized paths):
        each trained model's (rule train_model) and bitdrift's example models with their
        inputs (rule example_model, bitdrift.inputs.examples)."""
        import importlib

        from bitdrift.inputs.examples import EXAMPLES

        made = set(self.training_targets())
        made |= {paths.model_file(self.config, model) for model in self.quantized_models}
        for example in EXAMPLES:
            suffix = importlib.import_module(f"bitdrift.inputs.examples.{example}").SUFFIX
            made |= {paths.example_model_file(example, suffix.lstrip(".")),
                     paths.example_inputs_file(example, suffix.lstrip("."))}
        return {os.path.normpath(path) for path in made}

    def check_model_files(self, exists: Callable[[str], bool] = os.path.isfile) -> None:
        """A model's `file` or `inputs` that is not there and that no rule makes is a typo:
        said now, naming the key, whatever records an earlier run left (Snakemake would
        otherwise keep them as current, or stop on a missing input of some analysis)."""
        made = self.rule_made_files()
        for model in self.models:
            for key in ("file", "inputs"):
                path = self.config["models"][model].get(key)
                if path is None or exists(path) or os.path.normpath(path) in made:
                    continue
                where = "" if os.path.isabs(path) else f" (in {os.getcwd()})"
                raise PlanError(f"config key models.{model}.{key}: {path} does not exist"
                                f"{where}, and no rule of the workflow makes it")

    def check_every_model_runs(self) -> None:
        """A model that no device runs (no device's runtime runs its format) has no record
        to compare: said now, naming the model and the runtimes that could."""
        for model in self.models:
            if not self.model_devices(model):
                format = self.model_format(model)
                raise PlanError(
                    f"config key models.{model}: no device runs it: "
                    f"{', '.join(self.skipped_devices(model))} cannot run "
                    f"{formats.get(format).WHAT} (runtimes that can: "
                    f"{', '.join(formats.runtimes(format))})")

    def check_samples(self, exists: Callable[[str], bool] = os.path.exists) -> None:
        """Sample indices against every prepared dataset the devices read, before any job
        (a dataset not prepared yet is checked by its own job)."""
        from bitdrift.inputs.datasets import check_samples

        for dataset in {self.config["models"][model]["dataset"] for model in self.models
                        if "dataset" in self.config["models"][model]}:
            if exists(paths.dataset_file(dataset)):
                check_samples(paths.dataset_file(dataset), self.config["samples"])

    # -- the models the core's rules make beyond the config's own ---------------------------
    def add_study_models(self) -> dict[str, dict]:
        """Join the models a study adds (the ablation's variants, the batching study's own)
        to config["models"] after the config's own are taken: the core's train, export and
        inference rules make them, and the core's tables stay the config's own models."""
        from bitdrift.studies import study_models

        self.study_models = study_models(self.config)
        self.config["models"].update(self.study_models)
        self.all_models += list(self.study_models)
        return self.study_models

    def add_atlas_model(self) -> None:
        """The atlas: the reference model (bitdrift.inputs.reference_set: committed, never
        trained) runs on the devices of config key atlas.devices as one more model of the
        core's inference rule, and its records place this machine among the machines
        measured (bitdrift.atlas.entries). Each file is checked against the reference set's
        digests; a mismatch is a PlanError naming the config key."""
        from bitdrift.errors import BitdriftError
        from bitdrift.inputs import reference_set

        if not self.atlas_devices and not self.atlas_quantized_devices:
            return
        try:
            self.config["models"][paths.ATLAS_MODEL] = {
                "file": workflow_path(reference_set.model_file()),
                "inputs": workflow_path(reference_set.inputs_file())}
        except BitdriftError as error:
            raise PlanError(f"config key atlas.devices: {error}") from None
        self.all_models.append(paths.ATLAS_MODEL)
        if self.atlas_quantized_devices:
            # the quantized reference model: made by rule quantize_model like the config's
            # own quantized models (bitdrift.config.check_atlas_quantization checked it)
            settings = {"model": paths.ATLAS_MODEL, **self.config["atlas"]["quantize"]}
            self.config["models"][paths.ATLAS_QUANTIZED_MODEL] = {"quantize": settings}
            self.atlas_quantized = {paths.ATLAS_QUANTIZED_MODEL: settings}
            self.model_formats[paths.ATLAS_QUANTIZED_MODEL] = formats.planned_format(
                paths.model_file(self.config, paths.ATLAS_QUANTIZED_MODEL))
            self.all_models.append(paths.ATLAS_QUANTIZED_MODEL)

    def quantizations(self) -> dict[str, dict]:
        """{model: its quantize settings} of every model the workflow quantizes: the
        config's own and the atlas's quantized reference model."""
        return {**self.quantized_models, **self.atlas_quantized}

    def atlas_folder(self) -> str:
        """The atlas's entries: config key atlas.folder, else the one shipped with bitdrift."""
        from bitdrift.atlas import entries

        return self.config["atlas"].get("folder") or workflow_path(entries.default_folder())

    # -- what a run of `all` makes ----------------------------------------------------------
    def training_targets(self) -> list[str]:
        return [paths.trained_model_file(model, seed) for model in self.trained_models
                for seed in self.config["models"][model]["train"]["seeds"]]

    def core_targets(self) -> list[str]:
        """The scheduled records, the core's tables and figures (paths.CORE_RESULTS) and
        the findings; the atlas's records, table and figure where atlas.devices names
        devices; the CPU generations figure where some device runs on an emulated CPU."""
        # The records are targets themselves: Snakemake treats a deleted intermediate file
        # whose downstream tables exist as up to date, so a record lost to an interrupted
        # --forcerun would otherwise never be made again (and the tables never redone).
        scheduled_records = [paths.record_file(model, device) for model in self.models
                             for device in self.scheduled_devices
                             if self.runs_on(model, device)]
        targets = (scheduled_records
                   + [paths.result_file(kind, name) for kind, name in paths.CORE_RESULTS]
                   + [paths.findings_file("md")])
        if self.atlas_devices or self.atlas_quantized_devices:
            # this machine among the machines measured: the reference model's records
            targets += self.atlas_record_files()
            targets += [paths.table_file(paths.ATLAS_TABLES[0]),
                        paths.figure_file(paths.ATLAS_FIGURE)]
        if self.quantized_models:
            targets += [paths.table_file(paths.QUANTIZATION_ERROR_TABLE),
                        paths.figure_file(paths.QUANTIZATION_ERROR_FIGURE),
                        paths.table_file(paths.QUANTIZED_PARTING_TABLE)]
        if any(self.config["devices"][device].get("emulate")
               for device in self.scheduled_devices):
            targets.append(paths.figure_file(paths.CPU_GENERATIONS_FIGURE))
        return targets

    def quantization(self, model: str) -> dict | None:
        """What a record of ``model`` says of its quantization (in its fingerprint): the
        float model's name and file and ONNX Runtime's settings; None for a model the
        workflow did not quantize."""
        settings = self.quantizations().get(model)
        if settings is None:
            return None
        return {**settings, "model_file": paths.model_file(self.config, settings["model"])}

    def quantization_error_pairs(self) -> list[tuple[str, str, str, str]]:
        """(float model, its record, the quantized model's record, the quantized model's
        file) per quantized model and device that runs both, in config order: what the
        table quantization_error compares (bitdrift.analysis.quantization_error)."""
        return [(settings["model"], paths.record_file(settings["model"], device),
                 paths.record_file(model, device), paths.model_file(self.config, model))
                for model, settings in self.quantized_models.items()
                for device in self.devices
                if self.runs_on(model, device) and self.runs_on(settings["model"], device)]

    def quantized_parting_models(self) -> list[tuple[str, str, list[str]]]:
        """(quantized model, its file, its records on every device that runs it) per
        quantized model, in config order: what the table quantized_parting compares pair
        by pair (bitdrift.analysis.quantized_parting)."""
        return [(model, paths.model_file(self.config, model),
                 [paths.record_file(model, device) for device in self.devices
                  if self.runs_on(model, device)])
                for model in self.quantized_models]

    def atlas_record_files(self) -> list[str]:
        """The reference model's records, then the quantized reference model's."""
        return [paths.atlas_record_file(device) for device in self.atlas_devices] + \
            [paths.atlas_quantized_record_file(device)
             for device in self.atlas_quantized_devices]

    def findings_quantization_tables(self) -> dict[str, str]:
        """The quantized models' tables the findings quote (against their float models,
        where their devices part), where the config quantizes a model."""
        return {name: paths.table_file(name) for name in
                (paths.QUANTIZATION_ERROR_TABLE, paths.QUANTIZED_PARTING_TABLE)} \
            if self.quantized_models else {}

    def findings_atlas_tables(self) -> dict[str, str]:
        """The comparison with the atlas, which the findings quote, where the run makes it."""
        return {name: paths.table_file(name) for name in paths.ATLAS_TABLES} \
            if self.atlas_devices or self.atlas_quantized_devices else {}

    # -- what the jobs are given ------------------------------------------------------------
    def dataset_samples(self, dataset: str) -> list[int]:
        """The sample indices the devices read from this dataset (none if no model uses it)."""
        used = any(self.config["models"][model].get("dataset") == dataset
                   for model in self.models)
        return self.config["samples"] if used else []

    def aarch64_runtimes(self) -> list[str]:
        """The runtimes of the emulated Arm devices: what the aarch64 userland must hold."""
        from bitdrift.emulation.cpus import architecture

        return sorted({device["backend"] for device in self.config["devices"].values()
                       if architecture(device.get("emulate") or "") == "aarch64"})

    def example_samples(self) -> int:
        """How many inputs an example model's inputs file holds: the samples, and whole
        batches of every device after them."""
        return (max(self.config["samples"]) + 1
                + max(device["batch_size"] for device in self.config["devices"].values()))

    # -- resources ----------------------------------------------------------------------------
    def device_resources(self, device: str) -> dict:
        """A device's scheduling: its `resources`, plus one GPU for a GPU device that asks
        for none (so `gpu` devices land on GPU nodes without extra config)."""
        entry = self.config["devices"][device]
        own = dict(entry.get("resources", {}))
        if entry["accelerator"] == "gpu" and "gpu" not in own and "gres" not in own:
            own["gpu"] = 1
        return own

    def training_resources_entries(self) -> list[dict]:
        """The training resources of every model the training rule can train."""
        return [self.config["models"][model]["train"].get("resources", {})
                for model in self.trained_models + list(self.study_models)]


def resource_default(key: str, profile_value):
    """A resource a job's entry leaves unset: the profile's plain default-resources value
    (``profile_value``), or where it sets none (None) an empty name or 0, which no local
    run constrains on (Snakemake refuses a resource function that returns None)."""
    if profile_value is None:
        return "" if key in TEXT_RESOURCES else 0
    return profile_value


def scheduling_resources(entries: list[dict], lookup: Callable, profile_value: Callable):
    """Rule resources taken from config entries: ``entries`` are every entry the rule can
    run (to declare only the keys some entry sets, so the profile's defaults stay in force
    otherwise), ``lookup(wildcards)`` the job's own resources, ``profile_value(key)`` the
    profile's plain default-resources value of a key (None where it sets none). A key the
    job's entry leaves unset falls back to the profile's (:func:`resource_default`).
    {key: function of the job's wildcards}, as a rule's ``resources:`` takes."""
    keys = sorted({key for entry in entries for key in entry})

    def resource(key):
        def value(wildcards):
            own = lookup(wildcards)
            return own[key] if key in own else resource_default(key, profile_value(key))

        return value

    return {key: resource(key) for key in keys}
