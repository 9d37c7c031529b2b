"""Model presets and the pretraining configuration.

One preset describes one backbone; the MLM encoder and the CLM decoder are built from the same
preset, so the attention mask and the objective are the only differences between them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

from training.defaults import default_corpus, default_out


@dataclass(frozen=True)
class ModelPreset:
    """Backbone size plus the training defaults that suit it."""

    name: str
    num_hidden_layers: int  # transformer blocks
    hidden_size: int  # residual width
    num_attention_heads: int  # heads per attention layer (hidden_size divisible by it)
    intermediate_size: int  # GLU inner width (Wi projects to 2x this)
    max_position_embeddings: int  # longest sequence the rotary tables are built for
    local_attention: int  # sliding-window size of the local-attention layers
    global_attn_every_n_layers: int  # every n-th layer attends globally
    max_vocab: int  # largest tokenizer vocabulary this preset accepts
    seq_len: int  # default training sequence length
    batch_size: int  # default sequences per step (per process)
    lr: float  # default peak learning rate
    tokenizer_vocab: int = 8192  # vocabulary of the tokenizer trained for a run that names none


PRESETS: dict[str, ModelPreset] = {
    # tests: seconds on one CPU core
    "tiny": ModelPreset("tiny", 2, 64, 2, 128, 1024, 64, 2, 8192, 128, 8, 3e-3),
    # CPU: ~5M backbone params; its time budget per objective: docs/pretraining.md#presets
    "small": ModelPreset("small", 4, 256, 4, 512, 2048, 128, 3, 32768, 256, 16, 1.5e-3),
    # GPU: 12 x 512, ~50M params with a 16k vocabulary
    "base": ModelPreset("base", 12, 512, 8, 1536, 8192, 128, 3, 65536, 512, 64, 6e-4, 16384),
}


# mlm: bidirectional encoder; clm: causal decoder; antlm: CLM and MLM steps alternating on one
# set of weights; prefixlm: bidirectional over a prefix, causal over the rest
# (training.pretrain.objectives)
OBJECTIVES = ("mlm", "clm", "antlm", "prefixlm")
# the model class each objective trains: the encoder layout (ModernBertForMaskedLM) for every
# objective that has bidirectional steps, the decoder layout (ModernBertDecoderForCausalLM) for clm
LAYOUT = {"mlm": "mlm", "clm": "clm", "antlm": "mlm", "prefixlm": "mlm"}
# objectives whose encoder-layout weights were also trained causally: their run saves a decoder
# copy in <out>/decoder as well (training.pretrain.export.save_decoder_copy)
WITH_DECODER = ("antlm", "prefixlm")
DECODER_SUBDIR = "decoder"
SCHEDULES = ("steps", "time")  # what the lr decay follows
MASK_STRATEGIES = ("80-10-10", "mask-only")


class ConfigError(ValueError):
    """A flag value that cannot work; the message names the flag and the value."""


def get_preset(name: str) -> ModelPreset:
    if name not in PRESETS:
        raise ConfigError(f"--preset {name!r} is unknown; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


@dataclass
class PretrainConfig:
    """Everything one pretraining run needs; saved as run.json beside the model."""

    objective: str = "mlm"  # mlm (encoder), clm (decoder), antlm (CLM/MLM alternating), prefixlm
    preset: str = "tiny"  # tiny | small | base (training/pretrain/config.py PRESETS)
    corpus: list[str] = field(default_factory=list)  # folders/files read through rag.documents
    out: str = ""  # output folder (HF model + logs + checkpoints)
    tokenizer: str = ""  # tokenizer folder (empty: chosen, or trained, by training/defaults.py)
    max_steps: int = 1000  # optimizer steps (the lr schedule spans these)
    max_minutes: float = 0.0  # stop early after this wall time (0 = no limit); run still saved
    schedule: str = "steps"  # lr decay follows steps, or time (needs --max-minutes)
    seq_len: int = 0  # tokens per packed sequence (0 = preset default)
    batch_size: int = 0  # sequences per step per process (0 = preset default)
    lr: float = 0.0  # peak learning rate (0 = preset default)
    min_lr_ratio: float = 0.1  # cosine decays to lr * this
    warmup_steps: int = -1  # linear warm-up steps (-1 = 5% of max_steps, at least 1)
    weight_decay: float = 0.01  # AdamW decoupled weight decay (not on norms/biases)
    grad_clip: float = 1.0  # clip the global grad norm to this (0 = off)
    mask_rate: float = 0.30  # MLM: fraction of tokens to predict, in (0, 1)
    mask_strategy: str = "80-10-10"  # MLM: 80-10-10 (mask/random/keep) or mask-only
    whole_word_mask: bool = False  # MLM: mask all tokens of a chosen word together
    # antlm: steps per CLM or MLM block (1 = switch every step); blocks count back from the last
    # step, so the run ends on MLM (--mask-rate / --mask-strategy set its MLM steps)
    alternate_every: int = 1
    sparse_prediction: bool = True  # MLM: project to the vocabulary only at masked positions
    heldout_fraction: float = 0.05  # share of files held out (at least one file)
    eval_every: int = 50  # steps between held-out evaluations (0 = only start and end)
    eval_batches: int = 8  # batches in each held-out evaluation (fixed windows and masks)
    save_every: int = 100  # steps between checkpoints (0 = only at the end)
    log_every: int = 10  # steps between train_log.jsonl lines
    seed: int = 0  # split, init, data order and masks all derive from it
    device: str = "auto"  # auto | cpu | cuda
    # torch.compile the model; unset (the default): on a CUDA GPU, where the compiled graph's
    # fused kernels give most of the speed (docs/benchmarks.md), not on a CPU, where compiling
    # takes minutes and gains little
    compile: bool | None = None
    threads: int = 0  # CPU threads for torch (0 = leave torch's default)
    init_from: str = ""  # start from this saved model's weights (MLM or CLM; converted as needed)
    resume: bool = False  # continue from the checkpoint in --out
    overwrite: bool = False  # delete a previous run in --out first

    # value sets: the CLI's argparse choices (rag.cli.flags) and resolved()'s checks
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        "objective": OBJECTIVES,
        "preset": tuple(PRESETS),
        "schedule": SCHEDULES,
        "mask_strategy": MASK_STRATEGIES,
    }

    def compiles(self, device: str) -> bool:
        """Whether the run is compiled on ``device`` (``cuda``, ``cuda:1``, ``cpu``): ``--compile``
        or ``--no-compile`` where given, else on CUDA only."""
        return self.compile if self.compile is not None else device.startswith("cuda")

    def resolved(self) -> PretrainConfig:
        """Fill preset defaults and validate; raises ConfigError naming the bad flag."""
        p = get_preset(self.preset)
        if self.objective not in OBJECTIVES:
            raise ConfigError(
                f"--objective must be one of {', '.join(OBJECTIVES)}, not {self.objective!r}"
            )
        if self.alternate_every < 1:
            raise ConfigError(f"--alternate-every must be >= 1, got {self.alternate_every}")
        if not 0.0 < self.mask_rate < 1.0:
            raise ConfigError(f"--mask-rate must be in (0, 1), got {self.mask_rate}")
        if self.mask_strategy not in MASK_STRATEGIES:
            raise ConfigError(
                f"--mask-strategy must be 80-10-10 or mask-only, not {self.mask_strategy!r}"
            )
        if self.resume and self.overwrite:
            raise ConfigError("--resume and --overwrite exclude each other")
        if self.init_from and not Path(self.init_from).is_dir():
            raise ConfigError(f"--init-from {self.init_from}: no such folder")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"--schedule must be steps or time, not {self.schedule!r}")
        if self.schedule == "time" and self.max_minutes <= 0:
            raise ConfigError("--schedule time needs --max-minutes > 0")
        if self.max_steps < 1:
            raise ConfigError(f"--max-steps must be >= 1, got {self.max_steps}")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ConfigError(f"--heldout-fraction must be in (0, 1), got {self.heldout_fraction}")
        c = PretrainConfig(**asdict(self))
        c.seq_len = c.seq_len or p.seq_len
        c.batch_size = c.batch_size or p.batch_size
        c.lr = c.lr or p.lr
        if c.warmup_steps < 0:
            c.warmup_steps = max(1, c.max_steps // 20)
        if c.seq_len < 8 or c.seq_len > p.max_position_embeddings:
            raise ConfigError(
                f"--seq-len {c.seq_len} does not fit preset {p.name} (8..{p.max_position_embeddings})"
            )
        if c.batch_size < 1:
            raise ConfigError(f"--batch-size must be >= 1, got {c.batch_size}")
        # an empty corpus / out means "the default" (training/defaults.py); an empty tokenizer is
        # left for pretrain() to choose, because choosing may mean training one
        c.corpus = [str(x) for x in c.corpus] or default_corpus()
        c.out = str(Path(c.out)) if c.out else default_out(c.objective, c.preset)
        return c
