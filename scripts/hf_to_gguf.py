#!/usr/bin/env python3
"""Write a GGUF file for llama.cpp from a local Llama model made by make_tiny_model.py.

Why not llama.cpp's own convert_hf_to_gguf.py: it identifies a BPE tokenizer by a hash of its
pre-tokenizer's output and refuses hashes it does not know ("BPE pre-tokenizer was not
recognized"), which a locally trained tokenizer always is; it also ships in no wheel. This
writer uses only the `gguf` package (PyPI), safetensors and numpy. It declares the tokenizer as
GPT-2 style byte-level BPE (tokenizer.ggml.model=gpt2, pre=default), which is what
make_tiny_model.py trains, and permutes the Q/K projections the way llama.cpp's converter does
(HF's rotate_half layout to GGML's interleaved RoPE). Checked: for the same prompt with greedy
decoding, llama-server and vLLM stream the same text.

Usage:  python scripts/hf_to_gguf.py MODEL_DIR OUT.gguf [--f16]
Needs:  gguf (0.19.0 tested), safetensors, numpy.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import numpy as np


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF (rotate_half) layout -> GGML (interleaved RoPE) layout, per head."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--f16", action="store_true", help="store 2-D weights as F16 (norms stay F32)")
    args = ap.parse_args()

    import gguf
    from safetensors.numpy import load_file

    src: Path = args.model_dir
    cfg = json.loads((src / "config.json").read_text())
    tok = json.loads((src / "tokenizer.json").read_text())
    tok_cfg = json.loads((src / "tokenizer_config.json").read_text())
    sd = load_file(str(src / "model.safetensors"))

    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_head)
    hidden = cfg["hidden_size"]
    head_dim = cfg.get("head_dim") or hidden // n_head

    tmp = args.out.with_suffix(".gguf.tmp")
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name(src.name)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    rope = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    w.add_rope_freq_base(float(rope))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if args.f16 else gguf.LlamaFileType.ALL_F32)
    w.add_vocab_size(cfg["vocab_size"])

    # ---- tokenizer: GPT-2 style byte-level BPE
    vocab: dict[str, int] = dict(tok["model"]["vocab"])
    for t in tok.get("added_tokens", []):
        vocab[t["content"]] = t["id"]
    special = {t["content"] for t in tok.get("added_tokens", []) if t.get("special")}
    by_id = {i: s for s, i in vocab.items()}
    tokens: list[str] = []
    types: list[Any] = []
    for i in range(cfg["vocab_size"]):
        s = by_id.get(i, f"[PAD{i}]")
        tokens.append(s)
        control = s in special or i not in by_id
        types.append(gguf.TokenType.CONTROL if control else gguf.TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    if cfg.get("pad_token_id") is not None:
        w.add_pad_token_id(cfg["pad_token_id"])
    w.add_add_bos_token(False)
    template = tok_cfg.get("chat_template")
    jinja = src / "chat_template.jinja"  # where transformers 5 saves it
    if not template and jinja.exists():
        template = jinja.read_text()
    if template:
        w.add_chat_template(template)

    # ---- tensors
    def put(name: str, arr: np.ndarray, keep_f32: bool = False) -> None:
        arr = np.ascontiguousarray(arr.astype(np.float32))
        if args.f16 and not keep_f32 and arr.ndim == 2:
            arr = arr.astype(np.float16)
        w.add_tensor(name, arr)

    put("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        put(f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"], True)
        put(f"blk.{i}.attn_q.weight", permute(sd[p + "self_attn.q_proj.weight"], n_head))
        put(f"blk.{i}.attn_k.weight", permute(sd[p + "self_attn.k_proj.weight"], n_kv))
        put(f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        put(f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        put(f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"], True)
        put(f"blk.{i}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        put(f"blk.{i}.ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        put(f"blk.{i}.ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    put("output_norm.weight", sd["model.norm.weight"], True)
    put("output.weight", sd.get("lm_head.weight", sd["model.embed_tokens.weight"]))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, args.out)  # a half-written file never carries the final name
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
