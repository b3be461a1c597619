"""Where the workflow puts things: the one place every path is spelled.

Each function returns a concrete path when given values and the Snakemake wildcard
pattern when called without them (``record_file()`` is
``results/inference/{model}/{device}.h5``), so rules, input functions, the command line and
the studies share one spelling: renaming a file is one edit here. Each study spells its
own files in its package's ``paths`` module, on top of these.
"""

from __future__ import annotations

RESULTS = "results"
TABLES = f"{RESULTS}/tables"
FIGURES = f"{RESULTS}/figures"


# -- core -----------------------------------------------------------------------------------
def dataset_file(dataset="{dataset}") -> str:
    return f"{RESULTS}/datasets/{dataset}.h5"


def trained_model_directory(model="{model}", seed="{seed}") -> str:
    return f"{RESULTS}/models/{model}/seed_{seed}"


def trained_model_file(model="{model}", seed="{seed}") -> str:
    return f"{trained_model_directory(model, seed)}/model.keras"


def training_history_file(model="{model}", seed="{seed}") -> str:
    return f"{trained_model_directory(model, seed)}/history.csv"


def test_logits_file(model="{model}", seed="{seed}") -> str:
    return f"{trained_model_directory(model, seed)}/test_logits.h5"


def inference_seed(model: dict) -> int:
    """The training seed whose model the devices run."""
    return model.get("inference_seed", model["train"]["seeds"][0])


# The suffix of the file each quantizer writes (config key models.NAME.quantize.tool)
QUANTIZED_SUFFIXES = {"onnxruntime": "onnx", "openvino": "onnx", "litert": "tflite",
                      "torch": "pt2"}


def quantized_model_file(model="{model}", suffix="{suffix}") -> str:
    """The model that config key models.MODEL.quantize makes from its float model (rule
    quantize_model, bitdrift.backends.quantizers), with its quantizer's suffix."""
    return f"{RESULTS}/quantized/{model}.{suffix}"


def model_file(config: dict, model: str) -> str:
    """The model the devices run: a bring-your-own file as is, a quantized model's file,
    else the inference seed's."""
    spec = config["models"][model]
    if "file" in spec:
        return spec["file"]
    if "quantize" in spec:
        return quantized_model_file(model, QUANTIZED_SUFFIXES[spec["quantize"]["tool"]])
    return trained_model_file(model, inference_seed(spec))


def model_inputs_file(config: dict, model: str) -> str:
    """What the devices feed the model: its own ``inputs`` file, a quantized model its
    float model's, else its dataset's prepared file (whose test set the samples index)."""
    spec = config["models"][model]
    if "quantize" in spec:
        return model_inputs_file(config, spec["quantize"]["model"])
    return spec["inputs"] if "inputs" in spec else dataset_file(spec["dataset"])


def example_model_file(example="{example}", suffix="{suffix}") -> str:
    """bitdrift's example model ``example`` (bitdrift.inputs.examples), its format's suffix
    without the dot: what the rule example_model writes (config/presets/your_model.yaml)."""
    return f"examples/{example}.{suffix}"


def example_inputs_file(example="{example}", suffix="{suffix}") -> str:
    return f"{example_model_file(example, suffix)}.npy"


def export_file(model="{model}", format="{format}") -> str:
    """The model exported for the runtimes that read ``format``
    (bitdrift.backends.exported.expected.FORMATS)."""
    return f"{RESULTS}/exports/{model}/model.{format}"


def deployed_export_file(model="{model}", format="{format}") -> str:
    """The model itself in ``format``, its final output alone: what a user deploys (the
    observer check, bitdrift.analysis.observer)."""
    return f"{RESULTS}/exports/{model}/deployed.{format}"


def export_reference_file(model="{model}") -> str:
    return f"{RESULTS}/exports/{model}/reference.npz"


def aarch64_userland_file() -> str:
    """The manifest of the aarch64 userland emulated Arm devices run in
    (bitdrift.emulation.aarch64)."""
    return f"{RESULTS}/emulation/aarch64.json"


def record_file(model="{model}", device="{device}") -> str:
    return f"{RESULTS}/inference/{model}/{device}.h5"


# The reference model (bitdrift.inputs.reference_set) as the workflow's model name: its records
# place this machine among the atlas's machines (bitdrift.atlas.entries)
ATLAS_MODEL = "atlas_reference"


# ... and quantized (config key atlas.quantize): its records are the atlas entries' quantized
# devices
ATLAS_QUANTIZED_MODEL = "atlas_reference_quantized"


def atlas_record_file(device="{device}") -> str:
    return record_file(ATLAS_MODEL, device)


def atlas_quantized_record_file(device="{device}") -> str:
    return record_file(ATLAS_QUANTIZED_MODEL, device)


def findings_file(suffix: str = "md") -> str:
    """What this machine showed, in sentences generated from the tables (bitdrift.report.findings):
    findings.md, and findings.rst for the report's first section."""
    return f"{RESULTS}/findings.{suffix}"


def report_file() -> str:
    """Every figure and table in one HTML page (Snakemake's report), written by a run of
    `all` at its end."""
    return f"{RESULTS}/report.html"


def table_file(name: str) -> str:
    """A table of the results (CSV), by its name without extension."""
    return f"{TABLES}/{name}.csv"


def table_html(name: str) -> str:
    """The same table as HTML, written beside the CSV; the HTML report shows it inline."""
    return f"{TABLES}/{name}.html"


def figure_file(name: str) -> str:
    """A figure of the results (PDF), by its name without extension."""
    return f"{FIGURES}/{name}.pdf"


def figure_png(name: str) -> str:
    """The same figure as PNG, written beside the PDF; the HTML report embeds it."""
    return f"{FIGURES}/{name}.png"


# -- the core's analysis results ------------------------------------------------------------
# What the core's analysis rules (rules/analysis.smk) make from the records, in the order a
# run of `all` asks for them: ("table", NAME) is table_file(NAME), ("figure", NAME)
# figure_file(NAME). The workflow's targets (bitdrift.plan) and the tables the findings read
# (bitdrift.report.findings) are taken from here, so a new table is one line here.
CORE_RESULTS = (
    ("table", "eqc"), ("table", "eqc_layers"), ("table", "precision"), ("figure", "eqc"),
    ("figure", "remaining_precision"), ("table", "explain"), ("table", "divergence"),
    ("table", "effective_precision"), ("table", "argmax_agreement"),
    ("table", "observer_check"), ("table", "kernels"), ("table", "kernel_coverage"),
    ("table", "accumulation_orders"), ("figure", "kernels"),
    ("figure", "accumulation_orders"), ("table", "flag_groups"), ("table", "device_classes"),
    ("table", "eqc_table"), ("figure", "eqc_table"), ("figure", "divergence"),
    ("table", "device_failures"),
)
CORE_TABLES = tuple(name for kind, name in CORE_RESULTS if kind == "table")
# The figure of the classes by CPU generation, made where some device runs on an emulated CPU
CPU_GENERATIONS_FIGURE = "cpu_generations"
# The comparison with the atlas (rules/atlas.smk), made where config key atlas.devices
# names devices: its table, the entries it could not read, and its figure
ATLAS_TABLES = ("atlas", "atlas_refused")
ATLAS_FIGURE = "atlas"


# Each quantized model against its float model, where the config quantizes one
# (bitdrift.analysis.quantization_error): its table and figure
QUANTIZATION_ERROR_TABLE = "quantization_error"
QUANTIZATION_ERROR_FIGURE = "quantization_error"
# Per pair of a quantized model's devices that part: the first layer, the cause, the
# integer replay's verdict (bitdrift.analysis.quantized_parting)
QUANTIZED_PARTING_TABLE = "quantized_parting"


def result_file(kind: str, name: str) -> str:
    """A result of CORE_RESULTS by its kind ("table" or "figure") and name."""
    return {"table": table_file, "figure": figure_file}[kind](name)
