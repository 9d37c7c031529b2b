"""One precision vocabulary for every model that runs at query or ingest time: the encoder
(``rag.ingest --precision``), the reranker (``--rerank-precision``) and the decoder
(``--decoder-precision``), each ``fp32 | bf16 | int8 | auto``, with the same meaning:

- ``fp32``: float32 weights;
- ``bf16``: the weights cast to bfloat16 (:func:`to_bf16`): fast on CUDA and on CPUs with
  AMX / AVX512-BF16 units, emulated and slower elsewhere; the same embeddings within float
  tolerance (docs/ingestion.md);
- ``int8``: int8 Linear weights, CPU only. The encoder and the reranker quantise their
  transformer whole (:func:`quantize_dynamic_int8`); the decoder keeps float weights for the
  prompt (prefill, scoring: compute-bound, where bf16 wins) in its ``auto`` precision and gains
  int8 copies for the one-token decode steps (:mod:`rag.generate.int8_linear`, memory-bound);
- ``auto``: ``bf16`` where :func:`bf16_is_fast` on the device the model runs on, else ``fp32``
  (:func:`resolve_precision`); never ``int8``, whose answers differ measurably. The encoder's
  ``auto`` (ingest, evals) asks more: on a CPU with bf16 units it takes bf16 only where a short
  probe measured it faster on this machine (:func:`encoder_auto_precision`): AVX512-BF16
  without AMX (some AMD EPYC) speeds the decoder's prefill but not every encoder shape.

Nothing here imports torch at module level, so the config and every CLI can read the
vocabulary for free; the conversions import it when they run.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rag.storage.paths import cache_dir

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


def _cpuinfo() -> str:
    """/proc/cpuinfo's text ("" where there is none)."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_has_bf16() -> bool:
    """True when the CPU has bf16 matrix units (AMX or AVX512-BF16), where bf16 prefill is
    several times faster than fp32 (measured in docs/answering.md)."""
    flags = _cpuinfo()
    return "amx_bf16" in flags or "avx512_bf16" in flags


def cpu_has_amx() -> bool:
    """True when the CPU has AMX tiles (the Intel Xeon kind; the OpenVINO engine's ``auto``
    precision differs there: :func:`rag.generate.ov_engine.inference_precision`)."""
    return "amx_tile" in _cpuinfo()


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


# ---------------------------------------------------------------------------- the encoder's auto

MIN_BF16_SPEEDUP = 1.1  # the probe must measure bf16 at least this much faster than fp32
PROBE_FORMAT = 1  # bump when the probe's workload changes (older results are then re-measured)


def time_precisions(
    run: Callable[[str], Any],
    precisions: tuple[str, ...] = FLOAT_PRECISIONS,
    repeats: int = 3,
    timer: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """Median seconds of ``run(precision)`` for each of ``precisions``, after one untimed call
    each (warm-up: first-call allocations, kernel selection); the timed calls alternate
    (fp32, bf16, fp32, ...) so a change of machine load hits both alike."""
    for p in precisions:
        run(p)
    seconds: dict[str, list[float]] = {p: [] for p in precisions}
    for _ in range(repeats):
        for p in precisions:
            t0 = timer()
            run(p)
            seconds[p].append(timer() - t0)
    return {p: statistics.median(v) for p, v in seconds.items()}


def choose_by_speed(seconds: dict[str, float], min_speedup: float = MIN_BF16_SPEEDUP) -> str:
    """``bf16`` when it took at most ``1 / min_speedup`` of fp32's time, else ``fp32`` (a tie or
    a small win is not worth bf16's rounding)."""
    return "bf16" if seconds["bf16"] * min_speedup <= seconds["fp32"] else "fp32"


def encoder_layer_workload(tokens: int = 128, batch: int = 8) -> Callable[[str], None]:
    """One forward pass of a MiniLM-sized transformer layer (384 wide, 12 heads, 1,536 feed-
    forward) over ``batch`` x ``tokens``, in fp32 or with bf16 weights: the shape an encoder
    runs at ingest and in the evals. Built once; each call runs the given precision."""
    import torch

    torch.manual_seed(0)
    layers = {"fp32": torch.nn.TransformerEncoderLayer(384, 12, 1536, batch_first=True).eval()}
    layers["bf16"] = torch.nn.TransformerEncoderLayer(384, 12, 1536, batch_first=True).eval()
    layers["bf16"].load_state_dict(layers["fp32"].state_dict())
    layers["bf16"].to(torch.bfloat16)
    x = torch.randn(batch, tokens, 384)
    inputs = {"fp32": x, "bf16": x.to(torch.bfloat16)}

    def run(precision: str) -> None:
        with torch.inference_mode():
            layers[precision](inputs[precision])

    return run


def probe_key() -> dict[str, Any]:
    """What the probe's answer depends on: the CPU (model, bf16 units), torch, its threads."""
    import torch

    info = _cpuinfo()
    model = next(
        (ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), ""
    )
    flags = next(
        (ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), []
    )
    return {
        "format": PROBE_FORMAT,
        "cpu": model,
        "bf16_units": sorted(f for f in flags if f in ("amx_bf16", "avx512_bf16")),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def bf16_probe(
    run: Callable[[str], Any] | None = None,
    timer: Callable[[], float] = time.perf_counter,
    key: dict[str, Any] | None = None,
    folder: Path | None = None,
) -> dict[str, Any]:
    """Whether bf16 is faster than fp32 for an encoder on this CPU: measured once per machine
    (:func:`probe_key`) with :func:`encoder_layer_workload` (about a second) and cached as
    ``$RAG_HOME/cache/bf16-probe-<key>.json``; ``{"seconds", "speedup", "choice", "key",
    "cached"}``. ``run``, ``timer``, ``key`` and ``folder`` are for tests."""
    key = probe_key() if key is None else key
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = (cache_dir() if folder is None else folder) / f"bf16-probe-{name}.json"
    try:
        stored = json.loads(path.read_text())
        if stored.get("key") == key and stored.get("choice") in FLOAT_PRECISIONS:
            return {**stored, "cached": True}
    except (OSError, ValueError):
        pass
    seconds = time_precisions(run or encoder_layer_workload(), timer=timer)
    result = {
        "key": key,
        "seconds": {p: round(v, 6) for p, v in seconds.items()},
        "speedup": round(seconds["fp32"] / seconds["bf16"], 3) if seconds["bf16"] > 0 else None,
        "choice": choose_by_speed(seconds),
        "min_speedup": MIN_BF16_SPEEDUP,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(result, f, indent=2)
    os.replace(tmp, path)
    return {**result, "cached": False}


def encoder_auto_precision(
    device: str, probe: Callable[[], dict[str, Any]] = bf16_probe
) -> tuple[str, str]:
    """An encoder's ``auto`` and why: ``bf16`` on CUDA; ``fp32`` on a CPU without bf16 units; on
    one with them, what :func:`bf16_probe` measured faster on this machine."""
    if device == "cuda":
        return "bf16", "CUDA"
    if not cpu_has_bf16():
        return "fp32", "no bf16 units on this CPU"
    r = probe()
    return r["choice"], (
        f"probe on this CPU: bf16 {r['speedup']}x fp32's speed, bf16 wanted >= "
        f"{r.get('min_speedup', MIN_BF16_SPEEDUP)}x"
    )


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
    units. Why a cast and not ``torch.autocast``: the cast ran faster than autocast with the same
    embeddings (docs/ingestion.md)."""
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
