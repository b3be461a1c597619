"""`bitdrift import-published`: the published records of the study bitdrift follows
(Schlögl, Hofer & Böhme 2023) as bitdrift records (bitdrift.atlas.published)."""

from __future__ import annotations

import sys


def cmd_import_published(args) -> None:
    from bitdrift.atlas.published import import_published

    written = import_published(args.folder, args.out, datasets=args.datasets)
    models = sorted({path.parent.name for path in written})
    print(f"bitdrift: {len(written)} records ({', '.join(models)}) -> {args.out}",
          file=sys.stderr)


def add_commands(sub) -> None:
    """Register these commands on the `bitdrift` subparsers."""
    p = sub.add_parser("import-published", help="the published records of Schlögl, Hofer & "
                       "Böhme 2023 (uibk-iNNference/unaNNticipated) as bitdrift records")
    p.add_argument("folder", help="their experiments/results/equivalence_classes (or a "
                   "folder laid out like it: CLOUD/{cpu,gpu}/HOST-DEVICE-MODEL-iSAMPLE.json)")
    p.add_argument("--out", required=True, help="folder of the records, OUT/MODEL/DEVICE.h5 "
                   "(an existing record is never overwritten)")
    p.add_argument("--datasets", help="their experiments/data/datasets with the Git LFS files "
                   "pulled: input_sha256 becomes the digest of the sample images, so records "
                   "made from their model files compare with the imported ones")
    p.set_defaults(func=cmd_import_published, writes_data=True, out_folder=True)
