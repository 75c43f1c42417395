"""The measurement of one probe row: a step measured (loss, gradients, retained, carried and replayed bytes, FLOPs, peaks) and the verdicts read from it."""
