#!/usr/bin/env python3
"""Writes the fuzz seed and regression corpora (nothing here is committed as a blob).

Usage: make_corpus.py --strata BIN --out DIR [--big]

DIR/<target>/ holds the inputs of one fuzz target (fuzz/fuzz_<target>.cc):
  gguf/         GGUF files
  safetensors/  .safetensors files
  hf_dir/       HF directories packed into one file: config.json, model.safetensors and
                strata_tokenizer.json joined by SEPARATOR (fuzz/fuzz_util.h kFileSeparator)
  archive/      one mode byte (bit 0: the harness recomputes checksums) + a VestigeKV archive
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strata", required=True, help="the strata binary (for `strata synth`)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--big", action="store_true", help="also write DIR/big (sparse D4 files)")
    a = ap.parse_args()
    out = a.out
    dirs = {k: os.path.join(out, k) for k in ("gguf", "safetensors", "hf_dir", "archive")}
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
