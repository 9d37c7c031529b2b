"""Encoder backends: run the encoder's transformer under ONNX Runtime instead of torch.

Why not sentence-transformers' own ``backend="onnx"``: it loads through ``optimum-onnx``, whose
only release pins ``transformers<4.58`` while this project needs transformers 5, so installing it
would break the environment. We keep sentence-transformers for everything around the
transformer (tokenizer, prompts, pooling, normalisation) and swap only its inner model for an
ONNX Runtime session: the graph is exported once with ``torch.onnx.export`` (optionally
int8-quantised with onnxruntime's dynamic quantiser) and cached under
``$RAG_HOME/onnx/<weights fingerprint>-<precision>/``, never beside the model's own files (the
weights fingerprint hashes ``*.onnx`` files in the model folder, so a cache there would change
the encoder's identity). OpenVINO is not offered: ``optimum-intel`` has the same transformers
pin, and the plain ``openvino`` runtime was left out to keep the install small.

The exported model computes the same function as the torch weights (cosine >= 0.999 per
embedding, tests/test_encoder_backends.py), so an index keeps the source weights' fingerprint
whichever backend built or queries it; the manifest records the backend only for information
(docs/ingestion.md, "Encoder backends").
"""

from __future__ import annotations

import inspect
import json
import math
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rag.storage.paths import rag_home

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

ONNX_FILE = "model.onnx"
OPSET = 17


def onnx_cache_root() -> Path:
    """Where exported encoders live: an artefact folder, rebuilt on demand when deleted."""
    return rag_home() / "onnx"


def _input_names(model: SentenceTransformer) -> list[str]:
    """The tokenizer outputs the transformer's forward accepts (e.g. BERT's three, ModernBERT's
    two), in the order the exported graph takes them."""
    features = model[0].preprocess(["probe text"])
    params = inspect.signature(model[0].model.forward).parameters
    return [
        k
        for k in ("input_ids", "attention_mask", "token_type_ids")
        if k in features and k in params
    ]


class _Traced(torch.nn.Module):
    """What torch.onnx traces: positional inputs in, the last hidden state out."""

    def __init__(self, hf_model: Any, names: list[str]) -> None:
        super().__init__()
        self.inner, self.names = hf_model, names

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.inner(**dict(zip(self.names, args)), return_dict=True).last_hidden_state


def down_projections_to_keep(onnx_model: Any) -> list[str]:
    """MatMul nodes to leave in fp32: the last third of the feed-forward down-projections (weight
    ``[in, out]`` with in > out), the same recipe and reason as :func:`rag.models.precision.quantize_dynamic_int8`
    (their GELU inputs have outliers a per-tensor activation scale clips)."""
    from onnx import numpy_helper

    weights = {i.name: numpy_helper.to_array(i).shape for i in onnx_model.graph.initializer}
    down = [
        n.name
        for n in onnx_model.graph.node
        if n.op_type == "MatMul"
        and len(weights.get(n.input[1], ())) == 2
        and weights[n.input[1]][0] > weights[n.input[1]][1]
    ]
    return down[len(down) - math.ceil(len(down) / 3) :] if down else []


def export_onnx(model: SentenceTransformer, fingerprint: str, precision: str) -> Path:
    """The cached ONNX export of ``model``'s transformer (exported on first use) in ``precision``
    (as the encoder resolved it: ``fp32`` or ``int8``). The folder is written aside and renamed
    into place, so a crash never leaves a half-written cache entry."""
    folder = onnx_cache_root() / f"{fingerprint}-{precision}"
    if (folder / ONNX_FILE).exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        names = _input_names(model)
        sample = model[0].preprocess(["a short probe", "a somewhat longer probe sentence here"])
        args = tuple(sample[k].to("cpu") for k in names)
        axes = {k: {0: "batch", 1: "tokens"} for k in [*names, "last_hidden_state"]}
        fp32 = tmp / ("fp32.onnx" if precision == "int8" else ONNX_FILE)
        wrapper = _Traced(model[0].model, names).eval()
        with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
            warnings.simplefilter("ignore")  # tracer warnings about Python-side branches
            torch.onnx.export(
                wrapper,
                args,
                str(fp32),
                dynamo=False,  # the TorchScript exporter: no onnxscript rewrite, dynamic axes
                input_names=names,
                output_names=["last_hidden_state"],
                dynamic_axes=axes,
                opset_version=OPSET,
            )
        if precision == "int8":
            import onnx
            from onnxruntime.quantization import QuantType, quantize_dynamic

            keep = down_projections_to_keep(onnx.load(str(fp32)))
            quantize_dynamic(
                str(fp32),
                str(tmp / ONNX_FILE),
                weight_type=QuantType.QInt8,
                per_channel=True,
                nodes_to_exclude=keep,
            )
            fp32.unlink()
        meta = {
            "fingerprint": fingerprint,
            "precision": precision,
            "inputs": names,
            "opset": OPSET,
            "torch": torch.__version__,
        }
        (tmp / "export.json").write_text(json.dumps(meta, indent=1))
        try:
            os.rename(tmp, folder)
        except OSError:  # another process exported it meanwhile: use theirs
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


class OrtModel(torch.nn.Module):
    """Stands in for the Hugging Face model inside sentence-transformers' Transformer module:
    same ``config``, a ``forward`` that runs the ONNX session and returns
    ``{"last_hidden_state": tensor}``, which the module's pooling and normalisation then use."""

    def __init__(self, folder: Path, config: Any, threads: int | None = None):
        import onnxruntime as ort

        super().__init__()
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads or torch.get_num_threads()
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(
            str(folder / ONNX_FILE), opts, providers=["CPUExecutionProvider"]
        )
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.config = config
        self.device = torch.device("cpu")
        self.folder = folder

    def forward(self, **features: Any) -> dict[str, Any]:
        feed = {k: np.asarray(features[k].cpu().numpy(), dtype=np.int64) for k in self.inputs}
        (hidden,) = self.session.run(["last_hidden_state"], feed)
        return {"last_hidden_state": torch.from_numpy(hidden)}


def use_onnx(model: SentenceTransformer, fingerprint: str, precision: str) -> SentenceTransformer:
    """Swap ``model``'s transformer for the cached ONNX export (exported now if missing). The
    torch weights are dropped afterwards: the session holds its own copy."""
    if model.device.type != "cpu":
        raise ValueError("--encoder-backend onnx runs on CPU only; use --device cpu")
    folder = export_onnx(model, fingerprint, precision)
    module = model[0]
    module.model = OrtModel(folder, module.model.config)
    return model
