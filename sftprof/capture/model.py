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
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
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


# Published architectures that `model.source: random` builds with random weights: profiling needs
# the shapes, not the trained values, so a 7B run needs no 13.5 GB download. The one table of what
# is offered: config validation, both backends and the docs read it. `hf` are LlamaConfig fields
# (from each model's published config.json); `nemo` is the nemo.collections.llm config class of
# the same model (NeMo 2.2.1), whose fields match these.
ARCHITECTURES = {
    "llama2-7b": {
        "hf": {
            "hidden_size": 4096,
            "intermediate_size": 11008,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 32,
            "vocab_size": 32000,
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
        },
        "nemo": "Llama2Config7B",
    },
    "llama2-13b": {
        "hf": {
            "hidden_size": 5120,
            "intermediate_size": 13824,
            "num_hidden_layers": 40,
            "num_attention_heads": 40,
            "num_key_value_heads": 40,
            "vocab_size": 32000,
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
        },
        "nemo": "Llama2Config13B",
    },
    "llama3-8b": {
        "hf": {
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "vocab_size": 128256,
            "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0,
        },
        "nemo": "Llama3Config8B",
    },
    # Llama 3.2 1B: the published config also has llama3 rope scaling (factor 32), left out here: it
    # changes the rotary frequencies' values, not a shape or a kernel.
    "llama3.2-1b": {
        "hf": {
            "hidden_size": 2048,
            "intermediate_size": 8192,
            "num_hidden_layers": 16,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "vocab_size": 128256,
            "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0,
            "tie_word_embeddings": True,
        },
        "nemo": "Llama32Config1B",
    },
}
MODEL_FACTS = "sftprof-model.json"


class ArchitectureError(ValueError):
    """An architecture name that ARCHITECTURES does not offer."""


def architecture(name: str) -> dict:
    try:
        return ARCHITECTURES[name]
    except KeyError:
        raise ArchitectureError(f"unknown model.architecture {name!r}; offered: {', '.join(ARCHITECTURES)}") from None


def hf_config(name: str):
    """The LlamaConfig of architecture `name`, with the byte tokenizer's special token ids (its
    ids all lie below any table vocab_size, so the model keeps the published vocabulary size)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        **{"tie_word_embeddings": False, **architecture(name)["hf"]},
        pad_token_id=SPECIAL_TOKENS["<pad>"],
        bos_token_id=SPECIAL_TOKENS["<s>"],
        eos_token_id=SPECIAL_TOKENS["</s>"],
    )


def parameter_count(name: str) -> int:
    """Parameters of LlamaForCausalLM for architecture `name`, counted on the meta device (no memory)."""
    import torch
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(hf_config(name))
    return sum(p.numel() for p in model.parameters())


def create_random_model(settings: dict, out_dir: str | Path) -> dict:
    """A model folder with an architecture and no weights: config.json, the byte tokenizer and
    sftprof-model.json saying `"weights": "random"`. Each backend builds the model from it with
    seeded random initialisation (load_model here; the NeMo backend from the `nemo` config class).
    A few kB whatever the model size; written to a sibling folder and renamed, like create_tiny_llama."""
    out_dir = Path(out_dir)
    name = settings["architecture"]
    entry = architecture(name)
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    hf_config(name).save_pretrained(tmp)
    build_byte_tokenizer().save_pretrained(tmp)
    summary = {
        "architecture": "LlamaForCausalLM",
        "weights": "random",
        "preset": name,
        "nemo_config": entry["nemo"],
        "parameters": parameter_count(name),
        "vocab_size": entry["hf"]["vocab_size"],
        "seed": settings["seed"],
    }
    (tmp / MODEL_FACTS).write_text(json.dumps(summary, indent=2))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return summary


def model_facts(model_dir: str | Path) -> dict:
    """sftprof-model.json of a folder sftprof built ({} for any other checkpoint folder)."""
    path = Path(model_dir) / MODEL_FACTS
    return json.loads(path.read_text()) if path.is_file() else {}


def is_random(model_dir: str | Path) -> bool:
    return model_facts(model_dir).get("weights") == "random"


def load_model(model_dir: str | Path, device: str, seed: int, attention: str = "sdpa"):
    """LlamaForCausalLM in float32 on `device` (the torch backend trains float32 weights; bf16 is
    autocast): the checkpoint's weights, or for a `random` folder a seeded random initialisation
    made directly on the device, so a 7B model never passes through host memory. `attention` is
    transformers' attn_implementation: `sdpa` (fused kernels) or `eager` (softmax between GEMMs)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if not is_random(model_dir):
        return LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=attention).to(
            device
        )
    config = LlamaConfig.from_pretrained(model_dir, attn_implementation=attention)
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        with torch.device(device):
            return LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
