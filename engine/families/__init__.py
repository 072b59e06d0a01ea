"""The model families the engine runs, one module each (engine/families/<family>.py), registered here once.

The readers of a Hugging Face folder (engine/checkpoints/checkpoint.py) and of a GGUF file
(engine/checkpoints/gguf_file.py), the model's configuration (engine/checkpoints/model_config.py), the loader
(engine/model.py) and the exports (engine/export/engines.py) look a family up here and do what it says; none of
them names a family. Adding a family is its module here, its file in native/src/models/ and its tests.
"""

from __future__ import annotations

from ..core.errors import UnsupportedError
from .base import Family
from .deepseek_v3 import DEEPSEEK_V3
from .deepseek_v4 import DEEPSEEK_V4
from .gpt_oss import GPT_OSS
from .qwen3 import QWEN3, QWEN3_MOE

FAMILIES: tuple[Family, ...] = (QWEN3_MOE, QWEN3, DEEPSEEK_V3, GPT_OSS, DEEPSEEK_V4)  # the families the core runs
BY_ARCHITECTURE = {f.architecture: f for f in FAMILIES}
BY_HF_CLASS = {c: f for f in FAMILIES for c in f.hf_classes}
BY_GGUF_ARCH = {f.gguf_arch: f for f in FAMILIES}
# Families awaiting their forward pass in the core: the readers know them, read and check their keys and then refuse
# them (Family.awaiting); they have no code in the core, no demo and no place in the placement, the exports or the
# window until they move to FAMILIES
AWAITING: tuple[Family, ...] = ()
AWAITING_BY_HF_CLASS = {c: f for f in AWAITING for c in f.hf_classes}
AWAITING_BY_GGUF_ARCH = {f.gguf_arch: f for f in AWAITING}


def family(architecture: str) -> Family:
    """The family of a ModelConfig.architecture ('deepseek_v3')."""
    found = BY_ARCHITECTURE.get(architecture)
    if found is None:
        raise UnsupportedError(f"architecture {architecture!r:.80} is not one the engine runs (expected one of "
                               f"{', '.join(BY_ARCHITECTURE)})")  # fmt: skip
    return found


def hf_family(class_name: str) -> Family | None:
    """The family of a config.json architectures name, an awaiting one included (None: no family has it)."""
    return BY_HF_CLASS.get(class_name) or AWAITING_BY_HF_CLASS.get(class_name)


def gguf_family(arch: str) -> Family | None:
    """The family of a GGUF file's general.architecture, an awaiting one included (None: no family has it)."""
    return BY_GGUF_ARCH.get(arch) or AWAITING_BY_GGUF_ARCH.get(arch)
