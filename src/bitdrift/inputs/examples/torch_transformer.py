"""A small attention encoder in PyTorch over token sequences (batch, tokens, features),
exported with ``torch.export`` and saved by ``torch.export.save`` (``.pt2``): one
transformer block (Linear projections of queries, keys and values on the 3-D activations,
multi-head attention as batched matmuls ``Q @ K^T`` and ``softmax @ V``, the output
projection, residual and LayerNorm, a GELU feed-forward, LayerNorm), then the tokens'
mean and a Linear classifier; seeded weights, eval mode. ``causal=True`` makes it a
decoder block (each token attends to itself and the tokens before it). Its inputs: seeded
normal samples of shape (samples, 8, 32), float32. bitdrift.inputs.examples.onnx_transformer
is the same module exported to ONNX."""

from __future__ import annotations

import numpy as np

TOKENS, FEATURES, HEADS, HIDDEN, CLASSES = 8, 32, 4, 64, 10
INPUT_SHAPE = (TOKENS, FEATURES)
SUFFIX = ".pt2"


def build_module(seed: int = 0, causal: bool = False, traced_shapes: bool = False):
    """The torch.nn.Module, eval mode: a transformer block (encoder, or a decoder block
    with ``causal``), the tokens' mean, a Linear classifier. The heads are split by a
    reshape to (-1, tokens, heads, features per head); ``traced_shapes``: to the batch and
    tokens read from the input's shape, as much transformer code writes it (exported to
    ONNX, a Reshape fed by Shape, Gather and Concat nodes, whose result only ONNX's data
    propagation knows; litert-torch refuses the data-dependent reshape onnx2torch makes
    of it)."""
    import torch
    from torch import nn

    class Attention(nn.Module):
        """Multi-head self-attention written out, as transformer code usually has it: its
        two matmuls are functions inside this module, not modules of their own."""

        def __init__(self):
            super().__init__()
            self.query, self.key, self.value, self.out = (
                nn.Linear(FEATURES, FEATURES) for _ in range(4))
            # the causal mask: token i sees tokens 0..i (a constant of the program)
            self.register_buffer("mask", torch.triu(torch.ones(TOKENS, TOKENS, dtype=torch.bool),
                                                    diagonal=1) if causal else None)

        def forward(self, x):
            batch, tokens = x.shape[:2] if traced_shapes else (-1, TOKENS)

            def heads(values):  # (batch, heads, tokens, features per head)
                return values.reshape(batch, tokens, HEADS, FEATURES // HEADS).transpose(1, 2)

            query, key, value = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
            scores = query @ key.transpose(-2, -1) / (FEATURES // HEADS) ** 0.5
            if self.mask is not None:
                scores = scores.masked_fill(self.mask, float("-inf"))
            attended = torch.softmax(scores, dim=-1) @ value
            return self.out(attended.transpose(1, 2).reshape(batch, tokens, FEATURES))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = Attention()
            self.norm1 = nn.LayerNorm(FEATURES)
            self.expand = nn.Linear(FEATURES, HIDDEN)
            self.gelu = nn.GELU()
            self.contract = nn.Linear(HIDDEN, FEATURES)
            self.norm2 = nn.LayerNorm(FEATURES)

        def forward(self, x):
            x = self.norm1(x + self.attention(x))
            return self.norm2(x + self.contract(self.gelu(self.expand(x))))

    class Transformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()
            self.classifier = nn.Linear(FEATURES, CLASSES)

        def forward(self, x):
            return self.classifier(self.block(x).mean(dim=1))

    torch.manual_seed(seed)
    return Transformer().eval()


def export(module, batch: int = 2):
    """The module's torch.export program, the batch axis dynamic (a device sets its batch
    size); ``batch`` is the example batch traced."""
    import torch

    example = torch.zeros((max(batch, 2), *INPUT_SHAPE))
    return torch.export.export(module, (example,),
                               dynamic_shapes=({0: torch.export.Dim("batch", max=1024)},))


def make_inputs(samples: int = 16, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(
        (samples, *INPUT_SHAPE)).astype(np.float32)


def write(model_path, inputs_path, samples: int = 16, seed: int = 0, causal: bool = False,
          traced_shapes: bool = False) -> None:
    """The program (torch.export.save) and its inputs, each written atomically."""
    import torch

    from bitdrift.atomic import atomic_output

    with atomic_output(model_path) as partial:
        torch.export.save(export(build_module(seed, causal, traced_shapes)), str(partial))
    with atomic_output(inputs_path) as partial:
        with open(partial, "wb") as handle:
            np.save(handle, make_inputs(samples))
