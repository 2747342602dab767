"""Character-level tokenizer of the tiny reasoner.

File format (``tokenizer.json``), chosen so that a C++ reader needs no JSON library features
beyond arrays of strings and integers::

    {
      "format": "beaconkv-char-v1",
      "vocab": ["<pad>", "<bos>", "<eos>", "\\n", "#", "+", ...],
      "pad_id": 0,
      "bos_id": 1,
      "eos_id": 2
    }

Token id i is ``vocab[i]``. Entries of the form ``<...>`` are special tokens, every other entry
is exactly one character. Encoding maps each character of the text to its id (no merges);
a sequence given to the model is ``[bos_id] + encode(prompt + generated)``, and generation
stops at ``eos_id``.
"""

from __future__ import annotations

import json
import os

FORMAT = "beaconkv-char-v1"
SPECIALS = ["<pad>", "<bos>", "<eos>"]


class CharTokenizer:
    def __init__(self, vocab: list[str], pad_id: int, bos_id: int, eos_id: int):
        for i, tok in enumerate(vocab):
            if not (len(tok) == 1 or (tok.startswith("<") and tok.endswith(">"))):
                raise ValueError(f"vocab entry {i} ({tok!r}) is neither one character nor <special>")
        if len(set(vocab)) != len(vocab):
            raise ValueError("vocab has duplicate entries")
        for name, idx in (("pad_id", pad_id), ("bos_id", bos_id), ("eos_id", eos_id)):
            if not 0 <= idx < len(vocab):
                raise ValueError(f"{name}={idx} is outside the vocabulary of {len(vocab)} entries")
        self.vocab = list(vocab)
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self._ids = {tok: i for i, tok in enumerate(vocab) if len(tok) == 1}

    @classmethod
    def from_chars(cls, chars: str) -> "CharTokenizer":
        return cls(SPECIALS + sorted(set(chars)), 0, 1, 2)

    @classmethod
    def load(cls, path: str) -> "CharTokenizer":
        """Read a tokenizer file, or the ``tokenizer.json`` inside a model directory."""
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if data.get("format") != FORMAT:
            raise ValueError(f"{path}: field 'format' is {data.get('format')!r}, "
                             f"expected {FORMAT!r}")
        for key in ("vocab", "pad_id", "bos_id", "eos_id"):
            if key not in data:
                raise ValueError(f"{path}: missing field {key!r}")
        return cls(data["vocab"], data["pad_id"], data["bos_id"], data["eos_id"])

    def save(self, path: str) -> None:
        data = {"format": FORMAT, "vocab": self.vocab, "pad_id": self.pad_id,
                "bos_id": self.bos_id, "eos_id": self.eos_id}
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
            f.write("\n")

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        try:
            return [self._ids[ch] for ch in text]
        except KeyError as e:
            raise ValueError(f"character {e.args[0]!r} is not in the vocabulary") from None

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`; special tokens are dropped."""
        return "".join(self.vocab[i] for i in ids if len(self.vocab[i]) == 1)
