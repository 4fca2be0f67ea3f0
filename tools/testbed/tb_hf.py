"""Hugging Face export and import for the testbed models: safetensors (written by hand, F32),
config.json (fields io/hf.cc reads) and strata_tokenizer.json (tools-defined tokenizer metadata
mirroring io/tokenizer.h TokenizerData)."""
from __future__ import annotations

import json
import os
import struct

import numpy as np
import torch

import tb_data
import tb_model

SAFETENSORS_NAME = "model.safetensors"
TOKENIZER_NAME = "strata_tokenizer.json"


def _atomic_write_bytes(path: str, data: bytes):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def f32_to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), rounded to nearest even (finite inputs)."""
    u = np.ascontiguousarray(a, dtype="<f4").view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")


def write_safetensors(path: str, tensors: dict, metadata: dict | None = None,
                      dtype: str = "F32"):
    """tensors: name -> torch tensor or numpy array, stored as `dtype` (F32, or BF16 rounded to
    nearest even), little-endian, C order.
    Layout: u64 LE header length N, N bytes of JSON (space-padded so data starts 8-byte aligned),
    then the data; data_offsets are relative to the start of the data."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    off = 0
    for name in sorted(tensors):
        t = tensors[name]
        a = t.detach().cpu().to(torch.float32).numpy() if isinstance(t, torch.Tensor) else t
        a = np.ascontiguousarray(a, dtype="<f4")
        if dtype == "BF16":
            b = f32_to_bf16_bits(a).tobytes()
        elif dtype == "F32":
            b = a.tobytes()
        else:
            raise ValueError(f"write_safetensors: dtype {dtype!r} is not F32 or BF16")
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    _atomic_write_bytes(path, struct.pack("<Q", len(h)) + h + b"".join(blobs))


_ST_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "F64": np.dtype("<f8")}


def read_safetensors(path: str, metadata: dict | None = None) -> dict:
    """name -> float32 numpy array (F32/F16/F64/BF16). `metadata`, when given, receives the
    file's __metadata__ entries."""
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n].decode("utf-8"))
    if metadata is not None:
        metadata.update(header.get("__metadata__", {}))
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        raw = buf[base + b:base + e]
        dt = info["dtype"]
        if dt == "BF16":
            u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            a = u.view(np.float32)
        elif dt in _ST_DTYPES:
            a = np.frombuffer(raw, dtype=_ST_DTYPES[dt]).astype(np.float32)
        else:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {dt}")
        out[name] = a.reshape(info["shape"]).copy()
    return out


def hf_config(c: tb_model.Config, max_position_embeddings: int = 2048) -> dict:
    common = {
        "vocab_size": c.vocab_size,
        "hidden_size": c.d_model,
        "intermediate_size": c.d_ff,
        "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": c.rms_eps,
        "rope_theta": c.rope_theta,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "bos_token_id": tb_data.BOS,
        "eos_token_id": None,
        "torch_dtype": "float32",
        "strata_testbed_kind": c.kind,
    }
    if c.is_kimi:
        return kimi_config(c, common, max_position_embeddings)
    if c.is_mla:
        return {
            "architectures": ["DeepseekV2ForCausalLM"],
            "model_type": "deepseek_v2",
            **common,
            "num_key_value_heads": c.n_heads,
            "kv_lora_rank": c.kv_lora_rank,
            "q_lora_rank": None,
            "qk_nope_head_dim": c.qk_nope_head_dim,
            "qk_rope_head_dim": c.qk_rope_head_dim,
            "v_head_dim": c.v_head_dim,
            "n_routed_experts": None,
            "n_shared_experts": None,
            "first_k_dense_replace": c.n_layers,
            "moe_layer_freq": 1,
            "mla_use_nope": c.kind == "nope",
        }
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **common,
        "num_key_value_heads": c.n_kv_heads,
        "head_dim": c.head_dim,
        "mlp_bias": False,
    }


# The MoE hyper-parameters of the kimi testbed: written so that the config has every key of the
# real Kimi Linear config (spec 1), but moot: first_k_dense_replace = num_hidden_layers makes every
# layer's FFN the dense `mlp` (HF KimiDecoderLayer: MoE only at layer >= first_k_dense_replace), so
# no expert tensor exists.
KIMI_MOOT_MOE = {
    "num_experts": 4,
    "num_experts_per_token": 2,
    "num_shared_experts": 1,
    "moe_intermediate_size": 64,
    "moe_router_activation_func": "sigmoid",
    "moe_renormalize": True,
    "routed_scaling_factor": 2.446,
    "use_grouped_topk": True,
    "num_expert_group": 1,
    "topk_group": 1,
}


def kimi_config(c: tb_model.Config, common: dict, max_position_embeddings: int) -> dict:
    """KimiLinearForCausalLM config.json (keys of spec 1). linear_attn_config's layer lists are
    1-based as in the real config; every layer not in kda_layers is a NoPE MLA layer."""
    kda = [l + 1 for l in range(c.n_layers) if c.is_kda_layer(l)]
    full = [l + 1 for l in range(c.n_layers) if not c.is_kda_layer(l)]
    return {
        "architectures": ["KimiLinearForCausalLM"],
        "model_type": "kimi_linear",
        **common,
        "num_key_value_heads": c.n_heads,
        "head_dim": c.d_model // c.n_heads,
        "linear_attn_config": {
            "kda_layers": kda,
            "full_attn_layers": full,
            "num_heads": c.kda_heads,
            "head_dim": c.kda_head_dim,
            "short_conv_kernel_size": c.conv_kernel,
        },
        "kv_lora_rank": c.kv_lora_rank,
        "q_lora_rank": None,
        "qk_nope_head_dim": c.qk_nope_head_dim,
        "qk_rope_head_dim": c.qk_rope_head_dim,
        "v_head_dim": c.v_head_dim,
        "mla_use_nope": True,
        **KIMI_MOOT_MOE,
        "first_k_dense_replace": c.n_layers,
        "moe_layer_freq": 1,
        "num_nextn_predict_layers": 0,
        "model_max_length": max_position_embeddings,
        "pad_token_id": None,
    }


def config_from_hf(cfg: dict) -> tb_model.Config:
    arch = cfg["architectures"][0]
    if arch == "KimiLinearForCausalLM":
        lac = cfg["linear_attn_config"]
        n = cfg["num_hidden_layers"]
        kda = tuple(sorted(l - 1 for l in lac["kda_layers"]))
        full = sorted(l - 1 for l in lac.get("full_attn_layers", []))
        if sorted(set(kda) | set(full)) != list(range(n)) or set(kda) & set(full):
            raise ValueError(f"linear_attn_config: kda_layers {lac['kda_layers']} and "
                             f"full_attn_layers {lac.get('full_attn_layers')} must partition "
                             f"1..{n}")
        if cfg.get("q_lora_rank") or not cfg.get("mla_use_nope", False):
            raise ValueError("only the testbed's full-rank-q NoPE Kimi Linear layout is supported")
        if cfg.get("num_experts") and cfg.get("first_k_dense_replace", 0) < n:
            raise ValueError("only the testbed's all-dense Kimi Linear layout is supported "
                             f"(first_k_dense_replace {cfg.get('first_k_dense_replace')} < {n})")
        return tb_model.Config(
            kind="kimi", vocab_size=cfg["vocab_size"], d_model=cfg["hidden_size"], n_layers=n,
            n_heads=cfg["num_attention_heads"], d_ff=cfg["intermediate_size"],
            rms_eps=cfg["rms_norm_eps"], kv_lora_rank=cfg["kv_lora_rank"],
            qk_nope_head_dim=cfg["qk_nope_head_dim"], qk_rope_head_dim=cfg["qk_rope_head_dim"],
            v_head_dim=cfg["v_head_dim"], kda_layers=kda, kda_heads=lac["num_heads"],
            kda_head_dim=lac["head_dim"], conv_kernel=lac["short_conv_kernel_size"])
    if arch == "DeepseekV2ForCausalLM":
        if cfg.get("q_lora_rank") or cfg.get("n_routed_experts"):
            raise ValueError("only the testbed's dense, full-rank-q DeepseekV2 layout is supported")
        kind = "nope" if cfg.get("mla_use_nope", False) else "rope"
        return tb_model.Config(
            kind=kind, vocab_size=cfg["vocab_size"], d_model=cfg["hidden_size"],
            n_layers=cfg["num_hidden_layers"], n_heads=cfg["num_attention_heads"],
            d_ff=cfg["intermediate_size"], rms_eps=cfg["rms_norm_eps"],
            rope_theta=cfg.get("rope_theta", 10000.0), kv_lora_rank=cfg["kv_lora_rank"],
            qk_nope_head_dim=cfg["qk_nope_head_dim"], qk_rope_head_dim=cfg["qk_rope_head_dim"],
            v_head_dim=cfg["v_head_dim"])
    if arch == "LlamaForCausalLM":
        h = cfg["num_attention_heads"]
        return tb_model.Config(
            kind="gqa", vocab_size=cfg["vocab_size"], d_model=cfg["hidden_size"],
            n_layers=cfg["num_hidden_layers"], n_heads=h, d_ff=cfg["intermediate_size"],
            rms_eps=cfg["rms_norm_eps"], rope_theta=cfg.get("rope_theta", 10000.0),
            n_kv_heads=cfg.get("num_key_value_heads", h),
            head_dim=cfg.get("head_dim", cfg["hidden_size"] // h))
    raise ValueError(f"architecture {arch!r} is not a testbed architecture")


def tokenizer_json() -> dict:
    toks = tb_data.token_strings()
    return {
        "model": "llama",
        "tokens": toks,
        "token_types": tb_data.token_types(),
        "scores": [0.0] * len(toks),
        "bos_token_id": tb_data.BOS,
        "eos_token_id": -1,
        "add_bos_token": False,
        "add_space_prefix": False,
    }


def export(model: tb_model.CausalLM, out_dir: str, max_position_embeddings: int = 2048,
           extra_metadata: dict | None = None, dtype: str = "F32"):
    """Writes out_dir/{model.safetensors (dtype: F32 or BF16), config.json,
    strata_tokenizer.json}."""
    os.makedirs(out_dir, exist_ok=True)
    sd = model.state_dict()
    meta = {"format": "pt", "strata_testbed_kind": model.config.kind}
    if extra_metadata:
        meta.update(extra_metadata)
    write_safetensors(os.path.join(out_dir, SAFETENSORS_NAME), sd, meta, dtype)
    cfg = hf_config(model.config, max_position_embeddings)
    _atomic_write_bytes(os.path.join(out_dir, "config.json"),
                        (json.dumps(cfg, indent=2) + "\n").encode())
    _atomic_write_bytes(os.path.join(out_dir, TOKENIZER_NAME),
                        (json.dumps(tokenizer_json(), ensure_ascii=False, indent=1) + "\n")
                        .encode("utf-8"))


def load(model_dir: str, device="cpu") -> tb_model.CausalLM:
    """An exported directory back into a CausalLM (eval mode)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    model = tb_model.CausalLM(config_from_hf(cfg))
    files = sorted(x for x in os.listdir(model_dir) if x.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors")
    tensors = {}
    for fn in files:
        tensors.update(read_safetensors(os.path.join(model_dir, fn)))
    sd = {k: torch.from_numpy(v) for k, v in tensors.items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise ValueError(f"{model_dir}: missing tensors {missing}, unexpected {unexpected}")
    return model.to(device).eval()
