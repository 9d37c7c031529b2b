"""What evals and the fine-tunes' dev evaluations share: dataset readers and metrics."""
