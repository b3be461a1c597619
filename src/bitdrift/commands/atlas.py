"""Records of unknown origin: an atlas index of known records, and which class a record
is in."""

from __future__ import annotations

import sys

from bitdrift.commands.common import outputs_together
from bitdrift.errors import ConfigError, RecordError


def cmd_identify(args) -> int:
    from bitdrift.analysis.explain import identify
    from bitdrift.record.reader import open_records

    if sum(bool(found) for found in (args.against, args.index,
                                     args.atlas is not None)) != 1:
        raise ConfigError("identify: give either --against RECORDS, --index INDEX or "
                          "--atlas FOLDER")
    if args.index:
        return cmd_identify_indexed(args)
    if args.atlas is not None:
        return cmd_identify_atlas(args)
    eqc = None
    if args.eqc:
        from bitdrift.analysis.eqc import EQC_COLUMNS
        from bitdrift.atomic import read_table

        eqc = read_table(args.eqc, EQC_COLUMNS, "bitdrift eqc")
    unknown, *known = open_records([args.record, *args.against])
    found = identify(unknown, known, eqc)
    shared = ", ".join(f"{k}={v}" for k, v in found.shared.items()) or "none"
    if found.differing:  # what the record's own fingerprint says otherwise
        shared += "; the record itself has " + ", ".join(
            f"{k}={own} (not {theirs})" for k, (own, theirs) in found.differing.items())
    if found.matched:
        print(f"{args.record}: matched, bitwise on every sample: class "
              f"{', '.join(f'{c} (sample {s})' for s, c in found.classes.items())}; devices "
              f"{', '.join(found.devices)}; shared attributes: {shared}")
        return 0
    numbering = "" if args.eqc else " (classes numbered over --against in order)"
    classes = [f"class {', '.join(f'{c} (sample {s})' for s, c in numbers.items())}: "
               f"devices {', '.join(devices)}" for numbers, devices in found.nearest_classes]
    if len(classes) == 1:
        nearest = f"nearest class by remaining precision ({found.remaining_precision:g} bits)"
    else:
        nearest = (f"{len(classes)} classes tied as nearest by remaining precision "
                   f"({found.remaining_precision:g} bits)")
    print(f"{args.record}: no match; {nearest}{numbering}: {'; '.join(classes)}; "
          f"attributes consistent with {'it' if len(classes) == 1 else 'them'}: {shared}")
    return 1


def cmd_identify_indexed(args) -> int:
    from bitdrift.atlas.digest_index import Index
    from bitdrift.record.reader import Record

    found = Index.read(args.index).identify(Record(args.record))
    if found.matched:
        print(f"{args.record}: matched, bitwise on {found.keys} sample(s): "
              f"{', '.join(found.records)}")
        return 0
    print(f"{args.record}: no match; nearest by remaining precision "
          f"({found.remaining_precision:g} bits over {found.keys} sample(s)): "
          f"{', '.join(found.records)}")
    return 1


def _read_atlas(folder):
    """The atlas's readable entries; a line on standard error for each refused one (the
    comparison goes on without it)."""
    from bitdrift.atlas.entries import default_folder, read_atlas

    atlas = read_atlas(folder or default_folder())
    for line in atlas.refused:
        print(f"bitdrift: warning: {' '.join(line.split())}", file=sys.stderr)
    return atlas


def cmd_identify_atlas(args) -> int:
    """The machines and devices of the atlas whose every layer gives the record's bits
    (its device's layers, on the reference model's samples); else the nearest by the
    remaining precision of the final output."""
    from bitdrift.atlas.entries import identify

    found = identify(args.record, _read_atlas(args.atlas))
    machines = "; ".join(f"{machine}: {', '.join(devices)}"
                         for machine, devices in found.machines.items())
    if found.matched:
        print(f"{args.record}: matched, bitwise on every layer and sample: {machines}")
        return 0
    print(f"{args.record}: no match in the atlas; nearest by remaining precision of the final "
          f"output ({found.remaining_precision:g} bits): {machines}")
    return 1


def cmd_atlas(args) -> int:
    """`bitdrift atlas VERB`: the verb's handler."""
    return args.verb_func(args)


def cmd_atlas_add(args) -> int:
    from bitdrift.atlas.entries import add, default_folder, encode, machine_name

    written = add(args.files, args.atlas or default_folder(), replace=args.replace,
                  merge=args.merge)
    if not written:
        raise RecordError("atlas add: no record to make an entry from (every one named is "
                          "a failed device's)")
    for path, entry in written:
        print(f"{path}: {machine_name(entry['machine'])}, {len(entry['devices'])} device(s), "
              f"{len(encode(entry)) / 1024:.1f} KiB")
    return 0


@outputs_together
def compare_with_atlas(files, atlas=None, out=None, refused_out=None,
                       figure_out=None) -> None:
    """This machine's records of the reference model against the atlas's machines (the
    folder ``atlas``, else the one shipped): the table, the entries refused, the figure."""
    import pandas as pd

    from bitdrift.atlas.entries import compare_records
    from bitdrift.report.findings.atlas import atlas as in_words

    table = compare_records(files, _read_atlas(atlas), table=out, refused_table=refused_out)
    if figure_out:
        from bitdrift.report.figures.machines import plot_atlas

        plot_atlas(table, figure_out)
    # the findings' words and table (the refused entries were warned of above)
    for item in in_words(table, pd.DataFrame()):
        print(item.to_string(index=False) if isinstance(item, pd.DataFrame) else item)


def cmd_atlas_compare(args) -> int:
    compare_with_atlas(args.files, args.atlas, args.out, args.refused_out, args.figure_out)
    return 0


def cmd_atlas_list(args) -> int:
    """The atlas's machines as a Markdown table; with --doc, written into that document
    between its markers instead (docs/atlas.md's list)."""
    from pathlib import Path

    from bitdrift.atlas.entries import default_folder
    from bitdrift.atlas.machines import machines_list, replace_list

    folder = args.atlas or default_folder()
    lines = machines_list(_read_atlas(folder).entries, folder)
    if not args.doc:
        print("\n".join(lines))
        return 0
    from bitdrift.atomic import write_bytes

    doc = Path(args.doc)
    try:
        text = doc.read_text()
    except OSError as error:
        raise ConfigError(f"--doc {doc}: cannot be read ({error.strerror})") from error
    write_bytes(doc, replace_list(text, lines, str(doc)).encode())
    print(f"{doc}: the list of {len(lines) - 2} machine(s) written")
    return 0


def cmd_index(args) -> int:
    from bitdrift.atlas.digest_index import Index
    from bitdrift.record.reader import open_records

    index = Index.build(open_records(args.files), args.layer)
    index.write(args.out)
    print(f"{args.out}: {len(index.labels)} records, {len(index.entries)} keys (model, "
          f"inputs, sample, format) of layer {args.layer!r}")
    return 0


def add_commands(sub) -> None:
    """Register these commands on the `bitdrift` subparsers."""
    p = sub.add_parser("identify", help="which known class a record of unknown origin is in "
                       "(exit 0: matched, 1: no match)")
    p.add_argument("record", help="the record to identify (same model and inputs)")
    p.add_argument("--against", nargs="+", help="known records")
    p.add_argument("--index", help="an atlas index of known records (`bitdrift index`): "
                   "exact match by look-up, nearest by a vectorised search")
    p.add_argument("--atlas", nargs="?", const="", metavar="FOLDER",
                   help="an atlas folder of machines' entries (`bitdrift atlas add`; alone: "
                   "the one shipped with bitdrift; the record is of the reference model): "
                   "the machines and devices that give its bits")
    p.add_argument("--eqc", help="eqc.csv of the known records: its class numbers are used "
                   "(default: numbered by first appearance over --against)")
    p.set_defaults(func=cmd_identify)

    p = sub.add_parser("index", help="an atlas index of records for `identify --index`")
    p.add_argument("files", nargs="+", help="the records")
    p.add_argument("--layer", default="output", help="the layer indexed (default: the "
                   "final output)")
    p.add_argument("--out", required=True, help="the index (HDF5)")
    p.set_defaults(func=cmd_index, writes_data=True)

    p = sub.add_parser("atlas", help="the atlas of machines measured on the reference model: "
                       "add this machine's entry, compare this machine with the others")
    p.set_defaults(func=cmd_atlas)
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB",
                             help="add: this machine's entry; compare: this machine with "
                             "the atlas; list: the machines it holds")
    atlas_help = ("the atlas folder (default: the one shipped with bitdrift, "
                  "bitdrift/reference_set/atlas)")
    q = verbs.add_parser("add", help="write this machine's entry from its records of the "
                         "reference model (one per machine: the host, each emulated CPU)")
    q.add_argument("files", nargs="+", help="records of the reference model")
    q.add_argument("--atlas", help=atlas_help)
    q.add_argument("--replace", action="store_true", help="replace an entry of the same "
                   "machine and versions (refused otherwise)")
    q.add_argument("--merge", action="store_true", help="add the records' devices to the "
                   "entry of the same machine and versions (a device it holds is refused)")
    q.set_defaults(verb_func=cmd_atlas_add, writes_data=True)
    q = verbs.add_parser("compare", help="per device, the machines of the atlas that give "
                         "this machine's bits, and where the others part from it first")
    q.add_argument("files", nargs="+", help="this machine's records of the reference model")
    q.add_argument("--atlas", help=atlas_help)
    q.add_argument("--out", help="table (CSV): one row per device and machine")
    q.add_argument("--refused-out", help="table (CSV) of the entries that could not be read")
    q.add_argument("--figure-out", help="figure (PDF, and PNG beside it): machines x devices, "
                   "colour = class across machines")
    q.set_defaults(verb_func=cmd_atlas_compare)
    q = verbs.add_parser("list", help="the atlas's machines as a Markdown table (label, real "
                         "or emulated, devices, size, entry)")
    q.add_argument("--atlas", help=atlas_help)
    q.add_argument("--doc", help="a document (docs/atlas.md) whose generated list of machines "
                   "is replaced by this one, instead of printing it")
    q.set_defaults(verb_func=cmd_atlas_list)
