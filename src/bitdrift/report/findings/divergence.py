"""Where devices part: the first divergent layer of each pair of classes, the kernels
recorded there, and how many first divergences the kernels explain."""

from __future__ import annotations

import pandas as pd

from bitdrift.report.findings.text import LISTED, SHOWN

# The characters the kernel pairs take in their line; the rest counted
KERNEL_PAIRS_WIDTH = 200


def divergence(table: pd.DataFrame, coverage: pd.DataFrame) -> list[str]:
    """Where pairs of classes part first, and which kernels differ there."""
    from bitdrift.analysis.divergence import class_pairs

    lines = []
    parted = class_pairs(table)  # each class pair once (not once per device of a class)
    for model, rows in parted.groupby("model", sort=False):
        counts = rows["first_layer"].value_counts()
        at = [f"{count} at `{layer}`" for layer, count in counts.items()]
        if len(at) > LISTED:  # the commonest layers; the rest counted
            rest = counts.iloc[SHOWN:]
            at = at[:SHOWN] + [f"… and {rest.sum()} at {len(rest)} more layers "
                               "(results/tables/divergence.csv)"]
        lines.append(f"{model}: of {len(rows)} (class pair, sample) first divergences, "
                     + ", ".join(at) + ".")
        if "kernels_differ" in rows:
            differ = rows[rows["kernels_differ"].astype(str) == "yes"]
            pairs = differ.apply(lambda row: " vs ".join(sorted(
                [str(row["kernels_a"]), str(row["kernels_b"])])), axis=1).value_counts()
            if len(pairs):  # the three commonest, and any tied with the third
                third = pairs.iloc[min(2, len(pairs) - 1)]
                tied = pairs[pairs >= third]
                said = [f"`{pair}` ({count})" for pair, count in tied.items()]
                # up to LISTED, and as many as a short line holds (kernel names run long)
                kept = said[:1]
                for item in said[1:] if len(said) <= LISTED else said[1:SHOWN]:
                    if len("; ".join([*kept, item])) > KERNEL_PAIRS_WIDTH:
                        break
                    kept.append(item)
                if len(kept) < len(said):
                    left = tied.iloc[len(kept):]
                    kept.append(f"… and {len(left)} more pairs"
                                + (f" at {third} each" if (left == third).all() else
                                   " (divergence.csv)"))
                lines.append(f"{model}: kernels at the first divergent layer, most often: "
                             + "; ".join(kept) + ".")
    for row in coverage.to_dict("records"):
        untraced = pd.to_numeric(pd.Series([row["untraced"]]), errors="coerce").fillna(0)[0]
        deployed_only = int(pd.to_numeric(pd.Series([row.get("deployed_only", 0)]),
                                          errors="coerce").fillna(0)[0])
        lines.append(f"{row['model']}: of {row['first_divergences']} first divergences the "
                     f"recorded kernels differ at {row['kernels_differ']}, the same kernels "
                     f"in other threads or batch at "
                     f"{row['same_kernels_other_settings']}, {row['unexplained']} unexplained"
                     + (f", {row['untraced']} involve a runtime naming no kernels"
                        if untraced else "")
                     + (f", {deployed_only} part only at the deployed model's final output, "
                        "every recorded layer agreeing" if deployed_only else "") + ".")
        if deployed_only:  # why, in a sentence of its own: a line stays short
            lines.append(f"{row['model']}, the {deployed_only} parting at the final output "
                         "alone" + _deployed_cause(parted[parted["model"] == row["model"]])
                         + ".")
    return lines or ["No two classes: nothing parts."]


def _deployed_cause(parted: pd.DataFrame) -> str:
    """Why pairs whose every recorded layer agrees part at the final output: the device
    whose deployed model gives another output than its own instrumented run on that
    sample (divergence.csv's ``deployed_differs``, from the observer check), so the pair
    says where a deployment differs, not where the two devices' layers part; or, where
    neither device's does, the final output itself parting after the last recorded layer."""
    from bitdrift.record.hdf5 import OUTPUT

    at_output = parted[parted["first_layer"].astype(str) == OUTPUT]
    if "deployed_differs" not in at_output:  # a table from before the column
        return " (the observer check below)"
    named = at_output["deployed_differs"].fillna("").astype(str).replace("nan", "")
    counts: dict[str, int] = {}
    for devices in named:
        for device in devices.split():
            counts[device] = counts.get(device, 0) + 1
    said = []
    if counts:
        who = [f"{device} ({count})" for device, count in counts.items()]
        said.append("on each, the deployed model of " + (", ".join(who[:-1]) + " or "
                                                          if len(who) > 1 else "")
                    + who[-1] + " gives another final output than its own instrumented run "
                    "(the observer check below): there a deployment differs, not the two "
                    "devices' layers")
    neither = int((named == "").sum())
    if neither:
        said.append(f"{'at' if counts else 'on'} {neither} neither device's deployed model "
                    "differs from its instrumented run: the final output itself parts, "
                    "after the last recorded layer")
    return ": " + "; ".join(said)
