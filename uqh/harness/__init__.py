"""The write path: build a run, run its episodes through a model, write the run directory."""
