"""Byte-level tokenizer: every UTF-8 byte is a token, plus four special tokens.

No vocabulary file and no merges: token id == byte value for ids 0..255, so any
text round-trips and a reader can decode ids by eye with an ASCII table.
"""

from __future__ import annotations

PAD = 256  # filler in padded training batches; never produced by the model
BOS = 257  # beginning of a sequence
EOS = 258  # end of a reply: generation stops here
SEP = 259  # end of the prompt, start of the reply
VOCAB_SIZE = 260
SPECIAL_NAMES = {PAD: "<pad>", BOS: "<bos>", EOS: "<eos>", SEP: "<sep>"}


def encode(text: str) -> list[int]:
    """Text -> byte ids (no specials)."""
    return list(text.encode("utf-8"))


def decode(ids: list[int]) -> str:
    """Byte ids -> text. Special ids are dropped; invalid UTF-8 becomes U+FFFD, never an error."""
    return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


def encode_prompt(prompt: str, preamble: str | None = None) -> list[int]:
    """The chat format the model was trained on: <bos> prompt <sep>, or <bos> preamble <sep>
    prompt <sep>. The preamble (a system prompt the model learned to ignore) comes first, so
    requests that share it share a token prefix a prefix cache can reuse; SEP ends it, which no
    text can contain. An empty preamble counts as none."""
    if not preamble:
        return [BOS, *encode(prompt), SEP]
    return [BOS, *encode(preamble), SEP, *encode(prompt), SEP]


def token_str(token_id: int) -> str:
    """A printable label for one token, e.g. for a table in a lesson."""
    if token_id in SPECIAL_NAMES:
        return SPECIAL_NAMES[token_id]
    char = bytes([token_id]).decode("latin-1")
    return char if char.isprintable() else f"\\x{token_id:02x}"
