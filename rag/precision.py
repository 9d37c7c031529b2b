"""One precision vocabulary for every model that runs at query or ingest time: the encoder
(``rag.ingest --precision``), the reranker (``--rerank-precision``) and the decoder
(``--decoder-precision``), each ``fp32 | bf16 | int8 | auto``, with the same meaning:

- ``fp32``: float32 weights;
- ``bf16``: the weights cast to bfloat16 (:func:`to_bf16`): fast on CUDA and on CPUs with
  AMX / AVX512-BF16 units, emulated and slower elsewhere; cosine >= 0.9999 to fp32 on minilm;
- ``int8``: int8 Linear weights, CPU only. The encoder and the reranker quantise their
  transformer whole (:func:`quantize_dynamic_int8`); the decoder keeps float weights for the
  prompt (prefill, scoring: compute-bound, where bf16 wins) in its ``auto`` precision and gains
  int8 copies for the one-token decode steps (:mod:`rag.generate.int8_linear`, memory-bound);
- ``auto``: ``bf16`` where :func:`bf16_is_fast` on the device the model runs on, else ``fp32``
  (:func:`resolve_precision`); never ``int8``, whose answers differ measurably.

Nothing here imports torch at module level, so the config and every CLI can read the
vocabulary for free; the conversions import it when they run.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import torch

PRECISIONS = ("fp32", "bf16", "int8")  # what a model runs in once loaded
PRECISION_SETTINGS = ("auto", *PRECISIONS)  # what a setting may say (auto resolved at load)
FLOAT_PRECISIONS = ("fp32", "bf16")  # the float weights (the decoder's prefill with int8)
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
ModuleT = TypeVar("ModuleT", bound="torch.nn.Module")


def check_precision(precision: str, flag: str = "--precision") -> str:
    """``precision`` when it is one of :data:`PRECISION_SETTINGS`, else ValueError naming
    ``flag``."""
    if precision not in PRECISION_SETTINGS:
        raise ValueError(
            f"{flag} must be one of {', '.join(PRECISION_SETTINGS)}, not {precision!r}"
        )
    return precision


def cpu_has_bf16() -> bool:
    """True when the CPU has bf16 matrix units (AMX or AVX512-BF16), where bf16 decoding is
    several times faster than fp32 (prefill 43 -> 529 tokens/s for Qwen 0.5B on 2 cores)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def bf16_is_fast(device: str) -> bool:
    """Whether bf16 weights run fast on ``device`` (a resolved ``cpu`` or ``cuda``): on CUDA, or
    a CPU with bf16 units. What every ``auto`` precision decides by."""
    return device == "cuda" or cpu_has_bf16()


def resolve_precision(precision: str, device: str) -> str:
    """``auto`` → ``bf16`` where :func:`bf16_is_fast`, else ``fp32``; any other value is
    returned as given (checked). ``device`` is a resolved device (``cpu`` or ``cuda``)."""
    if check_precision(precision) != "auto":
        return precision
    return "bf16" if bf16_is_fast(device) else "fp32"


def float_precision(precision: str, device: str) -> str:
    """The float weights a decoder of ``precision`` loads in: ``fp32`` or ``bf16`` as given,
    else (``auto``, and ``int8``, whose prompt runs on the float weights) the ``auto`` choice."""
    return precision if precision in FLOAT_PRECISIONS else resolve_precision("auto", device)


def torch_dtype(precision: str) -> Any:
    """The torch dtype of a float precision (``fp32`` → ``torch.float32``, ``bf16`` →
    ``torch.bfloat16``)."""
    import torch

    if precision not in TORCH_DTYPES:
        raise ValueError(f"no torch dtype for precision {precision!r} (fp32 or bf16)")
    return getattr(torch, TORCH_DTYPES[precision])


def to_bf16(model: ModuleT) -> ModuleT:
    """Cast the weights to bfloat16, in place (``model.to``), warning on a CPU without bf16
    units. Why a cast and not ``torch.autocast``: measured on minilm, 2 cores with AMX, the cast
    runs 120 chunks/s against autocast's 101 (fp32: 40), with the same cosine (>= 0.9999)."""
    import warnings

    import torch

    device = next(model.parameters()).device
    if device.type == "cpu" and not cpu_has_bf16():
        warnings.warn(
            "precision bf16 on a CPU without AMX-BF16/AVX512-BF16 units is emulated and "
            "slower than fp32; use fp32 or int8 here",
            stacklevel=2,
        )
    return model.to(torch.bfloat16)


def quantize_dynamic_int8(model: ModuleT) -> ModuleT:
    """Dynamic int8 quantisation (CPU only), in place, of a whole encoder: a SentenceTransformer
    or a cross-encoder's transformer (:class:`rag.retrieval.rerank.CrossEncoderReranker`). int8
    weights with per-output-channel scales, activations quantised on the fly, for every Linear
    layer except the feed-forward down-projections (in_features > out_features) of the last
    third of the layers. Those read GELU outputs whose outliers a per-tensor activation scale
    clips, and errors there reach the embedding (or score) unrepaired. On all-MiniLM-L6-v2
    (SciFact dev nDCG@10 vs fp32): every layer int8 -0.007; all down-projections fp32 -0.0016;
    the last third fp32 (this recipe) -0.0021 and faster (benchmarks/ingest_throughput.py).

    Not the decoder's int8 (:func:`rag.generate.int8_linear.add_int8_decode_layers`): a
    quantised call's result depends on the other tokens in it, which batching and the prefix
    cache cannot allow."""
    import math
    import warnings

    import torch
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    if any(p.device.type != "cpu" for p in model.parameters()):
        raise ValueError("int8 dynamic quantisation runs on CPU only; use --device cpu")
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    down = [n for n, m in linears if m.in_features > m.out_features]
    keep_fp32 = set(down[len(down) - math.ceil(len(down) / 3) :]) if down else set()
    spec = {n: per_channel_dynamic_qconfig for n, _ in linears if n not in keep_fp32}
    with warnings.catch_warnings():  # torch.ao's deprecation notices, once per layer
        warnings.simplefilter("ignore")
        return quantize_dynamic(model, spec, inplace=True)
