"""The MaxPool study's experiments on a bitdrift dataset file: backprop variation
(Figures 1-3), bifurcation-zone volume (Table 2, Figure 4) and hybrid-beta training
(Figure 5). Each returns a table; the figures are drawn from the tables."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from bitdrift.errors import StudyError
from bitdrift.inputs.datasets import read_dataset
from bitdrift.jobs import framework_imported
from bitdrift.progress import progress
from bitdrift.studies.maxpool.jacobians import (
    MINIMAL,
    NATIVE,
    PRECISIONS,
    RELU_ONE,
    Program,
    bifurcation_volume,
    kaiming_uniform_,
    minibatch_gradient,
    minor_major_split,
    set_program,
    tau_gpu,
    tau_relu,
    zero_program_table,
)
from bitdrift.studies.maxpool.networks import build_network

framework_imported()  # torch is loaded: a job that imports this module starts its work here

# Definition 7's comparisons: the sanity copy, the MaxPool Jacobians, ReLU'(0).
COMPARISONS = {
    "copy": (NATIVE, NATIVE),
    "native_vs_minimal": (NATIVE, MINIMAL),
    "relu0_vs_relu1": (NATIVE, RELU_ONE),
}


def select_device(accelerator: str) -> torch.device:
    """cpu, or cuda when asked for; a missing GPU fails, never falls back to the CPU (the
    torch runtime's own check, bitdrift.backends.keras.torch)."""
    from bitdrift.backends.keras import torch as torch_runtime

    return torch_runtime.torch_device("the MaxPool study", accelerator)


def configure(accelerator: str, deterministic: bool) -> torch.device:
    """The device, and torch's determinism switch set either way: deterministic kernels
    make D(P, P~) 0; off, GPU kernels give tau^1 > 0."""
    from bitdrift.backends.keras import torch as torch_runtime

    device = select_device(accelerator)
    torch_runtime.configure_determinism(deterministic)
    return device


def load_split(dataset_path, split: str, limit: int | None, precision: int, device):
    """Images (NCHW) and labels of one split, in the study's precision."""
    data = read_dataset(dataset_path, splits=(split,))
    images, labels = data[f"x_{split}"], data[f"y_{split}"]
    if split == "train":  # the dataset's fixed training order
        images, labels = images[data["train_order"]], labels[data["train_order"]]
    if limit:
        images, labels = images[:limit], labels[:limit]
    images = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))
    return (images.to(device=device, dtype=PRECISIONS[precision]),
            torch.from_numpy(labels.astype(np.int64)).to(device))


def _network(spec: dict, images, labels, precision: int, device):
    classes = int(labels.max()) + 1
    network = build_network(spec["network"], channels=images.shape[1],
                            classes=max(classes, spec.get("classes", 10)),
                            batch_norm=spec.get("batch_norm", False),
                            width=spec.get("width", 1.0), pooling=spec.get("pooling", "max"))
    return network.to(device=device, dtype=PRECISIONS[precision])


def backprop_variation_table(spec: dict, dataset_path, *, precision: int,
                             comparisons=tuple(COMPARISONS), accelerator: str = "cpu",
                             deterministic: bool = True) -> pd.DataFrame:
    """D_{m,q}(P, Q) for M Kaiming-uniform draws x R mini-batches, per comparison; with
    per-parameter counts of minor (a few ulps) and major differences."""
    device = configure(accelerator, deterministic)
    images, labels = load_split(dataset_path, "train", spec.get("limit"), precision, device)
    network = _network(spec, images, labels, precision, device)
    network.train(spec.get("train_mode", True))
    batch_size = spec["batch_size"]
    starts = list(range(0, len(images), batch_size))[: spec.get("batches") or None]
    rows = []
    for draw in progress(range(spec["draws"]), f"{spec['network']} {precision}-bit: draws"):
        kaiming_uniform_(network, spec.get("seed", 0) * 100003 + draw)
        for batch, start in enumerate(starts):
            x, y = images[start:start + batch_size], labels[start:start + batch_size]
            # BatchNorm's running statistics move with each forward pass: every program
            # starts from the same parameters and buffers.
            state = {k: v.clone() for k, v in network.state_dict().items()}
            for name in comparisons:
                program_p, program_q = COMPARISONS[name]
                total, difference, magnitude = _variation(network, program_p, program_q,
                                                          x, y, state)
                minor, major = minor_major_split(difference, magnitude, precision)
                rows.append({"comparison": name, "network": spec["network"],
                             "precision": precision, "batch_size": batch_size,
                             "batch_norm": spec.get("batch_norm", False), "draw": draw,
                             "batch": batch, "variation": total, "parameters":
                             difference.numel(), "minor": minor, "major": major,
                             "finite": bool(np.isfinite(total))})
    return pd.DataFrame(rows)


def _variation(network, program_p: Program, program_q: Program, x, y, state):
    network.load_state_dict(state)
    grad_p = minibatch_gradient(set_program(network, program_p), x, y)
    network.load_state_dict(state)
    grad_q = minibatch_gradient(set_program(network, program_q), x, y)
    difference = (grad_p - grad_q).abs()
    return float(difference.sum()), difference, torch.maximum(grad_p.abs(), grad_q.abs())


def thresholds(table: pd.DataFrame) -> dict:
    """tau^1 from the copy comparison, tau^2 from ReLU'(0), per precision; with the
    number of non-finite copy variations (never part of tau^1)."""
    out = {}
    for precision, rows in table.groupby("precision"):
        copy = rows.loc[rows["comparison"] == "copy", "variation"].to_numpy(dtype=float)
        relu = rows.loc[rows["comparison"] == "relu0_vs_relu1", "variation"].to_numpy(
            dtype=float)
        out[int(precision)] = {"tau1": tau_gpu(copy) if copy.size else None,
                               "tau2": tau_relu(relu) if relu.size else None,
                               "copy_non_finite": int((~np.isfinite(copy)).sum())}
    return out


def volume_table(table: pd.DataFrame, threshold_policy: dict) -> pd.DataFrame:
    """Table 2 / Figure 4 rows: the share of draws and of mini-batches in S(tau), with the
    Hoeffding and McDiarmid margins and the count of non-finite variations.
    `threshold_policy` maps precision -> 'tau1', 'tau2' or a number."""
    taus = thresholds(table)
    rows = []
    keys = ["network", "precision", "batch_size", "batch_norm"]
    maxpool = table[table["comparison"] == "native_vs_minimal"]
    for key, rows_of_setting in maxpool.groupby(keys):
        setting = dict(zip(keys, key, strict=True))
        precision = int(setting["precision"])
        policy = threshold_policy.get(precision, "tau1")
        tau = taus[precision].get(policy) if isinstance(policy, str) else policy
        if tau is None:
            raise StudyError(f"threshold {policy} needs the {policy} comparison in the table")
        if not np.isfinite(tau):
            raise StudyError(f"threshold {policy} is {tau} at {precision} bits: no positive "
                             "finite variation to take it from")
        variations = rows_of_setting.pivot(index="draw", columns="batch",
                                           values="variation").to_numpy(dtype=float)
        volume = bifurcation_volume(variations, tau)
        rows.append({**setting, "threshold_policy": str(policy),
                     "copy_non_finite": taus[precision]["copy_non_finite"], **volume})
    return pd.DataFrame(rows)


def train_hybrid(spec: dict, dataset_path, *, beta: float, seed: int, learning_rate: float,
                 precision: int, accelerator: str = "cpu",
                 deterministic: bool = True) -> pd.DataFrame:
    """SGD (no momentum) with hybrid-beta MaxPool; one row per epoch.

    16-bit training is pure half precision: parameters, inputs, gradients and the SGD
    update are float16, with no float32 master copy and no loss scaling, so what the
    Jacobian choice does to float16 arithmetic is not hidden.
    """
    device = configure(accelerator, deterministic)
    train_x, train_y = load_split(dataset_path, "train", spec.get("limit"), precision, device)
    test_x, test_y = load_split(dataset_path, "test", None, precision, device)
    torch.manual_seed(seed)
    network = _network(spec, train_x, train_y, precision, device)
    kaiming_uniform_(network, seed)
    set_program(network, Program(beta=beta))
    optimizer = torch.optim.SGD(network.parameters(), lr=learning_rate, momentum=0.0)
    order = torch.Generator().manual_seed(seed)
    rows, batch_size = [], spec["batch_size"]
    for epoch in progress(range(1, spec["epochs"] + 1), f"beta {beta:g} seed {seed}: epochs"):
        network.train()
        started, losses = time.perf_counter(), []
        for index in torch.randperm(len(train_x), generator=order).split(batch_size):
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(network(train_x[index]), train_y[index])
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
        network.eval()
        with torch.no_grad():
            predicted = torch.cat([network(test_x[i:i + 256]).argmax(1)
                                   for i in range(0, len(test_x), 256)])
        rows.append({"beta": beta, "seed": seed, "learning_rate": learning_rate,
                     "precision": precision, "epoch": epoch,
                     "train_loss": float(np.mean(losses)),
                     "diverged": not np.isfinite(np.mean(losses)),
                     "test_accuracy": float((predicted == test_y).float().mean()),
                     "epoch_seconds": time.perf_counter() - started})
    return pd.DataFrame(rows)


# -- the study's steps, one table each (one `bitdrift maxpool-*` command and rule each) ------
def _common(study: dict) -> dict:
    return {"accelerator": study["accelerator"], "deterministic": study["deterministic"]}


def zero_programs() -> pd.DataFrame:
    """Tables 1 and 3: the zero programs' derivatives at 16/32/64 bits (no study needed)."""
    return pd.DataFrame(zero_program_table())


def backprop_variation(study: dict, dataset_path, precision: int) -> pd.DataFrame:
    """Figures 1-3: D for the study's `variation` network at one precision."""
    return backprop_variation_table(study["variation"], dataset_path, precision=precision,
                                    **_common(study))


def volume_draws(study: dict, dataset_path, setting: str) -> pd.DataFrame:
    """Table 2's raw material for one setting: D over draws x mini-batches."""
    volume = study["volume"]
    if setting not in volume["settings"]:
        raise StudyError(f"setting {setting!r} is not in maxpool.volume.settings "
                         f"{sorted(volume['settings'])}")
    spec = {**volume["settings"][setting], "draws": volume["draws"],
            "batches": volume["batches"], "limit": volume["limit"], "width": volume["width"]}
    table = backprop_variation_table(spec, dataset_path, precision=spec["precision"],
                                     **_common(study))
    table.insert(0, "setting", setting)
    return table


def volume_summary(study: dict, draw_tables: list[pd.DataFrame]) -> pd.DataFrame:
    """Table 2: the share of draws and mini-batches in S per setting, from
    :func:`volume_draws` tables."""
    policy = {int(k): v for k, v in study["volume"]["thresholds"].items()}
    parts = []
    for raw in draw_tables:
        part = volume_table(raw, policy)
        part.insert(0, "setting", raw["setting"].iloc[0])
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def hybrid_training(study: dict, dataset_path, beta: float, seed: int) -> pd.DataFrame:
    """Figure 5: one seed of SGD training with hybrid-beta MaxPool."""
    training = study["training"]
    rates = {float(key): rate for key, rate in training["betas"].items()}
    if float(beta) not in rates:
        raise StudyError(f"beta {beta} is not in maxpool.training.betas {list(rates)}")
    return train_hybrid(training, dataset_path, beta=float(beta), seed=int(seed),
                        learning_rate=rates[float(beta)], precision=training["precision"],
                        **_common(study))
