#!/usr/bin/env python3
"""Writes the fuzz seed and regression corpora (nothing here is committed as a blob).

Usage: make_corpus.py --strata BIN --out DIR [--big]

DIR/<target>/ holds the inputs of one fuzz target (fuzz/fuzz_<target>.cc):
  gguf/         GGUF files
  safetensors/  .safetensors files
  hf_dir/       HF directories packed into one file: config.json, model.safetensors and
                strata_tokenizer.json joined by SEPARATOR (fuzz/fuzz_util.h kFileSeparator)
  archive/      one mode byte (bit 0: the harness recomputes checksums) + a VestigeKV archive
  tokenizer/    tokenizer.json, the text to encode and optionally tokenizer_config.json, joined
                by SEPARATOR: small synthetic pipelines (byte-level BPE, SentencePiece-style BPE
                with byte fallback, Unigram, normalizers) and the real tokenizer.json files of
                $STRATA_FIXTURES/tokenizers (default ../shared/fixtures) trimmed to their first
                merges (the full files are MBs: slow under ASan)
  request/      one mode byte (bit 0: chat endpoint; see fuzz/fuzz_request.cc) + a request body
  chat_template/ a template text (testdata/chat/*.jinja), SEPARATOR, then a flag byte and
                messages (role byte + content, separated by 0x1E; see fuzz/fuzz_chat_template.cc)
  quant_dot/    four header bytes (type, blocks per row, rows/tokens, activation mode) + weight
                and activation bytes (see fuzz/fuzz_quant_dot.cc)
Names: seed-* are valid files (`strata synth` outputs and the shipped models); d1-* .. d6-* and
minor-* reproduce the defects of issue 13, each named after what it claims.
--big also writes DIR/big/: the GGUF reproducers of D4 (sparse files of 16 MiB to 1 GiB that
take a few KiB of disk), too large for a fuzzer's corpus but given to the CLI by
fuzz/corrupt_corpus_test.sh.
"""

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

SEPARATOR = b"\n--strata-fuzz-file--\n"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# GGUF value types (io/gguf.h GgufType).
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
          BOOL: "<B", U64: "<Q", I64: "<q", F64: "<d"}


# ---- GGUF ----------------------------------------------------------------------------------

class Reader:
    def __init__(self, b):
        self.b, self.p = b, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.b, self.p)[0]
        self.p += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = self.b[self.p:self.p + n]
        self.p += n
        return s

    def value(self, t):
        if t == STRING:
            return self.string()
        if t == ARRAY:
            et, n = self.take("<I"), self.take("<Q")
            return (et, [self.value(et) for _ in range(n)])
        return self.take(SCALAR[t])


def put_string(s):
    if isinstance(s, str):
        s = s.encode()
    return struct.pack("<Q", len(s)) + s


def put_value(t, v):
    if t == STRING:
        return put_string(v)
    if t == ARRAY:
        et, elems = v
        return struct.pack("<IQ", et, len(elems)) + b"".join(put_value(et, e) for e in elems)
    return struct.pack(SCALAR[t], v)


def parse_gguf(b):
    """Returns (version, [(key, type, value)], tensor-info bytes, n_tensors, alignment, data)."""
    r = Reader(b)
    assert r.b[:4] == b"GGUF", "not a GGUF file"
    r.p = 4
    version, n_tensors, n_kv = r.take("<I"), r.take("<Q"), r.take("<Q")
    kv = []
    for _ in range(n_kv):
        k = r.string().decode()
        t = r.take("<I")
        kv.append((k, t, r.value(t)))
    infos_start = r.p
    for _ in range(n_tensors):
        r.string()
        nd = r.take("<I")
        r.p += 8 * nd + 4 + 8
    infos = b[infos_start:r.p]
    align = next((v for k, t, v in kv if k == "general.alignment"), 32)
    data_start = (r.p + align - 1) // align * align
    return version, kv, infos, n_tensors, align, b[data_start:]


def build_gguf(version, kv, infos, n_tensors, align, data):
    out = b"GGUF" + struct.pack("<IQQ", version, n_tensors, len(kv))
    for k, t, v in kv:
        out += put_string(k) + struct.pack("<I", t) + put_value(t, v)
    out += infos
    out += b"\0" * ((-len(out)) % align)
    return out + data


def patch_gguf(src, changes):
    """Copies GGUF `src` with keys replaced or added: changes = {key: (type, value)}."""
    with open(src, "rb") as f:
        version, kv, infos, n_tensors, align, data = parse_gguf(f.read())
    seen = set()
    for i, (k, t, v) in enumerate(kv):
        if k in changes:
            kv[i] = (k,) + changes[k]
            seen.add(k)
    kv += [(k,) + tv for k, tv in changes.items() if k not in seen]
    return build_gguf(version, kv, infos, n_tensors, align, data)


def sparse_u8_array_gguf(path, n):
    """D4: a GGUF whose second key is an array of n u8 zeros. The zeros are a hole in a sparse
    file, so the file takes a few KiB of disk however large n is."""
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 2)
    head += put_string("general.architecture") + struct.pack("<I", STRING) + put_string("llama")
    head += put_string("d4.sparse_u8_array") + struct.pack("<IIQ", ARRAY, U8, n)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + n + 32)  # the array, then nothing: no tensors


# ---- safetensors / HF ----------------------------------------------------------------------

def safetensors(tensors, header_extra=None):
    """tensors: [(name, shape, floats)] stored as F32; header_extra: raw JSON text spliced into
    the header object (for malformed entries)."""
    header, data = {}, b""
    for name, shape, values in tensors:
        blob = struct.pack("<%df" % len(values), *values)
        header[name] = {"dtype": "F32", "shape": shape,
                        "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    text = json.dumps(header)
    if header_extra:
        text = text[:-1] + (", " if header else "") + header_extra + "}"
    text += " " * ((-len(text)) % 8)
    return struct.pack("<Q", len(text)) + text.encode() + data


def values(n, seed=1):
    # Small deterministic weights: the converter only checks shapes, never the values.
    return [((i * 7919 + seed * 104729) % 2001 - 1000) / 1000.0 * 0.02 for i in range(n)]


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def tensors_of(shapes):
    return [(name, shape, values(numel(shape), i + 1)) for i, (name, shape) in enumerate(shapes)]


def llama_shapes(d, ff, vocab, q_rows, kv_rows, layers=1):
    s = [("model.embed_tokens.weight", [vocab, d])]
    for l in range(layers):
        p = "model.layers.%d." % l
        s += [(p + "input_layernorm.weight", [d]),
              (p + "self_attn.q_proj.weight", [q_rows, d]),
              (p + "self_attn.k_proj.weight", [kv_rows, d]),
              (p + "self_attn.v_proj.weight", [kv_rows, d]),
              (p + "self_attn.o_proj.weight", [d, q_rows]),
              (p + "post_attention_layernorm.weight", [d]),
              (p + "mlp.gate_proj.weight", [ff, d]),
              (p + "mlp.up_proj.weight", [ff, d]),
              (p + "mlp.down_proj.weight", [d, ff])]
    return s + [("model.norm.weight", [d]), ("lm_head.weight", [vocab, d])]


def llama_config(**over):
    c = {"architectures": ["LlamaForCausalLM"], "vocab_size": 16, "hidden_size": 8,
         "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
         "num_key_value_heads": 1, "head_dim": 4, "max_position_embeddings": 64,
         "rms_norm_eps": 1e-6, "rope_theta": 10000.0}
    c.update(over)
    return c


def pack(config_text, st_bytes, tokenizer_text=None):
    parts = [config_text.encode() if isinstance(config_text, str) else config_text, st_bytes]
    if tokenizer_text is not None:
        parts.append(tokenizer_text.encode() if isinstance(tokenizer_text, str) else tokenizer_text)
    return SEPARATOR.join(parts)


def deep_array(depth):
    return "[" * depth + "]" * depth


# ---- VestigeKV archive ---------------------------------------------------------------------

def fnv64(b):
    h = 0xcbf29ce484222325
    for x in b:
        h = ((h ^ x) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def archive(row_bytes, page_rows, pages, committed=None, n_records=None, record_override=None):
    """pages: [(page, [row bytes])]. Returns the file (checksums right unless overridden)."""
    recs = b""
    for page, rows in pages:
        r = struct.pack("<QII", page, len(rows), 0)
        for row in rows:
            r += row + struct.pack("<Q", fnv64(row))
        recs += r + struct.pack("<Q", fnv64(r))
    if record_override is not None:
        recs = record_override
    h = b"STRVARC1" + struct.pack("<IIII", 1, row_bytes, page_rows, 0)
    h += struct.pack("<QQ", len(recs) if committed is None else committed,
                     len(pages) if n_records is None else n_records)
    return h + struct.pack("<Q", fnv64(h)) + recs


# ---- tokenizer.json -------------------------------------------------------------------------

def byte_chars():
    """GPT-2's bytes_to_unicode: the character standing for each byte in byte-level vocabularies."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


GPT2_REGEX = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
TOKENIZER_TEXT = ("Hello world! The 12345 cats' naps\n\n\tcaf\u00e9 na\u00efve \u65e5\u672c\u8a9e "
                  "\U0001F600  <|im_start|>user\nhi<|im_end|> <s></s><unk> \u2581x").encode()
TOKENIZER_TEXT_BAD = b"ok \xff\xfe \xc3 \xe6\x97 end"  # invalid UTF-8


def tok_base():
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
            "normalizer": None, "pre_tokenizer": None, "post_processor": None, "decoder": None}


def added(i, content, special=True, normalized=False, lstrip=False, rstrip=False):
    return {"id": i, "content": content, "single_word": False, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": normalized, "special": special}


def byte_level_bpe_json():
    """A GPT-2 style byte-level BPE (a pipeline whose round trip the harness checks)."""
    bc = byte_chars()
    vocab = {c: i for i, c in enumerate(bc)}
    merges = []
    G = bc[ord(" ")]
    for a, b in [(G, "t"), ("h", "e"), (G + "t", "he"), ("i", "n"), (G, "a"), ("e", "r"),
                 ("o", "n"), (G, "w"), ("l", "l"), ("H", "e"), ("He", "ll"), ("Hell", "o"),
                 ("o", "r"), (G + "w", "or"), ("l", "d"), (G + "wor", "ld"), ("1", "2"),
                 ("12", "3"), ("c", "a"), ("ca", "t"), (G, "ca"), (G + "ca", "t"),
                 (bc[10], bc[10])]:
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
        merges.append([a, b])
    j = tok_base()
    n = len(vocab)
    j["added_tokens"] = [added(n, "<|endoftext|>"), added(n + 1, "<|im_start|>"),
                         added(n + 2, "<|im_end|>"), added(n + 3, "<tool>", special=False)]
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": GPT2_REGEX}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    j["post_processor"] = {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>",
                                                                "ids": [n],
                                                                "tokens": ["<|endoftext|>"]}}}
    j["decoder"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                    "use_regex": True}
    j["model"] = {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges}
    return j


def spm_bpe_json():
    """A Llama 2 style SentencePiece BPE: byte fallback, U+2581 word marker, unk."""
    sp = "\u2581"
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for c in [sp, "a", "b", "c", "d", "e", "h", "l", "o", "r", "w", "t", "H", "1", "2"]:
        vocab[c] = len(vocab)
    merges = []
    for a, b in [(sp, "t"), ("h", "e"), ("l", "l"), ("H", "e"), ("He", "ll"), ("Hell", "o"),
                 (sp, "w"), ("o", "r"), (sp + "w", "or"), ("l", "d"), (sp + "wor", "ld"),
                 ("1", "2"), (sp, "Hello")]:
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
        merges.append(a + " " + b)  # the older string form
    j = tok_base()
    j["added_tokens"] = [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")]
    j["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": sp}, {"type": "Replace", "pattern": {"String": " "},
                                             "content": sp}]}
    j["post_processor"] = {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1],
                                                      "tokens": ["<s>"]}}}
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": sp}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    j["model"] = {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": True, "byte_fallback": True, "vocab": vocab, "merges": merges}
    return j


def unigram_json():
    """A Unigram model (T5 / Gemma style) with Metaspace, byte fallback and a normalizer chain."""
    sp = "\u2581"
    pieces = [["<pad>", 0.0], ["</s>", 0.0], ["<unk>", 0.0]]
    pieces += [["<0x%02X>" % b, 0.0] for b in range(256)]
    for i, w in enumerate([sp, sp + "the", sp + "a", "a", "b", "c", "e", "h", "l", "o", "r",
                           "t", "w", sp + "hello", sp + "world", "ll", "or", "1", "2", "3"]):
        pieces.append([w, -1.0 - 0.5 * i])
    j = tok_base()
    j["added_tokens"] = [added(0, "<pad>"), added(1, "</s>"), added(2, "<unk>"),
                         added(len(pieces), "<start_of_turn>"),
                         added(len(pieces) + 1, "<end_of_turn>")]
    j["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "NFKC"}, {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}]}
    j["pre_tokenizer"] = {"type": "Metaspace", "replacement": sp, "prepend_scheme": "always",
                          "split": True}
    j["post_processor"] = {"type": "TemplateProcessing",
                           "single": [{"Sequence": {"id": "A", "type_id": 0}},
                                      {"SpecialToken": {"id": "</s>", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
                           "special_tokens": {"</s>": {"id": "</s>", "ids": [1],
                                                       "tokens": ["</s>"]}}}
    j["decoder"] = {"type": "Metaspace", "replacement": sp, "prepend_scheme": "always",
                    "split": True}
    j["model"] = {"type": "Unigram", "unk_id": 2, "vocab": pieces, "byte_fallback": True}
    return j


def normalizing_bpe_json():
    """A BPE with the other components: lowercase and accent stripping, whitespace, digit and
    punctuation splitting, an end-of-word suffix and its decoder, BERT-style specials."""
    chars = "abcdefghijklmnopqrstuvwxyz0123456789!?.,'"
    vocab = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2}
    for c in chars:
        vocab[c] = len(vocab)
        vocab[c + "</w>"] = len(vocab)
    merges = []
    for a, b in [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o</w>"), ("w", "o"),
                 ("r", "l"), ("wo", "rl"), ("worl", "d</w>")]:
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
        merges.append([a, b])
    j = tok_base()
    j["added_tokens"] = [added(0, "[UNK]"), added(1, "[CLS]"), added(2, "[SEP]"),
                         added(len(vocab), "[MASK]", lstrip=True, normalized=True)]
    j["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "NFD"}, {"type": "StripAccents"}, {"type": "Lowercase"},
        {"type": "Strip", "left": True, "right": True}]}
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "WhitespaceSplit"}, {"type": "Punctuation", "behavior": "Isolated"},
        {"type": "Digits", "individual_digits": True}]}
    j["post_processor"] = {"type": "BertProcessing", "sep": ["[SEP]", 2], "cls": ["[CLS]", 1]}
    j["decoder"] = {"type": "BPEDecoder", "suffix": "</w>"}
    j["model"] = {"type": "BPE", "dropout": None, "unk_token": "[UNK]",
                  "continuing_subword_prefix": None, "end_of_word_suffix": "</w>",
                  "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": merges}
    return j


def trim_tokenizer_json(j, n_merges):
    """A real BPE tokenizer.json cut to its first n_merges usable merges: the single-character
    tokens, the merges whose parts are kept, their results, and every added token, renumbered
    densely (the post-processor's ids follow). None for a model that is not BPE."""
    m = j["model"]
    if m.get("type") != "BPE":
        return None
    by_id = sorted(m["vocab"].items(), key=lambda kv: kv[1])
    kept = {t for t, _ in by_id if len(t) == 1}
    merges = []
    for mg in m["merges"]:
        a, b = mg if isinstance(mg, list) else mg.split(" ", 1)
        if a in kept and b in kept and a + b in m["vocab"]:
            kept.add(a + b)
            merges.append(mg)
            if len(merges) >= n_merges:
                break
    remap, vocab = {}, {}
    for t, i in by_id:
        if t in kept:
            remap[i] = vocab[t] = len(vocab)
    out = dict(j)
    out["model"] = dict(m, vocab=vocab, merges=merges)
    added_tokens = []
    for a in sorted(j["added_tokens"], key=lambda a: a["id"]):
        if a["id"] not in remap:
            remap[a["id"]] = len(vocab) + len(added_tokens)
        added_tokens.append(dict(a, id=remap[a["id"]]))
    out["added_tokens"] = added_tokens

    def fix_ids(p):
        if isinstance(p, dict):
            r = {}
            for k, v in p.items():
                if k == "ids" and isinstance(v, list):
                    r[k] = [remap.get(i, i) for i in v]
                elif k in ("sep", "cls") and isinstance(v, list) and len(v) == 2:
                    r[k] = [v[0], remap.get(v[1], v[1])]
                else:
                    r[k] = fix_ids(v)
            return r
        if isinstance(p, list):
            return [fix_ids(x) for x in p]
        return p
    out["post_processor"] = fix_ids(j.get("post_processor"))
    return out


def trim_tokenizer_config(cfg):
    keep = ("bos_token", "eos_token", "pad_token", "unk_token", "add_bos_token", "add_eos_token",
            "chat_template")
    return {k: cfg[k] for k in keep if k in cfg}


def tokenizer_input(tok, text, config=None):
    parts = [json.dumps(tok).encode() if not isinstance(tok, bytes) else tok, text]
    if config is not None:
        parts.append(json.dumps(config).encode() if not isinstance(config, bytes) else config)
    return SEPARATOR.join(parts)


# ---- request bodies ------------------------------------------------------------------------

REQUESTS = {
    # name: (mode byte, body); mode bit 0 chat, bit 1 vocabulary checked, bit 2 BOS/EOS texts,
    # bit 3 Qwen3 thinking off
    "completion-full": (0, {"model": "strata-fuzz", "prompt": "Hello", "max_tokens": 16,
                            "temperature": 0.7, "top_p": 0.9, "seed": 42, "stop": ["\n", "END"],
                            "stream": True, "stream_options": {"include_usage": True},
                            "n": 1, "best_of": 1.0, "echo": False, "user": "u",
                            "presence_penalty": 0, "ignore_eos": False}),
    "completion-token-ids": (2, {"prompt": [1, 2, 999], "max_tokens": 4}),
    "completion-batch-of-one": (2, {"prompt": [[5, 6, 7]], "stop": "x"}),
    "completion-list-of-one": (0, {"prompt": ["one"], "strata": {"policy": "full"}}),
    "completion-policy": (0, {"prompt": "p", "strata": {"policy": "geodesia@2.5:rd-frac=0.03"}}),
    "chat-full": (7, {"model": "strata-fuzz", "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "developer", "content": [{"type": "text", "text": "part 1"},
                                          {"type": "text", "text": " part 2"}]},
        {"role": "user", "content": "caf\u00e9 \U0001F600 <|im_start|>"}],
        "max_completion_tokens": 8, "temperature": 0, "strata": {"policy": "kivi4"}}),
    "chat-one-user": (9, {"messages": [{"role": "user", "content": ""}], "seed": -1}),
    "chat-assistant-first": (5, {"messages": [{"role": "assistant", "content": "<think>x</think>y"},
                                              {"role": "user", "content": "z"}],
                                 "policy": None, "stream": False}),
    # Refusals.
    "bad-not-json": (0, b"{\"prompt\": \"x\""),
    "bad-not-object": (1, [1, 2]),
    "bad-model": (0, {"model": "other", "prompt": "x"}),
    "bad-temperature": (0, {"prompt": "x", "temperature": 3}),
    "bad-top-p-tiny": (0, {"prompt": "x", "top_p": 1e-300}),
    "bad-max-tokens": (1, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5}),
    "bad-role": (1, {"messages": [{"role": "tool", "content": "x"}]}),
    "bad-empty-messages": (1, {"messages": []}),
    "bad-image-part": (1, {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}),
    "bad-stops": (0, {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}),
    "bad-token-id": (2, {"prompt": [1000]}),
    "bad-policy": (0, {"prompt": "x", "strata": {"policy": "geodesia:nope=1"}}),
    "bad-strata-key": (0, {"prompt": "x", "strata": {"policy": "full", "other": 1}}),
    "bad-deep": (1, b"{\"messages\": " + b"[" * 100 + b"]" * 100 + b"}"),
    "bad-huge-int": (0, b"{\"prompt\": \"x\", \"seed\": 18446744073709551615}"),
}


def request_input(mode, body):
    return bytes([mode]) + (body if isinstance(body, bytes) else json.dumps(body).encode())


# ---- chat templates ------------------------------------------------------------------------

def conversation(flags, messages):
    """messages: [(role byte, text)] for fuzz_chat_template.cc."""
    return bytes([flags]) + b"\x1e".join(bytes([r]) + t.encode() for r, t in messages)


CONVERSATIONS = [
    (2, [(0, "You are helpful."), (1, "Hi"), (2, "Hello! <think>hm</think>How can I help?"),
         (1, "2 + 2?")]),
    (4 | 8, [(1, "caf\u00e9 \U0001F600"), (2, "<think>\nx\n</think>\n\ny")]),
    (0, [(2, "assistant first"), (0, "late system"), (3, "developer")]),
    (2, [(7, "a tool turn")]),
]


# ---- quantized blocks ----------------------------------------------------------------------

# kernels/quant_testing.h BlockInfo: f16 scale offsets and the block size, per type, in the
# kQuantTypes order of fuzz/fuzz_quant_dot.cc.
QUANT_BLOCKS = [  # (name, block bytes, f16 offsets)
    ("q4_0", 18, [0]), ("q4_1", 20, [0, 2]), ("q5_0", 22, [0]), ("q5_1", 24, [0, 2]),
    ("q8_0", 34, [0]), ("q2_k", 84, [80, 82]), ("q3_k", 110, [108]), ("q4_k", 144, [0, 2]),
    ("q5_k", 176, [0, 2]), ("q6_k", 210, [208]), ("iq4_nl", 18, [0]), ("iq4_xs", 136, [0]),
]


def prng_bytes(n, seed):
    out, x = bytearray(), (seed * 2654435761 + 12345) & 0xFFFFFFFF
    for _ in range(n):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        out.append((x >> 16) & 0xFF)
    return bytes(out)


def quant_input(type_index, nb, rows, tokens, amode, shift, weights, acts):
    header = bytes([type_index, nb - 1, (rows - 1) | ((tokens - 1) << 3), amode | (shift << 2)])
    return header + weights + acts


# ---- corpus --------------------------------------------------------------------------------

def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def synth(strata, args, out):
    subprocess.run([strata, "synth"] + args + ["-o", out], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def tokenizer_json(vocab):
    # A SentencePiece-style vocabulary with byte fallback, like the one synth puts in its GGUFs.
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % i for i in range(256)]
    tokens += ["\u2581t%d" % i for i in range(vocab - len(tokens))]
    types = [2, 3, 3] + [6] * 256 + [1] * (vocab - 259)
    return json.dumps({"model": "llama", "tokens": tokens, "token_types": types,
                       "scores": [-float(i) for i in range(vocab)], "bos_token_id": 1,
                       "eos_token_id": 2, "add_bos_token": True, "add_space_prefix": True})


SYNTH_VARIANTS = {
    # name: synth flags (small dims keep the seeds a few KiB, so the fuzzers run fast)
    "llama": ["--arch", "llama", "--dims", "d_model=16,layers=1,heads=2,kv_heads=1,head_dim=8,"
              "ff=32,vocab=272"],
    "llama-tied-q8": ["--arch", "llama", "--dtype", "q8_0", "--dims",
                      "d_model=32,layers=2,heads=2,kv_heads=2,head_dim=16,ff=32,vocab=272,tied=1"],
    "qwen2": ["--arch", "qwen2", "--dims", "d_model=16,layers=1,heads=2,kv_heads=1,head_dim=8,"
              "ff=32,vocab=272"],
    "deepseek2": ["--arch", "deepseek2", "--dims", "d_model=16,layers=2,heads=2,kv_lora=8,"
                  "nope_dim=4,rope_dim=4,v_dim=4,ff=32,vocab=272,experts=2,experts_used=1,"
                  "shared_experts=1,ff_expert=8,dense_layers=1"],
    "deepseek2-nope-qlora": ["--arch", "deepseek2", "--nope", "--dims",
                             "d_model=16,layers=1,heads=2,q_lora=8,kv_lora=8,nope_dim=4,"
                             "rope_dim=4,v_dim=4,ff=32,vocab=272,experts=0,dense_layers=1"],
}


def write_tokenizer_seeds(td):
    synthetic = {"byte-level-bpe": byte_level_bpe_json(), "spm-bpe": spm_bpe_json(),
                 "unigram": unigram_json(), "normalizing-bpe": normalizing_bpe_json()}
    config = {"bos_token": "<|endoftext|>", "eos_token": {"content": "<|im_end|>"},
              "add_bos_token": True, "add_eos_token": False,
              "chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}"}
    for name, tok in synthetic.items():
        write(os.path.join(td, "seed-%s" % name), tokenizer_input(tok, TOKENIZER_TEXT))
        write(os.path.join(td, "seed-%s-invalid-utf8" % name),
              tokenizer_input(tok, TOKENIZER_TEXT_BAD))
    write(os.path.join(td, "seed-byte-level-bpe-config"),
          tokenizer_input(synthetic["byte-level-bpe"], TOKENIZER_TEXT, config))
    fixtures = os.environ.get("STRATA_FIXTURES",
                              os.path.join(os.path.dirname(ROOT), "shared", "fixtures"))
    tok_root = os.path.join(fixtures, "tokenizers")
    if not os.path.isdir(tok_root):
        return
    for name in sorted(os.listdir(tok_root)):
        path = os.path.join(tok_root, name, "tokenizer.json")
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as f:
            trimmed = trim_tokenizer_json(json.load(f), 1000)
        if trimmed is None:
            continue
        cfg_path = os.path.join(tok_root, name, "tokenizer_config.json")
        cfg = None
        if os.path.exists(cfg_path):
            with open(cfg_path, encoding="utf-8") as f:
                cfg = trim_tokenizer_config(json.load(f))
        write(os.path.join(td, "seed-trimmed-%s" % name),
              tokenizer_input(trimmed, TOKENIZER_TEXT, cfg))


def write_chat_template_seeds(cd):
    chat_dir = os.path.join(ROOT, "testdata", "chat")
    for f in sorted(os.listdir(chat_dir)):
        if not f.endswith(".jinja"):
            continue
        src = read(os.path.join(chat_dir, f))
        for i, (flags, msgs) in enumerate(CONVERSATIONS):
            write(os.path.join(cd, "seed-%s-%d" % (f[:-len(".jinja")], i)),
                  src + SEPARATOR + conversation(flags, msgs))
    write(os.path.join(cd, "seed-empty-gemma-turns"),
          SEPARATOR + conversation(1 | 2, CONVERSATIONS[0][1]))
    write(os.path.join(cd, "seed-unrecognised"),
          b"{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}" + SEPARATOR +
          conversation(2, CONVERSATIONS[0][1]))


def write_quant_dot_seeds(qd):
    for i, (name, bb, f16s) in enumerate(QUANT_BLOCKS):
        nb_max = 40 if bb in (18, 20, 22, 24, 34) else 6
        for v, (nb, rows, tokens, amode, shift) in enumerate(
                [(1, 1, 1, 0, 0), (9, 3, 2, 1, 16), (nb_max, 5, 4, 2, 0)]):
            # Random blocks whose f16 scales are ordinary numbers (random bytes there would be
            # Inf/NaN one time in 32), then f16 activations of a few magnitudes.
            w = bytearray(prng_bytes(nb * rows * bb, 1000 * i + v))
            for b in range(nb * rows):
                for off in f16s:
                    w[b * bb + off:b * bb + off + 2] = struct.pack("<e", 0.01 * (1 + (b % 7)))
            k = nb * (32 if nb_max == 40 else 256)
            acts = b"".join(struct.pack("<e", ((j * 37) % 201 - 100) / 16.0)
                            for j in range(k * tokens))
            if amode == 1:
                acts = prng_bytes(k * tokens, v)
            elif amode == 2:
                acts = b"".join(struct.pack("<f", ((j * 53) % 401 - 200) * 0.37)
                                for j in range(k * tokens))
            write(os.path.join(qd, "seed-%s-%d" % (name, v)),
                  quant_input(i, nb, rows, tokens, amode, shift, bytes(w), acts))
        # Extremes: every code and integer scale at its maximum, scales 1.0, activations +-1.
        nb = 8 if nb_max == 40 else 2
        w = bytearray(b"\xff" * (nb * bb))
        for b in range(nb):
            for off in f16s:
                w[b * bb + off:b * bb + off + 2] = struct.pack("<e", 1.0)
        k = nb * (32 if nb_max == 40 else 256)
        acts = b"".join(struct.pack("<e", 1.0 if j % 3 else -1.0) for j in range(k))
        write(os.path.join(qd, "seed-%s-extreme" % name),
              quant_input(i, nb, 1, 1, 0, 0, bytes(w), acts))
        # A NaN activation: every row's result is NaN.
        acts = struct.pack("<e", float("nan")) + acts[2:]
        write(os.path.join(qd, "seed-%s-nan" % name),
              quant_input(i, nb, 2, 1, 0, 0, bytes(w) * 2, acts))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strata", required=True, help="the strata binary (for `strata synth`)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--big", action="store_true", help="also write DIR/big (sparse D4 files)")
    a = ap.parse_args()
    out = a.out
    dirs = {k: os.path.join(out, k) for k in ("gguf", "safetensors", "hf_dir", "archive",
                                               "tokenizer", "request", "chat_template",
                                               "quant_dot")}
    for d in dirs.values():
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    tmp = tempfile.mkdtemp(prefix="strata-corpus-")
    try:
        # Seeds: synth models as GGUF and as HF directories, and the shipped models.
        for name, flags in SYNTH_VARIANTS.items():
            g = os.path.join(dirs["gguf"], "seed-synth-%s.gguf" % name)
            synth(a.strata, flags, g)
            if "q8" in name:
                continue  # q8_0 is GGUF-only
            hf = os.path.join(tmp, name)
            synth(a.strata, flags + ["--format", "safetensors", "--dtype", "f32"], hf)
            st = read(os.path.join(hf, "model.safetensors"))
            write(os.path.join(dirs["safetensors"], "seed-synth-%s.safetensors" % name), st)
            cfg = read(os.path.join(hf, "config.json"))
            write(os.path.join(dirs["hf_dir"], "seed-synth-%s" % name),
                  pack(cfg, st, tokenizer_json(272)))
        for f in sorted(os.listdir(os.path.join(ROOT, "models"))):
            if f.endswith(".gguf"):
                shutil.copy(os.path.join(ROOT, "models", f),
                            os.path.join(dirs["gguf"], "seed-shipped-" + f))
        hf_root = os.path.join(ROOT, "models", "hf")
        for m in sorted(os.listdir(hf_root)):
            d = os.path.join(hf_root, m)
            st = read(os.path.join(d, "model.safetensors"))
            write(os.path.join(dirs["safetensors"], "seed-shipped-%s.safetensors" % m), st)
            tok = os.path.join(d, "strata_tokenizer.json")
            write(os.path.join(dirs["hf_dir"], "seed-shipped-%s" % m),
                  pack(read(os.path.join(d, "config.json")), st,
                       read(tok) if os.path.exists(tok) else None))

        # D1: deeply nested JSON (dumped or copied recursively). 200,000 levels: the release
        # binary's 8 MiB stack overflows near 52,000.
        deep = deep_array(200_000)
        base_st = safetensors(tensors_of(llama_shapes(8, 16, 16, 8, 4)))
        cfg = json.dumps(llama_config())
        hd = dirs["hf_dir"]
        write(os.path.join(hd, "d1-config-num-hidden-layers-200k-deep"),
              pack(cfg.replace('"num_hidden_layers": 1', '"num_hidden_layers": ' + deep),
                   base_st))
        write(os.path.join(hd, "d1-config-rope-scaling-200k-deep"),
              pack(cfg[:-1] + ', "rope_scaling": {"rope_type": "linear", "factor": 2.0, '
                   '"x": ' + deep + "}}", base_st))
        write(os.path.join(hd, "d1-config-tie-word-embeddings-200k-deep"),
              pack(cfg[:-1] + ', "tie_word_embeddings": ' + deep + "}", base_st))
        deep_shape = ('"d1": {"dtype": "F32", "shape": ' + deep + ', "data_offsets": [0, 0]}')
        st_deep = safetensors(tensors_of(llama_shapes(8, 16, 16, 8, 4)), deep_shape)
        write(os.path.join(dirs["safetensors"], "d1-shape-200k-deep.safetensors"), st_deep)
        write(os.path.join(hd, "d1-safetensors-shape-200k-deep"), pack(cfg, st_deep))

        # D2: head counts whose products wrap in int64. deepseek2 with num_attention_heads
        # 2^62+1 and nope 2, rope 2, v 6, kv_lora 4: q_rows = n_head*4 and n_head*(nope+v) wrap
        # to 4 and 8, so [4, d] and [8, 4] tensors match, and the per-head split of kv_b_proj
        # runs 2^62+1 heads over an [8, 4] buffer.
        n = 2**62 + 1
        ds = {"architectures": ["DeepseekV2ForCausalLM"], "vocab_size": 16, "hidden_size": 4,
              "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": n,
              "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "kv_lora_rank": 4,
              "qk_nope_head_dim": 2, "qk_rope_head_dim": 2, "v_head_dim": 6}
        p = "model.layers.0."
        ds_st = safetensors(tensors_of([
            ("model.embed_tokens.weight", [16, 4]), (p + "input_layernorm.weight", [4]),
            (p + "self_attn.q_proj.weight", [4, 4]),
            (p + "self_attn.kv_a_proj_with_mqa.weight", [6, 4]),
            (p + "self_attn.kv_a_layernorm.weight", [4]),
            (p + "self_attn.kv_b_proj.weight", [8, 4]),
            (p + "self_attn.o_proj.weight", [4, 8]), (p + "post_attention_layernorm.weight", [4]),
            (p + "mlp.gate_proj.weight", [8, 4]), (p + "mlp.up_proj.weight", [8, 4]),
            (p + "mlp.down_proj.weight", [4, 8]), ("model.norm.weight", [4]),
            ("lm_head.weight", [16, 4])]))
        write(os.path.join(hd, "d2-deepseek2-num-attention-heads-2p62p1"),
              pack(json.dumps(ds), ds_st))
        # llama with num_attention_heads 2^61+1 and head_dim 8: q_rows wraps to 8 (one head).
        write(os.path.join(hd, "d2-llama-num-attention-heads-2p61p1"),
              pack(json.dumps(llama_config(num_attention_heads=2**61 + 1,
                                           num_key_value_heads=2**61 + 1, head_dim=8)),
                   safetensors(tensors_of(llama_shapes(8, 16, 16, 8, 8)))))

        # D3: llama3 rope scaling pushes head_dim/2 factors: head_dim 2^40.
        write(os.path.join(hd, "d3-llama3-rope-head-dim-2p40"),
              pack(json.dumps(llama_config(head_dim=2**40, rope_scaling={
                  "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})), base_st))
        # ... and qk_rope_head_dim 2^40 for deepseek2.
        ds3 = dict(ds, num_attention_heads=2, qk_rope_head_dim=2**40,
                   rope_scaling={"rope_type": "llama3"})
        write(os.path.join(hd, "d3-deepseek2-llama3-rope-dim-2p40"), pack(json.dumps(ds3), ds_st))

        # D5: layer vectors sized from block_count before any layer tensor is checked.
        base = os.path.join(dirs["gguf"], "seed-synth-llama.gguf")
        base_ds = os.path.join(dirs["gguf"], "seed-synth-deepseek2.gguf")
        gd = dirs["gguf"]
        for e in (24, 31):
            write(os.path.join(gd, "d5-llama-block-count-2p%d.gguf" % e),
                  patch_gguf(base, {"llama.block_count": (U32, 2**e)}))
            write(os.path.join(gd, "d5-deepseek2-block-count-2p%d.gguf" % e),
                  patch_gguf(base_ds, {"deepseek2.block_count": (U32, 2**e)}))
        # Minor: 64-bit keys narrowed to int before the range check (2^32+2 read as 2), and
        # keys of the wrong type (a float head_count_kv, a u8 mla_use_nope) taken as absent.
        write(os.path.join(gd, "minor-head-count-kv-u64-2p32p1.gguf"),
              patch_gguf(base, {"llama.attention.head_count_kv": (U64, 2**32 + 1)}))
        # (on a model with as many KV heads as heads, so the default it falls back to fits)
        write(os.path.join(gd, "minor-head-count-kv-f32.gguf"),
              patch_gguf(os.path.join(gd, "seed-synth-llama-tied-q8.gguf"),
                         {"llama.attention.head_count_kv": (F32, 2.0)}))
        write(os.path.join(gd, "minor-mla-use-nope-u8.gguf"),
              patch_gguf(os.path.join(gd, "seed-synth-deepseek2-nope-qlora.gguf"),
                         {"deepseek2.attention.mla_use_nope": (U8, 1)}))

        # Archive seeds (valid files, checksums as they are and recomputed by the harness) and
        # D6: row_bytes 2^31 and a record of 2^32-1 rows: 16 + n_rows * (row_bytes + 8) + 8
        # passes 2^63 (negative in int64), passes the length check and resizes a buffer to it.
        ad = dirs["archive"]
        rows = [bytes((i * 31 + j) & 0xFF for j in range(16)) for i in range(8)]
        good = archive(16, 4, [(0, rows[:4]), (1, rows[4:6]), (3, rows[6:8])])
        for mode in (0, 1):
            write(os.path.join(ad, "seed-3-pages-mode%d" % mode), bytes([mode]) + good)
        write(os.path.join(ad, "seed-empty-mode0"), bytes([0]) + archive(8, 64, []))
        d6 = archive(2**31, 2**32 - 1, [], committed=16, n_records=1,
                     record_override=struct.pack("<QII", 0, 2**32 - 1, 0))
        write(os.path.join(ad, "d6-record-bytes-overflow"), bytes([0]) + d6)

        write_tokenizer_seeds(dirs["tokenizer"])
        rd = dirs["request"]
        for name, (mode, body) in REQUESTS.items():
            write(os.path.join(rd, "seed-" + name), request_input(mode, body))
        write_chat_template_seeds(dirs["chat_template"])
        write_quant_dot_seeds(dirs["quant_dot"])

        if a.big:
            big = os.path.join(out, "big")
            shutil.rmtree(big, ignore_errors=True)
            os.makedirs(big)
            for e in (24, 27, 30):
                sparse_u8_array_gguf(os.path.join(big, "d4-sparse-u8-array-2p%d.gguf" % e),
                                     2**e)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for k in sorted(dirs):
        print("%s: %d files" % (k, len(os.listdir(dirs[k]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
