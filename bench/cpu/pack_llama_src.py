"""A tarball of llama.cpp's source small enough to travel with the repository (.llama/llama-src.tgz).

From the llama-cpp-python source package (the version bench/vs_llamacpp.py names), its vendor/llama.cpp folder
trimmed to what the CPU and CUDA builds of llama-bench, llama-quantize and llama-imatrix need, plus
convert_hf_to_gguf.py with its conversion/ package and gguf-py: ggml's other backends, the other tools, examples,
tests, docs and vocabulary files are left out, and the two CMakeLists.txt that name what was left out (tools/,
vendor/) are rewritten to add only what is kept. The tarball unpacks to llama.cpp/.

    python bench/cpu/pack_llama_src.py [--sdist llama_cpp_python-0.3.36.tar.gz] [--out .llama/llama-src.tgz]

Without --sdist the source package is fetched with pip download (as bench/vs_llamacpp.py fetches it).
"""

from __future__ import annotations

import argparse
import ast
import io
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _version() -> str:
    """bench/vs_llamacpp.py's LLAMA_CPP_PYTHON, read from its source (importing it needs the engine)."""
    tree = ast.parse((ROOT / "bench" / "vs_llamacpp.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["LLAMA_CPP_PYTHON"]:
            return ast.literal_eval(node.value)
    raise SystemExit("bench/vs_llamacpp.py names no LLAMA_CPP_PYTHON")


LLAMA_CPP_PYTHON = _version()

# What is kept, relative to vendor/llama.cpp (a folder keeps everything under it, except DROP).
KEEP = [
    "CMakeLists.txt", "LICENSE", "cmake", "include", "src", "common", "ggml/CMakeLists.txt", "ggml/cmake",
    "ggml/include", "ggml/src", "vendor/nlohmann", "vendor/sheredom", "vendor/cpp-httplib", "tools/llama-bench",
    "tools/quantize", "tools/imatrix", "convert_hf_to_gguf.py", "conversion", "gguf-py",
]  # fmt: skip
GGML_BACKENDS_KEPT = ("ggml-cpu", "ggml-cuda")
DROP_PARTS = {"tests", "docs", "examples", ".github", "__pycache__"}

# The rewritten CMakeLists.txt: only the tools and vendored libraries kept.
TOOLS_CMAKE = """# trimmed: only llama-bench, llama-quantize and llama-imatrix (the importance matrix i-quants need)
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(llama-bench)
add_subdirectory(quantize)
add_subdirectory(imatrix)
"""
VENDOR_CMAKE = """# trimmed: only what llama-common needs
add_subdirectory(nlohmann)
add_subdirectory(sheredom)
if (LLAMA_BUILD_COMMON)
    add_subdirectory(cpp-httplib)
endif()
"""
REWRITTEN = {"tools/CMakeLists.txt": TOOLS_CMAKE, "vendor/CMakeLists.txt": VENDOR_CMAKE}


def kept(rel: Path) -> bool:
    """Whether a file (relative to vendor/llama.cpp) goes into the tarball."""
    text = rel.as_posix()
    if not any(text == k or text.startswith(k + "/") for k in KEEP):
        return False
    if DROP_PARTS & set(rel.parts):
        return False
    parts = rel.parts  # not another backend's folder (vulkan, metal, sycl, ...)
    return not (parts[:2] == ("ggml", "src") and len(parts) > 3 and parts[2] not in GGML_BACKENDS_KEPT)


def fetch_sdist(dest: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                    f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(dest)], check=True)  # fmt: skip
    return dest / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"


def pack(sdist: Path, out: Path) -> int:
    """Writes out; returns the number of files in it."""
    prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".partial")
    count = 0
    with tarfile.open(sdist) as src, tarfile.open(tmp, "w:gz") as dst:
        for member in src:
            if not member.name.startswith(prefix) or not (member.isfile() or member.issym()):
                continue
            rel = Path(member.name[len(prefix) :])
            if not kept(rel) or rel.as_posix() in REWRITTEN:
                continue
            member.name = "llama.cpp/" + rel.as_posix()
            member.pax_headers.pop("path", None)  # a long name's own record would win over the new name
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)
            count += 1
        for rel, text in REWRITTEN.items():
            data = text.encode()
            info = tarfile.TarInfo("llama.cpp/" + rel)
            info.size, info.mode = len(data), 0o644
            dst.addfile(info, io.BytesIO(data))
            count += 1
    tmp.rename(out)
    return count


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sdist", type=Path, help=f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz (default: pip download)")
    ap.add_argument("--out", type=Path, default=ROOT / ".llama" / "llama-src.tgz")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sdist = args.sdist or fetch_sdist(Path(tmp))
        count = pack(sdist, args.out)
    print(f"{args.out}: {count} files, {args.out.stat().st_size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
