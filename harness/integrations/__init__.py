"""Callbacks that put `harness.Run` into the trainers people use: `hf.HarnessCallback`
(Hugging Face `transformers.Trainer`; extra `[hf]`) and `lightning.HarnessCallback` (Lightning;
extra `[lightning]`). accelerate needs none: its loop is the user's own (docs/own-job.md).
Importing this package imports neither framework."""
