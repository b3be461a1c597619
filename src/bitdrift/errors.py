"""One error hierarchy: every domain error is a :class:`BitdriftError`.

``bitdrift``'s ``main`` catches this base only and prints its message on one line (the
message names the file or config key); anything else is a bug and keeps its traceback.
Each class carries the exit status the command line returns for it.
This module imports nothing, so the analysis commands can report errors without loading
TensorFlow or torch.
"""


class BitdriftError(Exception):
    """Base of every error bitdrift reports to its user as one line."""

    exit_code = 2


class ConfigError(BitdriftError, ValueError):
    """A config that does not match the schema or refers to unknown names."""

    exit_code = 2


class PlanError(ConfigError):
    """A training-variance plan that cannot be run as written."""


class DatasetError(BitdriftError, ValueError):
    """A dataset source or dataset file that is missing, corrupt or inconsistent."""

    exit_code = 3


class ModelFormatError(BitdriftError, ValueError):
    """A model file of no format bitdrift reads, a damaged one, or inputs that do not fit
    its signature."""

    exit_code = 3


class RecordError(BitdriftError, ValueError):
    """A record that is not a valid bitdrift record, or not comparable with the others."""

    exit_code = 3


class StudyError(BitdriftError, RuntimeError):
    """A study cannot run as configured, or its inputs are inconsistent."""

    exit_code = 4


class AcceleratorMissing(BitdriftError, RuntimeError):
    """The device's accelerator is not visible to this process (never a CPU fallback)."""

    exit_code = 5


class InferenceError(BitdriftError, RuntimeError):
    """An inference job that failed; the message names the device and points at its log."""

    exit_code = 4


class TrainingRunError(BitdriftError, RuntimeError):
    """A training run that failed; the message names the run and points at its log."""

    exit_code = 4


class OutputError(BitdriftError, OSError):
    """An output that cannot be written: a full disk, a read-only folder. The partial file
    is removed, never left to look complete."""

    exit_code = 6


class InstallError(BitdriftError, OSError):
    """A download that failed or does not match its index's checksum, or a build that
    cannot be used (install-qemu, install-aarch64)."""

    exit_code = 7


def json_kind(value) -> str:
    """What a JSON value is, in JSON's words (an object, a list, a string, ...): the
    messages that refuse a value of the wrong type say what was found."""
    return {dict: "an object", list: "a list", str: "a string", bool: "true or false",
            int: "a number", float: "a number", type(None): "null"}.get(
        type(value), type(value).__name__)


EXIT_CODES = """exit status:
  0  success (identify: the record matched a known class)
  1  identify: the record matched no known class
  2  bad command line or config (the key is named)
  3  unreadable, corrupt or mismatched dataset or record file (the file is named)
  4  a study, inference or training run failed (the log is named)
  5  the device's accelerator (GPU/TPU) is not visible: never a CPU fallback
  6  an output cannot be written (disk full, read-only folder); nothing half-written is left
  7  install-qemu, install-aarch64: a download failed or does not match the index's SHA-256"""
