"""The tiny Hugging Face LLaMA that tests/test_lora.py and tests/test_export_pretrained.py train
(width 32, 2 layers, tied embeddings), its next-token loss and its sizes."""

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")  # in the dev extras; a test module of these skips without

VOCAB, SEQ = 61, 12


def next_token_loss(out, y):
    return F.cross_entropy(out.logits.flatten(0, 1), y.flatten())


def llama():
    """The model, seeded: each call returns the same weights."""
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=32,
            tie_word_embeddings=True,
        )
    )
