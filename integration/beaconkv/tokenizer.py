"""Character-level tokenizer of the tiny reasoner, in Hugging Face ``tokenizers`` format.

The model directory ships one tokenizer description, read by everyone (this module through the
``tokenizers`` library, ``transformers.AutoTokenizer``, vLLM, and the C++ engine's
``CharTokenizer``):

- ``tokenizer.json``: a ``WordLevel`` model whose vocabulary maps each character (and the
  special tokens ``<pad>``, ``<bos>``, ``<eos>``) to its id; a ``Split`` pre-tokenizer that
  isolates every character; a ``TemplateProcessing`` post-processor that prepends ``<bos>``;
  a ``Fuse`` decoder (no spaces between characters).
- ``tokenizer_config.json`` and ``generation_config.json`` (``eos_token_id`` = the ``<eos>`` id).

A sequence given to the model is ``[bos_id] + encode(prompt + generated)``; generation stops at
``eos_id``.
"""

from __future__ import annotations

import json
import os

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

SPECIALS = ["<pad>", "<bos>", "<eos>"]


def _is_special(tok: str) -> bool:
    return len(tok) >= 2 and tok.startswith("<") and tok.endswith(">")


def build_hf_tokenizer(vocab: list[str], bos_id: int) -> Tokenizer:
    """The ``tokenizers`` object for a character vocabulary (token id i is ``vocab[i]``)."""
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    bos = vocab[bos_id]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, bos_id)])
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in vocab if _is_special(t)])
    return tok


class CharTokenizer:
    """One id per character; ``hf`` is the underlying ``tokenizers.Tokenizer``."""

    def __init__(self, vocab: list[str], pad_id: int, bos_id: int, eos_id: int):
        for i, tok in enumerate(vocab):
            if not (len(tok) == 1 or _is_special(tok)):
                raise ValueError(f"vocab entry {i} ({tok!r}) is neither one character nor <special>")
        if len(set(vocab)) != len(vocab):
            raise ValueError("vocab has duplicate entries")
        for name, idx in (("pad_id", pad_id), ("bos_id", bos_id), ("eos_id", eos_id)):
            if not 0 <= idx < len(vocab):
                raise ValueError(f"{name}={idx} is outside the vocabulary of {len(vocab)} entries")
        self.vocab = list(vocab)
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self._chars = {tok for tok in vocab if len(tok) == 1}
        self.hf = build_hf_tokenizer(self.vocab, bos_id)

    @classmethod
    def from_chars(cls, chars: str) -> "CharTokenizer":
        return cls(SPECIALS + sorted(set(chars)), 0, 1, 2)

    @classmethod
    def load(cls, path: str) -> "CharTokenizer":
        """Read an HF ``tokenizer.json`` (a character ``WordLevel`` model), or the one inside a
        model directory. Special ids are those of ``<pad>``, ``<bos>`` and ``<eos>``."""
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        model = data.get("model") if isinstance(data, dict) else None
        kind = model.get("type") if isinstance(model, dict) else None
        if kind != "WordLevel":
            raise ValueError(f"{path}: field 'model.type' is {kind!r}, expected 'WordLevel' "
                             "(a character-level Hugging Face tokenizer)")
        vocab_map = model.get("vocab")
        if not isinstance(vocab_map, dict) or not vocab_map:
            raise ValueError(f"{path}: field 'model.vocab' must be a non-empty map")
        ids = sorted(vocab_map.values())
        if ids != list(range(len(ids))):
            raise ValueError(f"{path}: field 'model.vocab' ids must be 0..{len(ids) - 1}")
        vocab = [""] * len(ids)
        for t, i in vocab_map.items():
            vocab[i] = t
        special = {}
        for name in SPECIALS:
            if name not in vocab_map:
                raise ValueError(f"{path}: field 'model.vocab' has no {name!r} entry")
            special[name] = vocab_map[name]
        return cls(vocab, special["<pad>"], special["<bos>"], special["<eos>"])

    def save(self, path: str) -> None:
        """Write ``tokenizer.json`` (HF format) to `path`."""
        self.hf.save(path, pretty=True)

    def save_pretrained(self, model_dir: str) -> None:
        """Write ``tokenizer.json``, ``tokenizer_config.json`` and ``generation_config.json``."""
        os.makedirs(model_dir, exist_ok=True)
        self.save(os.path.join(model_dir, "tokenizer.json"))
        names = {"pad_token": self.vocab[self.pad_id], "bos_token": self.vocab[self.bos_id],
                 "eos_token": self.vocab[self.eos_id]}
        config = {"tokenizer_class": "PreTrainedTokenizerFast", **names,
                  "clean_up_tokenization_spaces": False, "model_max_length": 2048}
        gen = {"bos_token_id": self.bos_id, "eos_token_id": self.eos_id,
               "pad_token_id": self.pad_id}
        for name, obj in (("tokenizer_config.json", config), ("generation_config.json", gen)):
            with open(os.path.join(model_dir, name), "w", encoding="utf-8") as f:
                json.dump(obj, f, indent=1)
                f.write("\n")

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        """One id per character, no ``<bos>``; special-token text is not recognised."""
        for ch in text:
            if ch not in self._chars:
                raise ValueError(f"character {ch!r} is not in the vocabulary")
        return self.hf.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`; special tokens are dropped."""
        return self.hf.decode(list(ids), skip_special_tokens=True)
