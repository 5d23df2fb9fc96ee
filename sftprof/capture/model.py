"""A tiny Llama-architecture checkpoint in Hugging Face layout, built offline.

It stands in for Llama 2 7B: same architecture class (LlamaForCausalLM), same on-disk layout
(config.json, model.safetensors, tokenizer.json), so the trainer loads either the same way.
The tokenizer is byte-level (256 byte tokens plus specials): it needs no training corpus and
no download, and covers any UTF-8 text.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

SPECIAL_TOKENS = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}


def build_byte_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    vocab = dict(SPECIAL_TOKENS)
    for symbol in sorted(ByteLevel.alphabet()):
        vocab[symbol] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>",
    )


def create_tiny_llama(settings: dict, out_dir: str | Path) -> dict:
    """Write a seeded, randomly initialised LlamaForCausalLM and its tokenizer to `out_dir`.

    Written into a temporary sibling folder and renamed at the end, so an interrupted run
    leaves no folder that passes for a checkpoint.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out_dir = Path(out_dir)
    tokenizer = build_byte_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=settings["hidden_size"],
        intermediate_size=settings["intermediate_size"],
        num_hidden_layers=settings["num_layers"],
        num_attention_heads=settings["num_heads"],
        num_key_value_heads=settings["num_kv_heads"],
        max_position_embeddings=settings["max_position_embeddings"],
        pad_token_id=SPECIAL_TOKENS["<pad>"],
        bos_token_id=SPECIAL_TOKENS["<s>"],
        eos_token_id=SPECIAL_TOKENS["</s>"],
        tie_word_embeddings=False,
    )
    torch.manual_seed(settings["seed"])
    model = LlamaForCausalLM(config)
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    summary = {
        "architecture": "LlamaForCausalLM",
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": config.vocab_size,
        "settings": settings,
    }
    (tmp / "sftprof-model.json").write_text(json.dumps(summary, indent=2))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return summary
