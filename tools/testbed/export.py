#!/usr/bin/python3
"""Exports a testbed model as a Hugging Face directory: model.safetensors (F32), config.json and
strata_tokenizer.json. train.py does this itself at the end of training (OUT/hf); this tool
re-exports a run's latest checkpoint (also mid-training), or a seeded random initialisation for
tests.

  /usr/bin/python3 tools/testbed/export.py --run tools/testbed/runs/nope          # -> RUN/hf
  /usr/bin/python3 tools/testbed/export.py --run RUN --out models/testbed-nope
  /usr/bin/python3 tools/testbed/export.py --random-init rope --seed 7 --out /tmp/rope-init
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import tb_hf  # noqa: E402
import tb_model  # noqa: E402


def model_from_run(run_dir: str) -> tuple[tb_model.CausalLM, dict]:
    path = os.path.join(run_dir, "ckpt.pt")
    if not os.path.exists(path):
        raise SystemExit(f"{path}: no checkpoint (has train.py run in {run_dir}?)")
    ck = torch.load(path, map_location="cpu")
    model = tb_model.CausalLM(tb_model.Config(**ck["config"]))
    model.load_state_dict(ck["model"])
    return model.eval(), ck


def random_model(kind: str, seed: int, init_scale: float = 1.0) -> tb_model.CausalLM:
    """A seeded random model; init_scale > 1 widens the weights so activations are not tiny."""
    torch.manual_seed(seed)
    model = tb_model.CausalLM(tb_model.config_for(kind))
    if init_scale != 1.0:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("A_log") or name.endswith("dt_bias"):
                    continue  # KDA decay parameters keep their (already random) initialisation
                if p.dim() >= 2:
                    p.mul_(init_scale)
                else:  # norm weights: jitter around 1 so their layout matters in parity
                    p.uniform_(0.5, 1.5)
    return model.eval()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", help="a train.py output directory (uses its ckpt.pt)")
    src.add_argument("--random-init", choices=list(tb_model.KINDS),
                     help="export a seeded random initialisation instead")
    p.add_argument("--seed", type=int, default=1234, help="with --random-init")
    p.add_argument("--init-scale", type=float, default=1.0, help="with --random-init")
    p.add_argument("--out", help="output directory (default RUN/hf)")
    p.add_argument("--max-position-embeddings", type=int, default=2048)
    p.add_argument("--dtype", choices=("f32", "bf16"), default="f32",
                   help="weights in the safetensors (bf16: rounded to nearest even; e.g. the\n"
                        "weights a run leaves in the repository for train.py --init-from)")
    a = p.parse_args(argv)
    if a.run:
        model, ck = model_from_run(a.run)
        st = ck["state"]
        out = a.out or os.path.join(a.run, "hf")
        meta = {"strata_testbed_steps": st["step"], "strata_testbed_seed": ck["args"]["seed"]}
        print(f"{a.run}: {ck['args']['model']} at step {st['step']}, "
              f"{st['train_s']:.0f}s of training")
    else:
        if not a.out:
            raise SystemExit("--random-init needs --out")
        model = random_model(a.random_init, a.seed, a.init_scale)
        out = a.out
        meta = {"strata_testbed_random_init_seed": a.seed}
    tb_hf.export(model, out, a.max_position_embeddings, meta, a.dtype.upper())
    print(f"wrote {out}/{{{tb_hf.SAFETENSORS_NAME}, config.json, {tb_hf.TOKENIZER_NAME}}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
