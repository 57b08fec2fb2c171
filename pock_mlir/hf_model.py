"""The Hugging Face files of a transformers model that a program and its bundle carry, so that
Trainer.export_pretrained writes a directory `from_pretrained` loads (pock_mlir/runtime/export.py)."""

from __future__ import annotations

import json

from pock_mlir.runtime.export import CONFIG, GENERATION_CONFIG


def hf_files(model) -> dict[str, dict]:
    """config.json and (for a model that generates) generation_config.json as `model.save_pretrained`
    writes them, by name; empty for a model that is not a transformers PreTrainedModel."""
    config = getattr(model, "config", None)
    if not callable(getattr(config, "to_json_string", None)) or not callable(getattr(model, "save_pretrained", None)):
        return {}
    files = {CONFIG: {**json.loads(config.to_json_string(use_diff=True)), "architectures": [type(model).__name__]}}
    generation = getattr(model, "generation_config", None)
    if generation is not None and callable(getattr(model, "can_generate", None)) and model.can_generate():
        files[GENERATION_CONFIG] = json.loads(generation.to_json_string(use_diff=True))
    return files
