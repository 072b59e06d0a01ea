"""A placement as llama.cpp's arguments: --override-tensor (or --n-cpu-moe), and reading such arguments back.

llama.cpp (checked against its source: common/arg.cpp parse_tensor_buffer_overrides, src/llama-model-loader.cpp,
ggml/src/ggml-cuda/ggml-cuda.cu; the llama.cpp vendored in llama-cpp-python 0.3.36):

* `-ot` / `--override-tensor` takes `PATTERN=BUFFER[,PATTERN=BUFFER...]`: the value is split at every comma,
  each item at its first '='. PATTERN is a std::regex (ECMAScript) searched (std::regex_search, not a full
  match) in each tensor's GGUF name; the first matching pattern wins. BUFFER must be the name of a device's
  buffer type, else llama.cpp prints the available ones and stops ("unknown buffer type").
* Buffer type names: "CPU" for the CPU; GGML_CUDA_NAME + device number for GPUs, where GGML_CUDA_NAME is "CUDA"
  (CUDA builds), "ROCm" (HIP builds) or "MUSA": CUDA0, CUDA1, ROCm0, ... numbered as that runtime enumerates its
  devices (after CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES), as our cuda:K and hip:K are.
* A Qwen3-MoE (or DeepSeek, gpt-oss) GGUF keeps each layer's experts in one tensor per projection,
  blk.N.ffn_gate_exps.weight, blk.N.ffn_up_exps.weight, blk.N.ffn_down_exps.weight (some architectures fuse
  gate and up: ffn_gate_up_exps); N is the Hugging Face layer number. The pattern used here is llama.cpp's own
  (LLM_FFN_EXPS_REGEX in common/common.h, the one --n-cpu-moe uses) after `blk\\.(N|M|...)`. gpt-oss's experts
  have biases, blk.N.ffn_gate_exps.bias, ffn_up_exps.bias and ffn_down_exps.bias (llama.cpp's converter splits
  gate_up_proj_bias into the first two): the pattern is searched, not matched whole, and ends before the
  `.weight` / `.bias` suffix, so a rule that moves a layer's experts moves their biases with them; the router
  (ffn_gate_inp.weight and .bias) and the attention sinks (attn_sinks.weight) stay with the layer's attention.

So a placement exports at whole-layer granularity: a layer whose experts sit on several devices goes to its most
common device, and the other experts are reported as not expressible. Several CPU devices (cpu:0, cpu:1: NUMA
nodes or thread groups) are all "CPU" in llama.cpp; hostsim devices (a simulation of a discrete device) are the
CPU too. The primary device maps to `-ngl`: a CPU primary keeps every layer's attention and dense weights on the
CPU (-ngl 0) and the overrides send expert layers to GPUs; a GPU primary puts every layer on that GPU
(-ngl 999 --split-mode none --main-gpu K) and the overrides send expert layers elsewhere.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from ..core.errors import ArgumentError
from ..placement.placement import Placement

EXPS_SUFFIX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"  # llama.cpp's LLM_FFN_EXPS_REGEX
_GPU_BUFFERS = {"cuda": "CUDA", "hip": "ROCm"}


def llama_cpp_buffer(device: str) -> str:
    """The llama.cpp buffer type name for one of our devices."""
    runtime, _, index = device.partition(":")
    if runtime in ("cpu", "hostsim"):
        return "CPU"
    if runtime in _GPU_BUFFERS and index.isdigit():
        return f"{_GPU_BUFFERS[runtime]}{int(index)}"
    raise ArgumentError(f"device {device!r} has no llama.cpp buffer type (cpu, hostsim, cuda and hip devices do)")


def layer_pattern(layers: list[int]) -> str:
    """The -ot pattern for the expert tensors of these layers (no commas: the -ot value is split at commas)."""
    if not layers:
        raise ArgumentError("no layer to match")
    return r"blk\.(" + "|".join(str(layer) for layer in sorted(layers)) + ")" + EXPS_SUFFIX


@dataclass
class LlamaCppExport:
    args: list[str]  # the llama.cpp arguments: -ngl ... -ot VALUE (or --n-cpu-moe N)
    override_tensor: str  # the -ot value ('' when nothing needs overriding)
    layer_buffers: dict[int, str]  # MoE layer -> llama.cpp buffer type of its experts
    not_expressible: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    n_cpu_moe: int | None = None  # the placement is exactly --n-cpu-moe N: the experts of layers 0..N-1 on the CPU

    @property
    def exact(self) -> bool:
        return not self.not_expressible

    def command_line(self) -> str:
        return shlex.join(self.args)

    def to_dict(self) -> dict:
        return {"format": "llama.cpp", "args": self.args, "command_line": self.command_line(),
                "override_tensor": self.override_tensor, "exact": self.exact,
                "layer_buffers": {str(k): v for k, v in self.layer_buffers.items()}, "n_cpu_moe": self.n_cpu_moe,
                "not_expressible": self.not_expressible, "notes": self.notes}  # fmt: skip


def to_llama_cpp(placement: Placement, primary: str = "cpu:0") -> LlamaCppExport:
    primary_buffer = llama_cpp_buffer(primary)
    not_expressible: list[str] = []
    notes: list[str] = []
    layer_buffers: dict[int, str] = {}
    for layer, row in enumerate(placement.owners):
        if not row or row[0] is None:
            continue
        owner = max(sorted(set(row)), key=lambda d: (row.count(d), d == primary))
        layer_buffers[layer] = llama_cpp_buffer(owner)
        others = [(e, d) for e, d in enumerate(row) if llama_cpp_buffer(d) != layer_buffers[layer]]
        if others:
            runs: list[list] = []  # [first, last, device]
            for e, d in others:
                if runs and runs[-1][1] == e - 1 and runs[-1][2] == d:
                    runs[-1][1] = e
                else:
                    runs.append([e, e, d])
            listed = ", ".join(f"{a}-{b} on {d}" if b > a else f"{a} on {d}" for a, b, d in runs)
            not_expressible.append(f"layer {layer}: experts {listed}: llama.cpp keeps a layer's experts in one "
                                   f"tensor per projection, so the layer goes whole to {layer_buffers[layer]} "
                                   f"({owner})")  # fmt: skip
    merged = sorted({d for row in placement.owners for d in row if d is not None and llama_cpp_buffer(d) == "CPU"})
    if len(merged) > 1 or any(d.startswith("hostsim:") for d in merged):
        notes.append(f"{', '.join(merged)} are all the CPU in llama.cpp (one CPU buffer type; NUMA is --numa)")
    by_buffer: dict[str, list[int]] = {}
    for layer, buffer in layer_buffers.items():
        if buffer != primary_buffer:
            by_buffer.setdefault(buffer, []).append(layer)
    override = ",".join(f"{layer_pattern(layers)}={buffer}" for buffer, layers in sorted(by_buffer.items()))
    if primary_buffer == "CPU":
        args = ["-ngl", "0"]
    else:
        args = ["-ngl", "999", "--split-mode", "none", "--main-gpu", re.sub(r"\D", "", primary_buffer)]
    n_cpu_moe = _n_cpu_moe(layer_buffers, primary_buffer)
    if n_cpu_moe is not None:  # the same overrides as -ot, as llama.cpp users write them
        args += ["--n-cpu-moe", str(n_cpu_moe)]
    elif override:
        args += ["-ot", override]
    return LlamaCppExport(args, override, layer_buffers, not_expressible, notes, n_cpu_moe)


def _n_cpu_moe(layer_buffers: dict[int, str], primary_buffer: str) -> int | None:
    """N when the experts of the MoE layers below N are on the CPU and every other layer's on the GPU primary:
    llama.cpp's --n-cpu-moe N overrides the expert tensors of layers 0..N-1 (by index, dense layers included, which
    have none) to the CPU (llm_add_n_cpu_ffn_overrides in common/common.h)."""
    if primary_buffer == "CPU":
        return None
    cpu = [layer for layer, b in layer_buffers.items() if b == "CPU"]
    if not cpu:
        return None
    n = max(cpu) + 1
    exact = all((b == "CPU") == (layer < n) for layer, b in layer_buffers.items())
    gpu_rest = all(b in ("CPU", primary_buffer) for b in layer_buffers.values())
    return n if exact and gpu_rest else None


def parse_override_tensor(value: str) -> list[tuple[str, str]]:
    """Split an -ot value as llama.cpp does (at every comma, then at the first '='); for checking exports."""
    out = []
    for item in value.split(","):
        pattern, sep, buffer = item.partition("=")
        if not sep:
            raise ArgumentError(f"override {item!r}: no '=' (llama.cpp: invalid value)")
        re.compile(pattern)
        out.append((pattern, buffer))
    return out
