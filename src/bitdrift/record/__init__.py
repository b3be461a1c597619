"""The record: one HDF5 file per (model, device), a public format (docs/record-format.md):
the format itself in ``hdf5``, writing in ``writer``, reading in ``reader``; failure
records (``failures``); a repeat's private file and the merge of repeats (``repeats``).
``bitdrift.record`` keeps the names it had before the record became a package.
"""

from bitdrift.record.hdf5 import (  # noqa: F401  (the public names, as before)
    BFLOAT16_ATTR,
    CHECKSUM,
    COMPRESSION,
    DEPLOYED,
    DIGESTS,
    FAILED,
    FAILURE_ATTRS,
    FORMAT_VERSION,
    KERNELS,
    LIBVER,
    OBSERVER_ATTR,
    OUTPUT,
    REPEAT_DIGEST,
    REQUIRED_ATTRS,
    SAMPLE_NAME,
    DigestOnly,
    FailedDevice,
    Tensor,
    output_digest,
)
from bitdrift.record.reader import (  # noqa: F401  (the public names, as before)
    READS_PER_HANDLE,
    LayerInfo,
    Record,
    checked_fingerprint,
    group_by_model,
    open_records,
    read_failure,
)
from bitdrift.record.writer import (  # noqa: F401  (the public names, as before)
    RecordWriter,
    TensorWriter,
    write_failure,
    write_record,
)
