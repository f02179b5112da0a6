"""Builders of the embedded default pipelines (diffusers classes, tiny configs, a locally built tokenizer)."""
