#!/usr/bin/env python3
"""Writes the small synthetic tokenizer.json fixtures under testdata/tokenizer/fixtures/.

They cover what the three real tokenizers (Llama 3, Qwen3, DeepSeek V3: all byte-level BPE)
do not: a Unigram model with byte fallback (Metaspace), a SentencePiece-style BPE with byte
fallback and the Llama 2 / Mistral normalizer (Prepend + Replace), and a Kimi-K2-style Split
regex (Han excluded from the letter classes) over byte-level BPE. Vocabularies and merges are
learned here, deterministically, from the corpus text plus a short English paragraph, so the
fixtures are small (a few hundred pieces) and every corpus string exercises unknown characters.

    python3 tools/ref/make_fixtures.py && .venv/bin/python tools/ref/make_refs.py

Only the standard library is used.
"""
import collections
import json
import math
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
OUT = os.path.join(ROOT, "testdata", "tokenizer", "fixtures")
SP = "\u2581"  # SentencePiece's word marker

PARAGRAPH = (
    "The quick brown fox jumps over the lazy dog. Tokenizers split text into pieces; the "
    "model sees only their ids. A good tokenizer keeps common words whole and spells rare "
    "ones from smaller pieces, down to single bytes when nothing else fits. Hello world, "
    "hello there: this is a test of the tokenizer and of the reference that checks it. "
)


def training_text():
    with open(os.path.join(ROOT, "testdata", "tokenizer", "corpus.json"), encoding="utf-8") as f:
        corpus = json.load(f)
    texts = [s["text"] for s in corpus["strings"] if "text" in s]
    return [PARAGRAPH * 3] + texts


def added(id_, content, special=True, normalized=False):
    return {"id": id_, "content": content, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": normalized, "special": special}


def byte_pieces():
    return ["<0x%02X>" % b for b in range(256)]


def learn_merges(words, base, n_merges):
    """Plain BPE training: words are tuples of symbols with counts; ties go to the smallest pair."""
    vocab = list(base)
    known = set(vocab)
    words = {w: c for w, c in words.items()}
    merges = []
    for _ in range(n_merges):
        pairs = collections.Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], tuple(-ord(ch) for ch in kv[0][0] + " " + kv[0][1])))
        (a, b), count = best
        if count < 2:
            break
        merges.append((a, b))
        if a + b not in known:
            known.add(a + b)
            vocab.append(a + b)
        new_words = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new_words[tuple(out)] = new_words.get(tuple(out), 0) + c
        words = new_words
    return vocab, merges


def spm_words(texts):
    """Words as SentencePiece sees them after Prepend(U+2581) + Replace(' ', U+2581)."""
    words = collections.Counter()
    for t in texts:
        s = SP + t.replace(" ", SP)
        for w in re.findall(SP + "?[^" + SP + "]+|" + SP, s):
            words[w] += 1
    return words


def write(name, tokenizer, config):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", os.path.relpath(d, ROOT), file=sys.stderr)


def spm_decoder():
    return {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": SP}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}


def make_spm_bpe(texts):
    words = spm_words(texts)
    chars = collections.Counter()
    for w, c in words.items():
        for ch in w:
            chars[ch] += c
    # Characters seen at least 3 times are base pieces; the rest go through byte fallback.
    base = sorted(ch for ch, c in chars.items() if c >= 3)
    specials = ["<unk>", "<s>", "</s>"]
    vocab, merges = learn_merges({tuple(w): c for w, c in words.items()
                                  if all(ch in base for ch in w)}, base, 300)
    pieces = specials + byte_pieces() + vocab
    tok = {
        "version": "1.0",
        "truncation": None, "padding": None,
        "added_tokens": [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": SP},
            {"type": "Replace", "pattern": {"String": " "}, "content": SP}]},
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "<s>", "type_id": 1}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": spm_decoder(),
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": {p: i for i, p in enumerate(pieces)},
                  "merges": [a + " " + b for a, b in merges]},
    }
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
              "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
              "add_eos_token": False, "clean_up_tokenization_spaces": False}
    write("spm_bpe_bf", tok, config)


def make_unigram(texts):
    # Candidate pieces: substrings (up to 6 characters) of the words, U+2581 only in front (so
    # HF's Metaspace split and a split-less implementation segment alike), scored by log freq.
    words = spm_words(texts)
    counts = collections.Counter()
    for w, c in words.items():
        for i in range(len(w)):
            for j in range(i + 1, min(len(w), i + 6) + 1):
                sub = w[i:j]
                if SP in sub[1:]:
                    continue
                counts[sub] += c
    chosen = [p for p, c in counts.items() if c >= 4 and (len(p) > 1 or c >= 6)]
    chosen = sorted(set(chosen) | {SP})
    total = sum(counts[p] for p in chosen)
    scored = sorted(((p, math.log(counts[p] / total) - 0.5 * (len(p) == 1)) for p in chosen),
                    key=lambda ps: (-ps[1], ps[0]))
    vocab = ([["<unk>", 0.0], ["<s>", 0.0], ["</s>", 0.0]] + [[b, 0.0] for b in byte_pieces()]
             + [[p, round(s, 6)] for p, s in scored])
    tok = {
        "version": "1.0",
        "truncation": None, "padding": None,
        "added_tokens": [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")],
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": SP, "add_prefix_space": True,
                          "prepend_scheme": "always", "split": True},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "</s>", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "</s>", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 0}},
                     {"SpecialToken": {"id": "</s>", "type_id": 0}}],
            "special_tokens": {"</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}}},
        "decoder": spm_decoder(),
        "model": {"type": "Unigram", "unk_id": 0, "byte_fallback": True, "vocab": vocab},
    }
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>",
              "unk_token": "<unk>", "clean_up_tokenization_spaces": False}
    write("unigram_bf", tok, config)


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


# Kimi K2's pre-tokenizer regex, as io/pretokenizer_types.cc spells it for kimi-k2 (PCRE2 and
# JavaScript both read \p{Script=Han} and the lookahead form of its class intersections).
CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
UPPER = r"(?:(?!\p{Script=Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])"
LOWER = r"(?:(?!\p{Script=Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}])"
KIMI = (r"\p{Script=Han}+|[^\r\n\p{L}\p{N}]?" + UPPER + "*" + LOWER + "+" + CONTRACTIONS +
        r"?|[^\r\n\p{L}\p{N}]?" + UPPER + "+" + LOWER + "*" + CONTRACTIONS +
        r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def make_kimi(texts):
    b2u = bytes_to_unicode()
    words = collections.Counter()
    for t in texts:
        for w in re.findall(r" ?\w+| ?[^\w\s]+|\s+", t):
            words[tuple(b2u[b] for b in w.encode("utf-8"))] += 1
    base = [b2u[b] for b in range(256)]
    vocab, merges = learn_merges(words, base, 400)
    specials = ["[BOS]", "[EOS]", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|im_end|>"]
    n = len(vocab)
    added_tokens = [added(n + i, s) for i, s in enumerate(specials)]
    added_tokens.append(added(n + len(specials), "<tool_call>", special=False))
    tok = {
        "version": "1.0",
        "truncation": None, "padding": None,
        "added_tokens": added_tokens,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": KIMI}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "[BOS]", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "[BOS]", "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"[BOS]": {"id": "[BOS]", "ids": [n], "tokens": ["[BOS]"]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {p: i for i, p in enumerate(vocab)},
                  "merges": [[a, b] for a, b in merges]},
    }
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "[BOS]",
              "eos_token": "[EOS]", "add_bos_token": True, "clean_up_tokenization_spaces": False,
              "chat_template": None}
    write("kimi_style", tok, config)


def main():
    texts = training_text()
    make_unigram(texts)
    make_spm_bpe(texts)
    make_kimi(texts)


if __name__ == "__main__":
    main()
