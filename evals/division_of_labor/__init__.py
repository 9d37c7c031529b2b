"""The division-of-labour experiment: is MLM better for retrieval and CLM for generation?

Every row shares the backbone (a training/pretrain/config.py preset), the pretraining corpus, the
tokenizer and the token budget (steps x batch x sequence length); only the objective differs:

- ``mlm15``: MLM, 15% of tokens, 80/10/10 mask/random/keep (BERT);
- ``mlm30``: MLM, 30% of tokens, mask-only;
- ``mlm40``: MLM, 40% of tokens, mask-only (Wettig et al. 2023);
- ``clm``: CLM (next token);
- ``clm2mlm``: CLM for the first ``clm_fraction`` of the steps, then MLM 15% 80/10/10 from the
  converted CLM weights for the rest (two-stage);
- ``antlm``: CLM and MLM 15% 80/10/10 steps alternating on the same weights, ending on MLM;
- ``prefixlm``: bidirectional over a prefix, causal over the rest, loss on the suffix.
  These two save an encoder and a decoder layout of the same weights (training.pretrain.objectives).

Columns, each after the identical downstream recipe:

- retrieval: contrastive fine-tune with the same pairs and steps (mean pooling for all rows,
  last-token pooling too for CLM) -> nDCG@10 on the SciFact dev split and the SQuAD dev articles;
- generation: bits per byte of left-to-right prediction on WikiText-2 validation (the decoder
  layout where a row has one; MLM rows predict a mask appended after the prefix; see evals.lm);
- grounded QA (decoders only): identical LoRA -> EM/F1 and citation accuracy, SQuAD dev articles;
- reading: identical span-head fine-tune (training.finetune.reader) -> EM/F1 on the SQuAD dev articles'
  gold paragraphs; the CLM reads causally (``clm-causal``, training.finetune.decoder_qa) and converted to
  the encoder layout (``clm-bidir``);
- baselines: BM25 and ``minilm`` (retrieval), ``smollm2`` zero-shot and LoRA (generation, QA).

Every cell is cached as ``DIR/cells/<name>.json``; rerunning skips finished cells, so an
interrupted run resumes where it stopped. Output: ``results.json``, ``results.md`` (mean ± std
over seeds), bar charts per column and the pretraining loss curves (see
evals.division_of_labor.report).

Modules: ``presets`` (rows, sizes, the run configuration), ``data`` (paths and the two dev
sets), ``steps`` (every call into training), ``columns`` (how one model is scored), ``cells``
(the result cache), ``experiment`` (the grid), ``compare`` and ``report`` (tables and charts),
``run`` (the command line, also ``python -m evals.division_of_labor``).

CLI::

    python -m evals.division_of_labor --preset tiny --out artifacts/evals/dol-tiny
    python -m evals.division_of_labor --preset small --seeds 0 1 --out artifacts/evals/dol-small
"""
