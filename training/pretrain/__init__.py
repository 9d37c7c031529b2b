"""Pretraining the MLM encoder and the CLM decoder from scratch (docs/pretraining.md).

``python -m training.pretrain`` runs the CLI (:mod:`training.pretrain.train`). The modules, in
the order a run uses them: :mod:`~training.pretrain.config` (presets and the run's settings),
:mod:`~training.pretrain.corpus` (documents to packed token windows),
:mod:`~training.pretrain.model` (the paired ModernBERT encoder and decoder),
:mod:`~training.pretrain.masking` and :mod:`~training.pretrain.objectives` (what each step sees
and predicts), :mod:`~training.pretrain.step` (one optimizer step),
:mod:`~training.pretrain.checkpoint` (exact resume), :mod:`~training.pretrain.init_from`
(starting from another run's weights) and :mod:`~training.pretrain.export` (the folders every
consumer loads).

Nothing is imported here, so ``import training.pretrain.config`` stays light.
"""
