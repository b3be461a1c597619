"""MaxPool programs, zero programs (Tables 1 and 3), backprop variation and the volume."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from bitdrift.errors import AcceleratorMissing
from bitdrift.studies.maxpool.experiments import (
    backprop_variation_table,
    select_device,
    thresholds,
    volume_table,
)
from bitdrift.studies.maxpool.jacobians import (
    MINIMAL,
    NATIVE,
    MaxPool2d,
    NormPool2d,
    Program,
    ReLU,
    bifurcation_volume,
    hoeffding_margin,
    mcdiarmid_margin,
    minibatch_gradient,
    set_program,
    tau_gpu,
    tau_relu,
    zero2_program_derivative,
    zero_program_derivative,
)
from bitdrift.studies.maxpool.networks import build_network


def grad_through(pool, x):
    x = x.clone().requires_grad_(True)
    out = pool(x)
    out.backward(torch.arange(1, out.numel() + 1, dtype=x.dtype).reshape(out.shape))
    return out.detach(), x.grad


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0, 3.0])
def test_forward_identical_and_gradients_equal_without_ties(beta):
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    reference_out, reference_grad = grad_through(lambda t: F.max_pool2d(t, 2), x)
    out, grad = grad_through(MaxPool2d(kernel_size=2, beta=beta), x)
    assert torch.equal(out, reference_out)
    assert torch.equal(grad, reference_grad)


def test_gradients_at_ties_are_as_defined():
    window = torch.tensor([[[[1.0, 1.0], [0.5, 1.0]]]], dtype=torch.float64)
    upstream = torch.ones(1, 1, 1, 1, dtype=torch.float64)
    grads = {}
    for beta in (0.0, 1.0, 4.0):
        x = window.clone().requires_grad_(True)
        MaxPool2d(kernel_size=2, beta=beta)(x).backward(upstream)
        grads[beta] = x.grad.flatten().tolist()
    assert grads[0.0] == [1, 0, 0, 0]  # native: the first maximal entry (PyTorch's choice)
    assert grads[1.0] == pytest.approx([1 / 3, 1 / 3, 0, 1 / 3])  # minimal: shared
    # hybrid: 4 * minimal - 3 * native
    assert grads[4.0] == pytest.approx([4 / 3 - 3, 4 / 3, 0, 4 / 3])


def test_overlapping_windows_accumulate():
    x = torch.zeros(1, 1, 3, 3, dtype=torch.float64)  # every entry ties
    _, grad = grad_through(MaxPool2d(kernel_size=2, stride=1, beta=1.0), x)
    # 4 windows, upstream 1..4, each shared by 4 entries: the centre is in all 4
    assert grad[0, 0, 1, 1] == pytest.approx((1 + 2 + 3 + 4) / 4)
    assert grad.sum() == pytest.approx(10.0)


def test_negative_beta_is_refused():
    with pytest.raises(ValueError, match="beta >= 0"):
        MaxPool2d(kernel_size=2, beta=-1)


def test_relu_derivative_at_zero_is_the_chosen_one():
    x = torch.tensor([-1.0, 0.0, 2.0], requires_grad=True)
    ReLU(relu_zero=0.7)(x).sum().backward()
    assert x.grad.tolist() == pytest.approx([0.0, 0.7, 1.0])


def test_normpool_gradient_and_zero_window_choice():
    x = torch.tensor([[[[3.0, 4.0], [0.0, 0.0]]]], requires_grad=True)
    out = NormPool2d(kernel_size=2)(x)
    assert float(out.detach()) == pytest.approx(5.0)
    out.backward()
    assert x.grad.flatten().tolist() == pytest.approx([0.6, 0.8, 0.0, 0.0])
    zero = torch.zeros(1, 1, 2, 2, requires_grad=True)
    NormPool2d(kernel_size=2, zero_grad=0.5)(zero).backward()
    assert zero.grad.flatten().tolist() == [0.5] * 4


@pytest.mark.parametrize("precision", [16, 32, 64])
def test_zero_program_tables_1_and_3(precision):
    eps = torch.finfo({16: torch.float16, 32: torch.float32, 64: torch.float64}[precision]).eps
    x1, x2 = (1.0, 2.0, 3.0, 4.0), (1.4, 1.4, 1.4, 1.4)
    # x1: AD is wrong only at the nondifferentiable point t = 0 (-1.5 and +1.5)
    assert zero_program_derivative(0.0, x1, precision) == -1.5
    assert zero2_program_derivative(0.0, x1, precision) == 1.5
    for t in (-1e-3, 1e1, 1e3):
        assert zero_program_derivative(t, x1, precision) == 0.0
        assert zero2_program_derivative(t, x1, precision) == 0.0
    # x2: 0 over the reals, a compensation error of the order of eps in floating point
    for t in (-1e-1, 0.0, 1e2):
        for value in (zero_program_derivative(t, x2, precision),
                      zero2_program_derivative(t, x2, precision)):
            assert value != 0.0
            assert abs(value) <= 2 * eps


def test_backprop_variation_on_a_real_network(tmp_path):
    from bitdrift.inputs.datasets import prepare_dataset

    dataset = tmp_path / "digits.h5"
    prepare_dataset("digits", {"source": "digits", "limit_train": 64, "limit_test": 8}, dataset)
    spec = {"network": "lenet5", "draws": 2, "batch_size": 16, "batches": 2}
    table = backprop_variation_table(spec, dataset, precision=32)
    by = table.groupby("comparison")["variation"]
    assert (by.max()["copy"]) == 0.0  # P vs a copy of P: deterministic on the CPU
    assert by.min()["native_vs_minimal"] > 0.0  # digits have flat regions: ties
    assert len(table) == 3 * 2 * 2
    tau = thresholds(table)[32]
    assert tau["tau1"] == 0.0


def test_set_program_keeps_parameters():
    network = build_network("vgg11", channels=3, classes=10, width=0.125, batch_norm=True)
    before = [p.clone() for p in network.parameters()]
    set_program(network, MINIMAL)
    assert all(m.beta == 1.0 for m in network.modules() if isinstance(m, MaxPool2d))
    assert all(torch.equal(a, b) for a, b in zip(before, network.parameters(), strict=True))
    images = torch.rand(4, 3, 32, 32)
    gradient = minibatch_gradient(set_program(network, NATIVE), images, torch.arange(4))
    assert gradient.dtype == torch.float64
    assert gradient.numel() == sum(p.numel() for p in network.parameters())


def test_thresholds_and_volume_with_margins():
    assert tau_gpu(np.array([0.0, 1e-8, 3e-8])) == 3e-8
    assert tau_relu(np.array([0.0, 0.0, 2e-5, 1e-3])) == 2e-5
    assert tau_relu(np.zeros(3)) == math.inf
    variations = np.array([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])  # M=2 draws x R=3 batches
    volume = bifurcation_volume(variations, threshold=0.5)
    assert volume["share_theta"] == 0.5 and volume["share_batches"] == pytest.approx(1 / 6)
    assert volume["share_theta_margin"] == pytest.approx(math.sqrt(math.log(40) / 4))
    assert hoeffding_margin(1000) == pytest.approx(0.04294694)  # Table 2's M = 1000
    assert mcdiarmid_margin(2, 3) == pytest.approx(math.sqrt(0.5 * (1 / 2 + 1 / 3) * math.log(40)))


def test_a_gpu_study_without_a_gpu_fails_loudly():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the refusal path cannot be shown here")
    with pytest.raises(AcceleratorMissing, match="asks for a GPU.*refusing to fall back"):
        select_device("gpu")


def test_resnet18_without_batch_norm_has_none():
    # Before the fix the switch was ignored: 20 BatchNorm2d modules either way.
    with_bn = build_network("resnet18", channels=3, classes=10, width=0.125, batch_norm=True)
    without = build_network("resnet18", channels=3, classes=10, width=0.125, batch_norm=False)
    count = lambda net: sum(isinstance(m, torch.nn.BatchNorm2d) for m in net.modules())  # noqa: E731
    assert count(with_bn) == 20 and count(without) == 0
    assert without(torch.rand(2, 3, 32, 32)).shape == (2, 10)


def test_a_non_finite_copy_variation_never_becomes_the_threshold():
    rows = [{"comparison": "copy", "precision": 16, "variation": value}
            for value in (0.0, 1e-3, float("nan"), float("inf"))]
    rows += [{"comparison": "native_vs_minimal", "precision": 16, "network": "vgg11",
              "batch_size": 32, "batch_norm": False, "draw": draw, "batch": batch,
              "variation": value}
             for (draw, batch), value in zip([(0, 0), (0, 1), (1, 0), (1, 1)],
                                             [0.0, 5e-4, 2e-3, float("nan")], strict=True)]
    table = pd.DataFrame(rows)
    taus = thresholds(table)[16]
    # Before the fix tau^1 was NaN and every D > NaN false: a volume of 0, silently.
    assert taus["tau1"] == 1e-3 and taus["copy_non_finite"] == 2
    volume = volume_table(table, {16: "tau1"}).iloc[0]
    assert volume["non_finite"] == 1 and volume["copy_non_finite"] == 2
    # in S: draw 1 (2e-3 > tau, and the non-finite one); draw 0 has 0 and 5e-4 <= 1e-3
    assert volume["share_theta"] == 0.5 and volume["share_batches"] == 0.5


def test_table_2_second_line_carries_both_margins():
    volume = bifurcation_volume(np.zeros((4, 5)), threshold=0.0)
    assert volume["share_batches_margin"] == pytest.approx(mcdiarmid_margin(4, 5))
    assert volume["share_batches_hoeffding_margin"] == pytest.approx(hoeffding_margin(20))
    assert volume["non_finite"] == 0


def test_normpool_zero_gradient_must_stay_in_the_clarke_jacobian():
    assert NormPool2d(kernel_size=2, zero_grad=-0.5).zero_grad == -0.5  # norm exactly 1
    with pytest.raises(ValueError, match="outside the Clarke Jacobian"):
        NormPool2d(kernel_size=2, zero_grad=0.6)
    pool = NormPool2d(kernel_size=3)
    with pytest.raises(ValueError, match="kernel size 3"):
        set_program(torch.nn.Sequential(pool), Program(norm_zero_grad=0.5))


def test_training_figure_says_what_beta_is_and_when_the_spread_is_unmeasured(tmp_path):
    from bitdrift.studies.maxpool.figures import plot_maxpool_training
    from tests.utils import figure_text

    rows = [{"beta": beta, "seed": seed, "learning_rate": 0.2, "epoch": epoch,
             "test_accuracy": 0.5 + 0.1 * epoch + 0.01 * seed}
            for beta in (0.0, 1.0) for seed in (0, 1) for epoch in (1, 2)]
    text = figure_text(plot_maxpool_training, pd.DataFrame(rows), folder=tmp_path)
    assert "β sets which gradient backprop takes" in text.replace("\n", " ")
    assert "With 2 seeds per β the run-to-run spread is not measured" in \
        text.replace("\n", " ")
    assert "0.70–0.71" in text  # the two seeds' final accuracies: 0.5 + 0.2 + 0.01 x seed
    three = pd.DataFrame([{**row, "seed": 2} for row in rows if row["seed"] == 0] + rows)
    assert "not measured" not in figure_text(plot_maxpool_training, three, folder=tmp_path)
    empty = figure_text(plot_maxpool_training, pd.DataFrame(columns=rows[0]), folder=tmp_path)
    assert "nothing to show" in empty
