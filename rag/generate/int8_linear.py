"""int8 decode steps for a causal LM: each ``nn.Linear`` keeps its float weights for prefill and
gains an int8 copy for one-token calls (``decoder_precision = "int8"``, :mod:`rag.models.precision`,
applied by :mod:`rag.generate.speed`).

Why a layer of our own rather than ``torch.ao.quantization.quantize_dynamic`` on the model: a
decode step reads every weight to produce one token, so int8 weights (a quarter of float32, half
of bf16) make it faster on CPU, while prefill is compute-bound, where bf16 units win (the
measurements: docs/benchmarks.md, *Decode variants*). And torch's dynamic
int8 kernel quantises its input with *one scale per call*: run on a whole prompt or a batch, a
token's result would depend on the other tokens in the call, and the prefix cache (prefix
prefilled alone vs with the question) and batching (rows alone vs together) would stop being
exact. So the int8 kernel gets only calls of one token per sequence, one sequence per call.
The int8 copy is built by ``torch.ao``'s own converter (per-output-channel symmetric weights).
Its kernel takes float32 activations: bf16 ones are cast for it and the result cast back.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn


class Int8DecodeLinear(nn.Linear):
    """An ``nn.Linear`` sharing another's parameters (tied embeddings stay tied), whose calls
    with one token per sequence run ``self.int8``, one sequence at a time."""

    int8: nn.Module

    @classmethod
    def wrap(cls, linear: nn.Linear) -> Int8DecodeLinear:
        try:
            from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear
            from torch.ao.quantization import per_channel_dynamic_qconfig
        except ImportError as e:  # removed in a later torch: torchao's quantize_ replaces it
            raise ImportError(
                f"this torch ({torch.__version__}) has no torch.ao dynamic quantisation"
            ) from e
        with torch.no_grad():
            plain = nn.Linear(linear.in_features, linear.out_features, linear.bias is not None)
            plain.weight.copy_(linear.weight.float())
            if linear.bias is not None:
                plain.bias.copy_(linear.bias.float())
        plain.qconfig = per_channel_dynamic_qconfig
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.weight, new.bias = linear.weight, linear.bias
        with warnings.catch_warnings():  # torch.ao's deprecation notices, once per layer
            warnings.simplefilter("ignore")
            new.int8 = DynamicInt8Linear.from_float(plain)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 2 or x.shape[-2] != 1:  # prefill, scoring: several tokens, float weights
            return super().forward(x)
        rows = x.reshape(-1, 1, x.shape[-1]).float()  # [B, 1, in]: each sequence its own scale
        out = self.int8(rows[0]) if len(rows) == 1 else torch.cat([self.int8(r) for r in rows])
        return out.reshape(*x.shape[:-1], -1).to(x.dtype)


def add_int8_decode_layers(model: Any) -> Any:
    """``model`` with every plain ``nn.Linear`` swapped for an :class:`Int8DecodeLinear`
    (in place; a second call does nothing). Not the encoders' whole-model quantisation
    (:func:`rag.models.precision.quantize_dynamic_int8`): the float weights stay for every call of
    more than one token."""
    if getattr(model, "_rag_int8", False):
        return model
    found = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear
    ]
    for parent, name, child in found:
        setattr(parent, name, Int8DecodeLinear.wrap(child))
    model._rag_int8 = True
    return model
