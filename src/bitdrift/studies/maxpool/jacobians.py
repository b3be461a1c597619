"""Nonsmooth autodiff through MaxPool (after Boustany 2024), in PyTorch.

*Programs* compute the same function and differ only in the element of the Clarke
Jacobian that backpropagation picks where the function is not differentiable:

- MaxPool ``native``: the whole gradient to the first maximal entry of a window
  (PyTorch's own backward kernel); ``minimal``: shared equally among all maximal entries
  (the Jacobian of least norm); ``hybrid`` with any ``beta >= 0``:
  ``beta * minimal + (1 - beta) * native`` (beta 0 is native, 1 minimal).
- ReLU with a chosen ``relu_zero`` = ReLU'(0).
- NormPool (Euclidean norm of a window) with a chosen gradient at an all-zero window.

Everything takes keyword arguments: the reference code passed alpha and beta
positionally and swapped them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

PRECISIONS = {16: torch.float16, 32: torch.float32, 64: torch.float64}


def _pair(size) -> list[int]:
    return [size, size] if isinstance(size, int) else list(size)


def minimal_maxpool_grad(x, out, grad_out, kernel_size, stride):
    """Gradient of MaxPool shared equally among every maximal entry of each window."""
    n, c, h, w = x.shape
    columns = F.unfold(x.reshape(n * c, 1, h, w), kernel_size, stride=stride)
    ties = (columns == out.reshape(n * c, 1, -1)).to(x.dtype)
    share = grad_out.reshape(n * c, 1, -1) / ties.sum(dim=1, keepdim=True)
    # fold sums overlapping windows, as backpropagation must
    grad = F.fold(ties * share, (h, w), kernel_size, stride=stride)
    return grad.reshape(n, c, h, w)


class _MaxPool2d(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, kernel_size, stride, beta):
        out, indices = F.max_pool2d(x, kernel_size, stride, return_indices=True)
        ctx.save_for_backward(x, out, indices)
        ctx.kernel_size, ctx.stride, ctx.beta = kernel_size, stride, beta
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, out, indices = ctx.saved_tensors
        k, s, beta = ctx.kernel_size, ctx.stride, ctx.beta
        grad = None
        if beta != 1:
            native = torch.ops.aten.max_pool2d_with_indices_backward(
                grad_out, x, _pair(k), _pair(s), [0, 0], [1, 1], False, indices)
            grad = native if beta == 0 else (1 - beta) * native
        if beta != 0:
            minimal = minimal_maxpool_grad(x, out, grad_out, k, s)
            grad = minimal if beta == 1 else grad + beta * minimal
        return grad, None, None, None


class MaxPool2d(nn.Module):
    """MaxPool with a chosen backward program; the forward pass is always F.max_pool2d."""

    def __init__(self, *, kernel_size: int = 2, stride: int | None = None, beta: float = 0.0):
        super().__init__()
        self.kernel_size, self.stride = kernel_size, stride or kernel_size
        self.beta = beta

    @property
    def beta(self) -> float:
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        if value < 0:
            raise ValueError(f"hybrid MaxPool needs beta >= 0, got {value}")
        self._beta = float(value)

    def forward(self, x):
        if self.beta == 0 and not torch.is_grad_enabled():
            return F.max_pool2d(x, self.kernel_size, self.stride)
        return _MaxPool2d.apply(x, self.kernel_size, self.stride, self.beta)


class _ReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, relu_zero):
        ctx.save_for_backward(x)
        ctx.relu_zero = relu_zero
        return x.clamp_min(0)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        slope = (x > 0).to(grad_out.dtype) + ctx.relu_zero * (x == 0).to(grad_out.dtype)
        return grad_out * slope, None


class ReLU(nn.Module):
    """ReLU whose derivative at 0 is `relu_zero` (PyTorch's own choice is 0)."""

    def __init__(self, *, relu_zero: float = 0.0):
        super().__init__()
        self.relu_zero = float(relu_zero)

    def forward(self, x):
        return _ReLU.apply(x, self.relu_zero)


class _NormPool2d(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, kernel_size, stride, zero_grad):
        n, c, h, w = x.shape
        columns = F.unfold(x.reshape(n * c, 1, h, w), kernel_size, stride=stride)
        norms = columns.pow(2).sum(dim=1).sqrt()
        ctx.save_for_backward(x, columns, norms)
        ctx.kernel_size, ctx.stride, ctx.zero_grad = kernel_size, stride, zero_grad
        h_out = (h - kernel_size) // stride + 1
        return norms.reshape(n, c, h_out, -1)

    @staticmethod
    def backward(ctx, grad_out):
        x, columns, norms = ctx.saved_tensors
        n, c, h, w = x.shape
        zero = norms == 0
        # x / ||x|| away from 0; at 0 any vector of the unit ball is a Clarke Jacobian.
        direction = columns / torch.where(zero, torch.ones_like(norms), norms).unsqueeze(1)
        direction = torch.where(zero.unsqueeze(1), torch.full_like(columns, ctx.zero_grad),
                                direction)
        grad = F.fold(direction * grad_out.reshape(n * c, 1, -1), (h, w), ctx.kernel_size,
                      stride=ctx.stride)
        return grad.reshape(n, c, h, w), None, None, None


class NormPool2d(nn.Module):
    """Euclidean-norm pooling; `zero_grad` is each entry's derivative at an all-zero window."""

    def __init__(self, *, kernel_size: int = 2, stride: int | None = None,
                 zero_grad: float = 0.0):
        super().__init__()
        self.kernel_size, self.stride = kernel_size, stride or kernel_size
        self.zero_grad = zero_grad

    @property
    def zero_grad(self) -> float:
        return self._zero_grad

    @zero_grad.setter
    def zero_grad(self, value: float) -> None:
        # The gradient at 0 is `value` in each of the k*k entries; a Clarke Jacobian of the
        # norm at 0 is a vector of the unit ball, so its norm |value| * k must be <= 1.
        norm = abs(float(value)) * self.kernel_size
        if norm > 1:
            raise ValueError(f"NormPool zero_grad {value} gives a gradient of norm {norm:g} "
                             f"at 0 (> 1, outside the Clarke Jacobian); need |zero_grad| <= "
                             f"{1 / self.kernel_size:g} for kernel size {self.kernel_size}")
        self._zero_grad = float(value)

    def forward(self, x):
        return _NormPool2d.apply(x, self.kernel_size, self.stride, self.zero_grad)


@dataclass(frozen=True)
class Program:
    """The nonsmooth choices of a network: MaxPool beta, ReLU'(0), NormPool'(0)."""

    beta: float = 0.0
    relu_zero: float = 0.0
    norm_zero_grad: float = 0.0


NATIVE = Program()
MINIMAL = Program(beta=1.0)
RELU_ONE = Program(relu_zero=1.0)


def set_program(network: nn.Module, program: Program) -> nn.Module:
    """Switch every nonsmooth module of `network` to `program` (same parameters)."""
    for module in network.modules():
        if isinstance(module, MaxPool2d):
            module.beta = program.beta
        elif isinstance(module, ReLU):
            module.relu_zero = program.relu_zero
        elif isinstance(module, NormPool2d):
            module.zero_grad = program.norm_zero_grad
    return network


# --- the zero programs of Section 1 / Appendix A.1 (Table 1) and A.3 (Table 3) ---------


def zero_program_derivative(t: float, x, precision: int) -> float:
    """zero'(t) for zero(t) = max_1(t x) - max_2(t x): max_1 native, max_2 minimal MaxPool
    over the 4 entries of x (Table 1). 0 over the reals; not always in floating point."""
    dtype = PRECISIONS[precision]
    t = torch.tensor(t, dtype=dtype, requires_grad=True)
    z = (t * torch.as_tensor(x, dtype=dtype)).reshape(1, 1, 1, -1)
    window = (1, z.shape[-1])  # MaxPool over the whole row is the max of the vector
    native = _MaxPool2d.apply(z, window, window, 0.0)
    minimal = _MaxPool2d.apply(z, window, window, 1.0)
    (native - minimal).sum().backward()
    return float(t.grad)


def zero2_program_derivative(t: float, x, precision: int) -> float:
    """zero_2'(t) of Appendix A.3 (Figure 9, Table 3): max of 4 entries built from ReLUs,
    max_1 with ReLU'(0)=0 everywhere, max_2 with one ReLU'(0)=1 (torch.where(x >= 0))."""
    dtype = PRECISIONS[precision]
    relu0, relu1 = ReLU(relu_zero=0.0), ReLU(relu_zero=1.0)

    def max_pair(a, b, first):
        return (a + b) / 2 + first((a - b) / 2) + relu0((b - a) / 2)

    def max_four(v, first):
        return max_pair(max_pair(v[0], v[1], first), max_pair(v[2], v[3], first), first)

    t = torch.tensor(t, dtype=dtype, requires_grad=True)
    z = t * torch.as_tensor(x, dtype=dtype)
    (max_four(z, relu0) - max_four(z, relu1)).backward()
    return float(t.grad)


ZERO_PROGRAM_T = (-1e-3, -1e-2, -1e-1, 0.0, 1e1, 1e2, 1e3)
ZERO_PROGRAM_X = {"x1": (1.0, 2.0, 3.0, 4.0), "x2": (1.4, 1.4, 1.4, 1.4)}


def zero_program_table(precisions=(16, 32, 64)):
    """Tables 1 and 3 at each precision: rows (program, x, precision, t, derivative)."""
    rows = []
    for program, function in (("zero", zero_program_derivative),
                              ("zero2", zero2_program_derivative)):
        for name, x in ZERO_PROGRAM_X.items():
            for precision in precisions:
                for t in ZERO_PROGRAM_T:
                    rows.append({"program": program, "x": name, "precision": precision,
                                 "t": t, "derivative": function(t, x, precision)})
    return rows


# --- backprop variation, thresholds, bifurcation volume --------------------------------


def minibatch_gradient(network, images, labels):
    """backprop[sum_i P_i(theta)]: the gradient of the summed loss, one flat float64
    vector over all parameters (in parameter order)."""
    network.zero_grad(set_to_none=True)
    loss = F.cross_entropy(network(images), labels, reduction="sum")
    loss.backward()
    return torch.cat([p.grad.reshape(-1).to(torch.float64) for p in network.parameters()])


def kaiming_uniform_(network: nn.Module, seed: int) -> nn.Module:
    """Random parameters theta_m as PyTorch draws them by default: Kaiming-uniform weights
    (He et al.) and uniform biases, from `seed` (Section 3.2's set-up)."""
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        with torch.no_grad():
            for module in network.modules():
                if isinstance(module, (nn.Conv2d, nn.Linear, nn.BatchNorm2d)):
                    module.reset_parameters()
    finally:
        torch.random.set_rng_state(state)
    return network


def minor_major_split(difference, magnitude, precision: int, ulps: float = 16.0):
    """Counts of parameters whose backprop differs by at most `ulps` units in the last place
    of the larger gradient (minor, compensation-type) and by more (major)."""
    eps = torch.finfo(PRECISIONS[precision]).eps
    nonzero = difference > 0
    minor = nonzero & (difference <= ulps * eps * magnitude.clamp_min(
        torch.finfo(PRECISIONS[precision]).tiny))
    return int(minor.sum()), int((nonzero & ~minor).sum())


def hoeffding_margin(n: int, alpha: float = 0.05) -> float:
    """Half-width of the Hoeffding confidence interval of a proportion over n iid draws."""
    return math.sqrt(math.log(2 / alpha) / (2 * n))


def mcdiarmid_margin(m: int, r: int, alpha: float = 0.05) -> float:
    """Half-width for the proportion of affected mini-batches over M draws x R batches."""
    return math.sqrt(0.5 * (1 / m + 1 / r) * math.log(2 / alpha))


def bifurcation_volume(variations: np.ndarray, threshold: float, alpha: float = 0.05) -> dict:
    """Eqs. 18-19 from D[m, r] (M parameter draws x R mini-batches) and a threshold tau.

    A non-finite D (a gradient overflowed, as float16 does) is counted in ``non_finite``
    and taken as in S: the two programs did not give equal finite gradients. The shares
    carry Hoeffding's margin over M draws and, for the mini-batches, McDiarmid's margin
    (Table 2's first line) and Hoeffding's over n = M*R (its second line)."""
    variations = np.asarray(variations, dtype=np.float64)
    if not np.isfinite(threshold):
        raise ValueError(f"the threshold must be finite, got {threshold}")
    m, r = variations.shape
    finite = np.isfinite(variations)
    above = ~finite | (variations > threshold)
    return {
        "threshold": threshold, "M": m, "R": r, "non_finite": int((~finite).sum()),
        "share_theta": float(above.any(axis=1).mean()),
        "share_theta_margin": hoeffding_margin(m, alpha),
        "share_batches": float(above.mean()),
        "share_batches_margin": mcdiarmid_margin(m, r, alpha),
        "share_batches_hoeffding_margin": hoeffding_margin(m * r, alpha),
    }


def tau_gpu(repeat_variations: np.ndarray) -> float:
    """tau^1 (Eq. 13): the largest finite D(P, P~) between two runs of the same program
    (non-finite repeats are counted by the caller, never turned into the threshold)."""
    values = np.asarray(repeat_variations, dtype=np.float64)
    values = values[np.isfinite(values)]
    return float(np.max(values)) if values.size else 0.0


def tau_relu(relu_variations: np.ndarray) -> float:
    """tau^2 (Eq. 14): the smallest positive finite D(R^0, R^1); inf where none is."""
    values = np.asarray(relu_variations, dtype=np.float64)
    positive = values[np.isfinite(values) & (values > 0)]
    return float(positive.min()) if positive.size else math.inf
