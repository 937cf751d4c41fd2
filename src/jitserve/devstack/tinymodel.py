"""A tiny LlamaForCausalLM checkpoint folder for a CPU vLLM (owner: sidecar).

Used by ``jitserve up`` and the sidecar's integration tests: nothing is downloaded. The
folder holds a small Llama ``config.json`` and a byte-level BPE tokenizer trained here
with the ``tokenizers`` library on a built-in corpus; vLLM starts it with
``--load-format dummy`` (random weights), so the text is gibberish but every engine path
(prefill, decode, streaming, priority scheduling, prefix caching, aborts) is real.

This module needs only the standard library at import time; :func:`make_tiny_model`
imports ``tokenizers``, which the vLLM environment always has. It can run as a script
with any interpreter that has ``tokenizers``::

    python tinymodel.py OUT_DIR
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODEL_NAME = "tiny-llama"
VOCAB_SIZE = 1024
MAX_MODEL_LEN = 4096
_MARKER = "jitserve-tiny-model.json"
_VERSION = 2

_SPECIAL = ("<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>")

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

_WORD_TEXT = """
the a an of to in and or for with on by at from as is are was were be been it this that
model token tokens request requests deadline latency goodput scheduler frame batch queue
tenant policy service level objective time first between end stream streaming prompt
output input length bound quantile analyzer sidecar operator cluster pod replica vllm
priority preempt resume cache prefix memory gpu cpu engine decode prefill step steps
hello world please write summarize explain answer question code python function data
number one two three four five six seven eight nine ten hundred thousand fast slow good
bad high low more less every each some many few first last next previous user assistant
system message chat completion text word sentence paragraph story poem
"""
_WORDS = _WORD_TEXT.split()


def _corpus(lines: int = 3000) -> list[str]:
    """A deterministic pseudo-English corpus (a linear congruential generator, no RNG
    state shared with anything else) plus digits and punctuation."""
    state = 12345
    out: list[str] = []
    for i in range(lines):
        words = []
        for _ in range(8 + i % 9):
            state = (1103515245 * state + 12345) % (2**31)
            words.append(_WORDS[state % len(_WORDS)])
        sentence = " ".join(words).capitalize()
        out.append(f"{sentence}, {i} {i * 7 % 1000}. {sentence.upper()[:12]}?! (x={i % 97})")
    return out


def llama_config(vocab_size: int) -> dict[str, object]:
    """vLLM's CPU attention needs head_dim in {32, 64, 80, ...}: 4 heads x 32."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_MODEL_LEN,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "vocab_size": vocab_size,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    }


def is_tiny_model(path: str | Path) -> bool:
    marker = Path(path) / _MARKER
    try:
        return int(json.loads(marker.read_text()).get("version", 0)) == _VERSION
    except (OSError, ValueError):
        return False


def make_tiny_model(out_dir: str | Path) -> Path:
    """Create (or keep, when already complete) the tiny model folder; returns its path."""
    out = Path(out_dir)
    if is_tiny_model(out):
        return out
    return install_model_folder(out, _write_model)


def install_model_folder(out: Path, build: Callable[[Path], None]) -> Path:
    """``build`` the folder's files in a new folder beside ``out``, mark it complete and
    rename it to ``out``: a reader (a vLLM loading the tokenizer) sees no folder or a
    whole one, never a file being rewritten. When several build at once (pytest-xdist
    workers on a fresh cache), the first rename wins and the others discard their copy;
    an incomplete or older folder in the way is set aside first."""
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.build-", dir=out.parent))
    try:
        work.chmod(0o755)  # as a plain mkdir made it, not mkdtemp's owner-only 0700
        build(work)
        (work / _MARKER).write_text(json.dumps({"version": _VERSION, "name": MODEL_NAME}))
        for _ in range(3):
            try:
                os.rename(work, out)  # fails while out is a folder that is not empty
                return out
            except OSError:
                if is_tiny_model(out):  # another builder won
                    return out
                _set_aside(out)
        raise RuntimeError(f"cannot install the tiny model folder at {out}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _set_aside(folder: Path) -> None:
    aside = folder.parent / f".{folder.name}.stale-{uuid.uuid4().hex}"
    try:
        os.rename(folder, aside)
    except FileNotFoundError:  # another builder set it aside
        return
    shutil.rmtree(aside, ignore_errors=True)


def _write_model(out: Path) -> None:
    tk: Any = importlib.import_module("tokenizers")
    Tokenizer, decoders, models = tk.Tokenizer, tk.decoders, tk.models
    pre_tokenizers, trainers = tk.pre_tokenizers, tk.trainers
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(_SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    for index, token in enumerate(_SPECIAL[:3]):
        if tokenizer.token_to_id(token) != index:
            raise RuntimeError(f"special token {token} did not get id {index}")
    tokenizer.save(str(out / "tokenizer.json"))
    vocab_size = tokenizer.get_vocab_size()
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_MODEL_LEN,
        "chat_template": CHAT_TEMPLATE,
    }, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, indent=2))
    (out / "config.json").write_text(json.dumps(llama_config(vocab_size), indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": 2}, indent=2))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: tinymodel.py OUT_DIR", file=sys.stderr)
        sys.exit(2)
    print(make_tiny_model(sys.argv[1]))
