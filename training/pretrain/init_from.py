"""Start a pretraining run from another run's weights (``--init-from DIR``).

Two-stage recipes (CLM then MLM, as AntLM or Ettin's cross-objective continuation) need the
decoder's weights in the encoder's layout or the other way round. ModernBERT's two classes share
every block; they differ in naming only: the encoder stacks the attention projections into one
``Wqkv`` and calls its prediction head ``head``, the decoder keeps ``q_proj``/``k_proj``/``v_proj``
and calls it ``lm_head``. The conversion is a rename plus a concatenation or split, exact to the
bit; transformers has no converter between the two, hence this module.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM, PreTrainedModel

from rag.models import lm_objective
from training.pretrain.config import ConfigError

_QKV = (".q_proj.", ".k_proj.", ".v_proj.")


def clm_to_mlm_state_dict(clm: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """ModernBertDecoderForCausalLM weights renamed into ModernBertForMaskedLM's layout: the
    separate q/k/v projections are stacked into ``Wqkv`` and ``lm_head`` becomes ``head``."""
    out: dict[str, torch.Tensor] = {}
    for name, t in clm.items():
        if ".attn.q_proj." in name:
            parts = [clm[name.replace(".q_proj.", p)] for p in _QKV]
            out[name.replace(".q_proj.", ".Wqkv.")] = torch.cat(parts, dim=0)  # (3*hidden, ...)
        elif ".attn.k_proj." in name or ".attn.v_proj." in name:
            continue
        elif name.startswith("lm_head."):
            out["head." + name.removeprefix("lm_head.")] = t
        else:
            out[name] = t
    return out


def mlm_to_clm_state_dict(mlm: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`clm_to_mlm_state_dict`: ``Wqkv`` split into q/k/v, ``head`` ->
    ``lm_head``."""
    out: dict[str, torch.Tensor] = {}
    for name, t in mlm.items():
        if ".attn.Wqkv." in name:
            for proj, part in zip(_QKV, t.chunk(3, dim=0), strict=True):  # 3 x (hidden, ...)
                out[name.replace(".Wqkv.", proj)] = part.clone()
        elif name.startswith("head."):
            out["lm_head." + name.removeprefix("head.")] = t
        else:
            out[name] = t
    return out


def source_objective(weights_dir: Path | str) -> str:
    """``clm`` or ``mlm``: which kind of model a saved folder holds (from its config)."""
    try:
        cfg = AutoConfig.from_pretrained(weights_dir)
    except (OSError, ValueError) as e:
        raise ConfigError(f"--init-from {weights_dir}: not a saved model folder ({e})") from None
    if objective := lm_objective(cfg):
        return objective
    raise ConfigError(
        f"--init-from {weights_dir}: architectures {cfg.architectures} are neither MLM nor CLM"
    )


def load_initial_weights(model: PreTrainedModel, weights_dir: Path | str, objective: str) -> str:
    """Copy the weights saved in ``weights_dir`` into ``model`` (built for ``objective``),
    converting between layouts when the objectives differ; returns the source's objective.

    Every tensor must be matched with the same shape, so a folder of another preset or
    tokenizer is an error naming both, never a silent partial initialisation.
    """
    src = source_objective(weights_dir)
    cls = AutoModelForCausalLM if src == "clm" else AutoModelForMaskedLM
    state = cls.from_pretrained(weights_dir, dtype=torch.float32).state_dict()
    if src == "clm" and objective == "mlm":
        state = clm_to_mlm_state_dict(state)
    elif src == "mlm" and objective == "clm":
        state = mlm_to_clm_state_dict(state)
    own = model.state_dict()
    shapes = [
        f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}"
        for k, v in state.items()
        if k in own and v.shape != own[k].shape
    ]
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if shapes or missing or unexpected:
        raise ConfigError(
            f"--init-from {weights_dir} ({src}) does not fit this {objective} model: "
            f"shape mismatches {shapes[:3]}, missing {missing[:3]}, unexpected {unexpected[:3]} "
            "(use the same --preset and --tokenizer as the run that saved it)"
        )
    model.load_state_dict(state, strict=True)
    return src
