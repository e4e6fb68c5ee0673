"""Builds a tiny, randomly initialised Llama with a byte-level BPE tokenizer, offline.

Usage: python make_tiny_model.py OUT_DIR

The tokenizer is trained on local text (the Python standard library's sources), so no hub access
is needed. Special tokens: <|begin_of_text|> (0, BOS, prepended by the post-processor),
<|end_of_text|> (1, EOS), <|pad|> (2). The chat template renders `<|role|>content\n` per message
and `<|assistant|>` as the generation prompt.
"""

import json
import os
import pathlib
import sys
import sysconfig

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"]


def corpus():
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("*.py"))[:300]
    for f in files:
        try:
            yield f.read_text(encoding="utf-8", errors="ignore")
        except OSError:
            continue
    yield "You are a careful assistant. Tell me about caching. " * 50


def build_tokenizer(out: pathlib.Path):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=4096,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A",
        pair="<|begin_of_text|> $A $B",
        special_tokens=[("<|begin_of_text|>", 0)],
    )
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "backend": "tokenizers",
                "bos_token": SPECIALS[0],
                "eos_token": SPECIALS[1],
                "pad_token": SPECIALS[2],
                "model_max_length": 2048,
                "tokenizer_class": "PreTrainedTokenizerFast",
            },
            indent=2,
        )
    )
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)


def build_model(out: pathlib.Path):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(str(out))


def main():
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    build_tokenizer(out)
    build_model(out)
    print(f"tiny model written to {out}")


if __name__ == "__main__":
    main()
