"""GGUF files for the tests, written with gguf.GGUFWriter (a plain module: no llama.cpp, torch or transformers).

to_gguf() converts an F32 fixture folder (config.json, model.safetensors, tokenizer.json) the way llama.cpp's
convert_hf_to_gguf.py does: the `<arch>.*` keys from config.json, the tensors under llama.cpp's names with each
MoE layer's experts merged into one 3-D tensor per projection, the byte-level BPE vocabulary as
tokenizer.ggml.tokens / token_type / merges. Options write splits, quantized tensors, other keys and edits.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file

HF_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
EXPERTS = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps"}


def gguf_tensors(folder: Path) -> dict[str, np.ndarray]:
    """The folder's tensors under llama.cpp's names, each MoE layer's experts stacked [expert, rows, cols]."""
    config = json.loads((folder / "config.json").read_text())
    hf = load_file(str(folder / "model.safetensors"))
    out: dict[str, np.ndarray] = {}
    for name, arr in hf.items():
        if name in HF_TO_GGUF:
            out[HF_TO_GGUF[name]] = arr
            continue
        parts = name.split(".")
        layer, rest = int(parts[2]), ".".join(parts[3:])
        if rest.startswith("mlp.experts."):
            continue
        out[f"blk.{layer}.{LAYER[rest]}"] = arr
    for layer in range(config["num_hidden_layers"]):
        for proj, gname in EXPERTS.items():
            names = [f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight" for e in range(config.get("num_experts", 0))]
            if names and names[0] in hf:
                out[f"blk.{layer}.{gname}.weight"] = np.stack([hf[n] for n in names])
    return out


def tokenizer_keys(folder: Path, vocab_size: int, pre: str = "gpt-2") -> dict:
    """tokenizer.ggml.* values from tokenizer.json: ids without a token padded as [PAD<id>] (unused), as the
    converter does; added tokens special -> control, others user-defined."""
    tj = json.loads((folder / "tokenizer.json").read_text())
    by_id = {i: t for t, i in tj["model"]["vocab"].items()}
    types = {i: 1 for i in by_id}
    for added in tj["added_tokens"]:
        by_id[added["id"]] = added["content"]
        types[added["id"]] = 3 if added["special"] else 4
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(vocab_size)]
    token_types = [types.get(i, 5) for i in range(vocab_size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    return {"model": "gpt2", "pre": pre, "tokens": tokens, "token_type": token_types, "merges": merges}


def to_gguf(folder: Path, out: Path, *, split_max_tensors: int = 0, qtypes: dict[str, int] | None = None,
            pre: str = "gpt-2", extra: dict | None = None, drop_keys: tuple[str, ...] = (),
            drop_tensors: tuple[str, ...] = (), tensors: dict | None = None) -> list[Path]:  # fmt: skip
    """Write the fixture `folder` as GGUF at `out` (split into parts of split_max_tensors tensors when given; the
    paths written are returned). qtypes: tensor name -> ggml type to quantize it to with gguf.quants; extra:
    more keys (name -> (value, GGUFValueType)); drop_keys / drop_tensors: leave those out; tensors: write these
    (llama.cpp names -> arrays) instead of the folder's."""
    config = json.loads((folder / "config.json").read_text())
    moe = config["architectures"][0] == "Qwen3MoeForCausalLM"
    arch = "qwen3moe" if moe else "qwen3"
    w = gguf.GGUFWriter(out, arch, split_max_tensors=split_max_tensors)
    keys: dict[str, tuple] = {
        f"{arch}.context_length": (config["max_position_embeddings"], gguf.GGUFValueType.UINT32),
        f"{arch}.embedding_length": (config["hidden_size"], gguf.GGUFValueType.UINT32),
        f"{arch}.block_count": (config["num_hidden_layers"], gguf.GGUFValueType.UINT32),
        f"{arch}.feed_forward_length": (config["intermediate_size"], gguf.GGUFValueType.UINT32),
        f"{arch}.attention.head_count": (config["num_attention_heads"], gguf.GGUFValueType.UINT32),
        f"{arch}.attention.head_count_kv": (config["num_key_value_heads"], gguf.GGUFValueType.UINT32),
        f"{arch}.attention.key_length": (config["head_dim"], gguf.GGUFValueType.UINT32),
        f"{arch}.attention.value_length": (config["head_dim"], gguf.GGUFValueType.UINT32),
        f"{arch}.rope.freq_base": (config["rope_theta"], gguf.GGUFValueType.FLOAT32),
        f"{arch}.attention.layer_norm_rms_epsilon": (config["rms_norm_eps"], gguf.GGUFValueType.FLOAT32),
        "general.file_type": (0, gguf.GGUFValueType.UINT32),
    }
    if moe:
        keys[f"{arch}.expert_count"] = (config["num_experts"], gguf.GGUFValueType.UINT32)
        keys[f"{arch}.expert_used_count"] = (config["num_experts_per_tok"], gguf.GGUFValueType.UINT32)
        keys[f"{arch}.expert_feed_forward_length"] = (config["moe_intermediate_size"], gguf.GGUFValueType.UINT32)
    tok = tokenizer_keys(folder, config["vocab_size"], pre)
    keys["tokenizer.ggml.model"] = (tok["model"], gguf.GGUFValueType.STRING)
    keys["tokenizer.ggml.pre"] = (tok["pre"], gguf.GGUFValueType.STRING)
    keys["tokenizer.ggml.tokens"] = (tok["tokens"], gguf.GGUFValueType.ARRAY)
    keys["tokenizer.ggml.token_type"] = (tok["token_type"], gguf.GGUFValueType.ARRAY)
    keys["tokenizer.ggml.merges"] = (tok["merges"], gguf.GGUFValueType.ARRAY)
    keys["tokenizer.ggml.bos_token_id"] = (config["bos_token_id"], gguf.GGUFValueType.UINT32)
    keys["tokenizer.ggml.eos_token_id"] = (config["eos_token_id"], gguf.GGUFValueType.UINT32)
    keys["tokenizer.ggml.padding_token_id"] = (config["eos_token_id"], gguf.GGUFValueType.UINT32)
    keys.update(extra or {})
    for key, (value, vtype) in keys.items():
        if key in drop_keys:
            continue
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = gguf.GGUFValueType.STRING if value and isinstance(value[0], str) else gguf.GGUFValueType.INT32
            w.add_key_value(key, value, vtype, sub_type=sub)
        else:
            w.add_key_value(key, value, vtype)
    arrays = gguf_tensors(folder) if tensors is None else tensors
    for name, arr in arrays.items():
        if name in drop_tensors:
            continue
        qtype = (qtypes or {}).get(name)
        if qtype is None:
            w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
        else:
            w.add_tensor(name, gguf.quants.quantize(arr.astype(np.float32), qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    n = len(w.tensors)
    return [out] if n == 1 else [out.with_name(f"{out.stem}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1)]


# ---- byte-level access to a written file, for damaging it ---------------------------------------------------


class Layout:
    """Where things are in a GGUF file: metadata entries (key -> (start, value type start, end)), tensor entries
    (name -> start of the entry, position of its n_dims, its type, its offset), and the data's start."""

    def __init__(self, raw: bytes):
        self.raw = raw
        pos = 24
        n_tensors, n_kv = struct.unpack_from("<QQ", raw, 8)
        self.kv: dict[str, tuple[int, int, int]] = {}
        self.alignment = 32
        for _ in range(n_kv):
            start = pos
            (klen,) = struct.unpack_from("<Q", raw, pos)
            key = raw[pos + 8 : pos + 8 + klen].decode()
            pos += 8 + klen
            vpos = pos
            (vtype,) = struct.unpack_from("<I", raw, pos)
            pos = self._skip(raw, pos + 4, vtype)
            self.kv[key] = (start, vpos, pos)
            if key == "general.alignment":
                (self.alignment,) = struct.unpack_from("<I", raw, vpos + 4)
        self.tensors: dict[str, dict[str, int]] = {}
        for _ in range(n_tensors):
            start = pos
            (nlen,) = struct.unpack_from("<Q", raw, pos)
            name = raw[pos + 8 : pos + 8 + nlen].decode()
            pos += 8 + nlen
            (n_dims,) = struct.unpack_from("<I", raw, pos)
            entry = {"start": start, "n_dims": pos, "dims": pos + 4}
            pos += 4 + 8 * n_dims
            entry["type"] = pos
            entry["offset"] = pos + 4
            pos += 12
            entry["end"] = pos
            self.tensors[name] = entry
        self.header_end = pos
        self.data_start = -(-pos // self.alignment) * self.alignment

    @staticmethod
    def _skip(raw: bytes, pos: int, vtype: int) -> int:
        sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
        if vtype in sizes:
            return pos + sizes[vtype]
        if vtype == 8:
            (n,) = struct.unpack_from("<Q", raw, pos)
            return pos + 8 + n
        itype, count = struct.unpack_from("<IQ", raw, pos)
        pos += 12
        for _ in range(count):
            pos = Layout._skip(raw, pos, itype)
        return pos

    def offset_of(self, name: str) -> int:
        return struct.unpack_from("<Q", self.raw, self.tensors[name]["offset"])[0]
