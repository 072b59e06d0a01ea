"""The F32 fixture models as quantized GGUF files, for tests of the q8 precision (a plain module: conftest names clash
between test folders)."""

from pathlib import Path

import gguf
from gguf_models import gguf_tensors, to_gguf  # tests/gguf_models.py


def q8_0_gguf(folder: Path, out: Path) -> Path:
    """`folder` written as GGUF with every matrix Q8_0 and the norms and the router F32, as llama.cpp's Q8_0 keeps
    them."""
    qtypes = {name: gguf.GGMLQuantizationType.Q8_0 for name, a in gguf_tensors(folder).items()
              if a.ndim >= 2 and "ffn_gate_inp" not in name}  # fmt: skip
    return to_gguf(folder, out, qtypes=qtypes)[0]
