"""Testbed data: the 128-token vocabulary, the KJV character filler and the needle examples.

Vocabulary (fixed; the exported tokenizer and the engine's needle evaluation depend on it):
  0        BOS  "<s>"
  1        KEY  "<KEY>"
  2..49    value tokens "<v0>".."<v47>": slot s owns ids 2 + 16*s .. 2 + 16*s + 15; slots 0 and 1
           are the values (v1 from slot 0 = ids 2..17, v2 from slot 1 = ids 18..33); slot 2
           (ids 34..49) names the keys of the multi-key needle
  50..121  the 72 characters of ALPHABET (the whitespace-collapsed KJV text), in ALPHABET order
  122..127 unused

An example of length L (exactly L token ids):
  BOS, filler[:a], KEY v1 v2, filler[a:], KEY v1 v2
with F = L - 7 filler characters (one contiguous slice of the corpus at a random offset) and the
needle depth a = round(U(0.05, 0.95) * F). The model reads ids[:-1] and predicts ids[1:].

The multi-key form (RULER's niah_multikey shape) inserts N_KEYS needles "KEY k v1 v2", each
with its own key name k (slot 2, distinct) and values (distinct per slot), at independent
random depths, and asks for one of them:
  BOS, filler with the N_KEYS needles, KEY k_q v1_q v2_q
with F = L - 1 - 4 * N_KEYS - 4 filler characters; the answer is v1_q v2_q.
"""
from __future__ import annotations

import os
import re
import subprocess

import numpy as np

VOCAB_SIZE = 128
BOS = 0
KEY = 1
VALUE_BASE = 2
VALUES_PER_SLOT = 16
N_VALUE_TOKENS = 48  # 3 slots of 16 reserved; slots 0 and 1 are used
N_SLOTS_USED = 2
CHAR_BASE = 50
# Every character of the whitespace-collapsed `bible` dump (bible-kjv), sorted by code point.
ALPHABET = (" !'(),-.0123456789:;?"
            "ABCDEFGHIJKLMNOPQRSTUVWYZ"
            "abcdefghijklmnopqrstuvwxyz")
assert len(ALPHABET) == 72 and CHAR_BASE + len(ALPHABET) <= VOCAB_SIZE
NEEDLE_LEN = 3  # KEY v1 v2
MIN_LEN = 16
N_KEYS = 4  # needles of the multi-key form (RULER's niah_multikey_1 uses 4 keys)
KEY_SLOT = 2
NEEDLE_KINDS = ("single", "multikey")

# Loss-mask classes of target positions (see example_masks).
T_FILLER, T_IGNORE, T_ANSWER = 0, 1, 2

BIBLE_SPEC = "gen1:1-rev22:21"


def value_token(slot: int, j: int) -> int:
    return VALUE_BASE + VALUES_PER_SLOT * slot + j


def token_strings() -> list[str]:
    """Token texts for the exported tokenizer (SentencePiece conventions: space is U+2581)."""
    toks = ["<s>", "<KEY>"] + [f"<v{i}>" for i in range(N_VALUE_TOKENS)]
    toks += ["\u2581" if c == " " else c for c in ALPHABET]
    toks += [f"<unused_{i}>" for i in range(VOCAB_SIZE - len(toks))]
    assert len(toks) == VOCAB_SIZE
    return toks


def token_types() -> list[int]:
    """llama.cpp token types: 3 control (BOS), 4 user-defined (KEY, values), 1 normal, 5 unused."""
    t = [3, 4] + [4] * N_VALUE_TOKENS + [1] * len(ALPHABET)
    t += [5] * (VOCAB_SIZE - len(t))
    return t


def load_kjv_text(bible_bin: str = "bible") -> str:
    """The whole KJV from the `bible` program, whitespace collapsed to single spaces."""
    try:
        out = subprocess.run([bible_bin, "-l0", BIBLE_SPEC], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True,
                             env=dict(os.environ, PAGER="cat"))
    except FileNotFoundError as e:
        raise RuntimeError("the `bible` program is missing: install Debian's bible-kjv "
                           "(scripts/setup.sh does)") from e
    text = out.stdout.decode("utf-8", errors="replace")
    text = re.sub(r"\s+", " ", text).strip()
    if len(text) < 1_000_000:
        raise RuntimeError(f"`bible {BIBLE_SPEC}` produced only {len(text)} characters")
    return text


def encode_chars(text: str) -> np.ndarray:
    """Characters -> token ids (uint8); characters outside ALPHABET are dropped."""
    lut = np.full(65536, 255, dtype=np.uint8)
    for i, c in enumerate(ALPHABET):
        lut[ord(c)] = CHAR_BASE + i
    codes = np.frombuffer(text.encode("utf-16-le"), dtype=np.uint16)
    ids = lut[codes]
    return ids[ids != 255]


def decode(ids) -> str:
    toks = token_strings()
    return "".join(" " if toks[i] == "\u2581" else toks[i] for i in ids)


class Corpus:
    """The filler stream as token ids."""

    def __init__(self, ids: np.ndarray):
        self.ids = ids

    @classmethod
    def kjv(cls) -> "Corpus":
        return cls(encode_chars(load_kjv_text()))

    @classmethod
    def synthetic(cls, seed: int = 0, n: int = 200_000) -> "Corpus":
        """Random characters; for tests where the bible program is absent."""
        rng = np.random.default_rng(seed)
        return cls((CHAR_BASE + rng.integers(0, len(ALPHABET), n)).astype(np.uint8))


def make_example(corpus: Corpus, length: int, rng: np.random.Generator,
                 depth_range=(0.05, 0.95)):
    """One needle example of exactly `length` ids. Returns (ids int64 [L], needle_pos, (v1, v2))."""
    if length < MIN_LEN:
        raise ValueError(f"example length {length} < {MIN_LEN}")
    n_fill = length - 1 - 2 * NEEDLE_LEN
    start = int(rng.integers(0, len(corpus.ids) - n_fill))
    filler = corpus.ids[start:start + n_fill].astype(np.int64)
    depth = float(rng.uniform(*depth_range))
    a = int(round(depth * n_fill))
    v1 = value_token(0, int(rng.integers(0, VALUES_PER_SLOT)))
    v2 = value_token(1, int(rng.integers(0, VALUES_PER_SLOT)))
    needle = np.array([KEY, v1, v2], dtype=np.int64)
    ids = np.concatenate([[BOS], filler[:a], needle, filler[a:], needle]).astype(np.int64)
    assert ids.shape[0] == length
    return ids, 1 + a, (v1, v2)


def make_example_multikey(corpus: Corpus, length: int, rng: np.random.Generator,
                          depth_range=(0.05, 0.95), n_keys: int = N_KEYS):
    """One multi-key example of exactly `length` ids. Returns (ids int64 [L], needle positions
    (ascending, each the position of a needle's KEY), (v1, v2) of the key asked)."""
    n_fill = length - 1 - 4 * n_keys - 4
    if n_fill < 1:
        raise ValueError(f"multi-key example length {length} leaves no filler")
    start = int(rng.integers(0, len(corpus.ids) - n_fill))
    filler = corpus.ids[start:start + n_fill].astype(np.int64)
    keys = rng.choice(VALUES_PER_SLOT, n_keys, replace=False)
    v1s = rng.choice(VALUES_PER_SLOT, n_keys, replace=False)
    v2s = rng.choice(VALUES_PER_SLOT, n_keys, replace=False)
    cuts = np.sort(np.round(rng.uniform(*depth_range, n_keys) * n_fill).astype(np.int64))
    q = int(rng.integers(0, n_keys))
    parts, pos, prev = [np.array([BOS], dtype=np.int64)], [], 0
    for i in range(n_keys):
        parts.append(filler[prev:cuts[i]])
        pos.append(sum(len(x) for x in parts))
        parts.append(np.array([KEY, value_token(KEY_SLOT, int(keys[i])),
                               value_token(0, int(v1s[i])), value_token(1, int(v2s[i]))],
                              dtype=np.int64))
        prev = int(cuts[i])
    parts.append(filler[prev:])
    answer = (value_token(0, int(v1s[q])), value_token(1, int(v2s[q])))
    parts.append(np.array([KEY, value_token(KEY_SLOT, int(keys[q])), *answer], dtype=np.int64))
    ids = np.concatenate(parts)
    assert ids.shape[0] == length
    return ids, pos, answer


def example_masks_multikey(length: int, needle_pos) -> np.ndarray:
    """As example_masks for the multi-key form: every needle's 4 tokens and the query's KEY and
    key name are ignored; the final two targets are the answer."""
    cls = np.full(length - 1, T_FILLER, dtype=np.int64)
    for p in needle_pos:
        cls[p - 1:p + 3] = T_IGNORE
    cls[length - 5:length - 3] = T_IGNORE  # targets: query KEY, query key name
    cls[length - 3:length - 1] = T_ANSWER
    return cls


def example_masks(length: int, needle_pos: int) -> np.ndarray:
    """Class of each target position t (predicting ids[t + 1] from ids[:t + 1]), shape [L - 1].

    Filler targets count in the LM loss; the needle's KEY and values and the query KEY are
    unpredictable and ignored; the final two targets (the answer v1 v2) carry the answer loss.
    """
    cls = np.full(length - 1, T_FILLER, dtype=np.int64)
    # Targets ids[needle_pos .. needle_pos + 2] (the needle) sit at t = needle_pos - 1 .. + 1.
    cls[needle_pos - 1:needle_pos + 2] = T_IGNORE
    cls[length - 4] = T_IGNORE  # target = query KEY
    cls[length - 3] = T_ANSWER  # target = v1 (read at the query KEY)
    cls[length - 2] = T_ANSWER  # target = v2
    return cls


def make_batch(corpus: Corpus, length: int, batch: int, rng: np.random.Generator,
               depth_range=(0.05, 0.95), kinds=("single",)):
    """Returns (ids int64 [B, L], classes int64 [B, L - 1]). Each example's needle kind is drawn
    uniformly from `kinds` (no draw when there is one kind, so single-kind streams are those of
    earlier runs). In both forms the answer is the last two ids, read at positions L - 3, L - 2."""
    for k in kinds:
        if k not in NEEDLE_KINDS:
            raise ValueError(f"needle kind {k!r} is not one of {', '.join(NEEDLE_KINDS)}")
    ids = np.empty((batch, length), dtype=np.int64)
    cls = np.empty((batch, length - 1), dtype=np.int64)
    for b in range(batch):
        kind = kinds[0] if len(kinds) == 1 else kinds[int(rng.integers(len(kinds)))]
        if kind == "single":
            ids[b], pos, _ = make_example(corpus, length, rng, depth_range)
            cls[b] = example_masks(length, pos)
        else:
            ids[b], pos, _ = make_example_multikey(corpus, length, rng, depth_range)
            cls[b] = example_masks_multikey(length, pos)
    return ids, cls
