"""The perplexity corpus: a fixed public-domain English prose text, cleaned deterministically.

The default text is the pinned artifact ``artifacts.CORPUS``: the article "Shakespeare, William" of
the Encyclopaedia Britannica, 11th edition (1911), as OCR text. ``--corpus PATH`` replaces it with
any plain-text file; the same cleaning applies.

Cleaning (pure function of the text, no randomness):

1. drop the transcription's markdown headers (lines starting with ``#``: ``## ...``,
   ``### START: ED4A800_0.tif.txt ###``, ``#### Source: ...``);
2. drop page markers (lines like ``p.772:0``);
3. join words hyphenated across a line break (``South-\\nampton`` -> ``Southampton``);
4. collapse every run of whitespace (newlines included) to one space.

Held-out tokens: the first ``HELD_OUT + 1`` tokens of the cleaned text (the opening of the article,
continuous biography prose; its end is an OCR-damaged bibliography, which is avoided), tokenized
without special tokens. The first token is context only, so exactly ``HELD_OUT`` tokens are predicted.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from . import artifacts

#: Tokens whose prediction is scored.
HELD_OUT = 2_048

_HEADER = re.compile(r"^\s*#.*$", re.MULTILINE)
_PAGE = re.compile(r"^\s*p\.\d+:\d+\s*$", re.MULTILINE)
_HYPHEN_BREAK = re.compile(r"(\w)-[ \t]*\n[ \t]*(\w)")
_SPACE = re.compile(r"\s+")


def clean(text: str) -> str:
    """The cleaned corpus text (see the module docstring for the four rules)."""
    text = text.replace("\r\n", "\n")
    text = _HEADER.sub("", text)
    text = _PAGE.sub("", text)
    text = _HYPHEN_BREAK.sub(r"\1\2", text)
    return _SPACE.sub(" ", text).strip()


def raw_text(path: str | Path | None = None) -> str:
    """The uncleaned text: ``path`` if given, else the pinned artifact (fetched and hash-checked)."""
    source = Path(path).expanduser() if path else artifacts.fetch(artifacts.CORPUS)
    return source.read_text(encoding="utf-8")


def check_file(path: str | Path) -> None:
    """ValueError, one line, unless ``path`` is a UTF-8 text file long enough for perplexity.

    Long enough is checked here in bytes of cleaned text: a token of a byte-level tokenizer covers
    at least one byte, so fewer than ``HELD_OUT + 1`` bytes can never give ``HELD_OUT + 1`` tokens.
    The exact count depends on the tokenizer and is checked where the text is tokenized (:func:`held_out_ids`).
    """
    from .files import kind_of

    p = Path(path).expanduser()
    if not p.is_file():  # the real cause: a directory, a FIFO or /dev/null is not "no such file"
        found = f"it is {kind_of(p)}" if p.exists() and kind_of(p) else "there is no such file"
        raise ValueError(f"--corpus {path}: expected a plain-text file of English prose, but {found}")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"--corpus {path}: not UTF-8 text (byte {exc.start:,}: {exc.reason}); convert it to UTF-8") from None
    except OSError as exc:
        raise ValueError(f"--corpus {path}: cannot be read ({exc.strerror or exc})") from None
    size = len(clean(text).encode("utf-8"))
    if size < HELD_OUT + 1:
        raise ValueError(
            f"--corpus {path}: too short: {size:,} bytes of text after cleaning; perplexity scores {HELD_OUT:,} tokens "
            f"and needs at least {HELD_OUT + 1:,} tokens (a few pages of prose)"
        )


def describe(path: str | Path | None = None) -> str:
    """Where the corpus came from, for the report."""
    return str(path) if path else f"{artifacts.CORPUS.requirement}: {artifacts.CORPUS.description}"


def held_out_ids(tokenizer, text: str, n: int = HELD_OUT) -> torch.Tensor:
    """The first ``n + 1`` token ids of ``text`` (already cleaned), as a 1-D long tensor ``[n + 1]``."""
    ids = tokenizer(text, add_special_tokens=False, return_attention_mask=False)["input_ids"]
    if len(ids) < n + 1:
        raise ValueError(f"the corpus has {len(ids):,} tokens under this tokenizer; perplexity needs at least {n + 1:,}")
    return torch.tensor(ids[: n + 1], dtype=torch.long)
