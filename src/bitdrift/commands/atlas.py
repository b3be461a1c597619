"""Records of unknown origin: an atlas index of known records, and which class a record
is in."""

from __future__ import annotations

from bitdrift.errors import ConfigError


def cmd_identify(args) -> int:
    from bitdrift.explain import identify
    from bitdrift.record import open_records

    if bool(args.against) == bool(args.index):
        raise ConfigError("identify: give either --against RECORDS or --index ATLAS")
    if args.index:
        return cmd_identify_indexed(args)
    eqc = None
    if args.eqc:
        from bitdrift.atomic import read_table
        from bitdrift.eqc import EQC_COLUMNS

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
    from bitdrift.atlas import Index
    from bitdrift.record import Record

    found = Index.read(args.index).identify(Record(args.record))
    if found.matched:
        print(f"{args.record}: matched, bitwise on {found.keys} sample(s): "
              f"{', '.join(found.records)}")
        return 0
    print(f"{args.record}: no match; nearest by remaining precision "
          f"({found.remaining_precision:g} bits over {found.keys} sample(s)): "
          f"{', '.join(found.records)}")
    return 1


def cmd_index(args) -> int:
    from bitdrift.atlas import Index
    from bitdrift.record import open_records

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
    p.add_argument("--eqc", help="eqc.csv of the known records: its class numbers are used "
                   "(default: numbered by first appearance over --against)")
    p.set_defaults(func=cmd_identify)

    p = sub.add_parser("index", help="an atlas index of records for `identify --index`")
    p.add_argument("files", nargs="+", help="the records")
    p.add_argument("--layer", default="output", help="the layer indexed (default: the "
                   "final output)")
    p.add_argument("--out", required=True, help="the index (HDF5)")
    p.set_defaults(func=cmd_index, writes_data=True)
