"""Install the peer routers, inference-perf and a local tokenizer into bench/.venvs and bench/.cache.

    python -m bench.setup [--only vllm-router,sglang-router,inference-perf,tokenizer]

Idempotent: a venv whose marker file records the pinned version is left alone.  Each tool gets
its own venv (the routers pull fastapi/uvicorn, inference-perf needs Python >= 3.12 and
transformers), so nothing leaks into the project's .venv.  A tool that cannot be installed is
reported and skipped; the benchmarks then run without it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
VENVS = BENCH / ".venvs"
CACHE = BENCH / ".cache"
TOKENIZER = CACHE / "tokenizer-w3"  # 4 characters per token, like the simulator
_MARKER = ".bench-installed"


@dataclass(frozen=True, slots=True)
class Tool:
    name: str  # venv folder name
    requirement: str  # pinned pip requirement
    script: str  # console script that proves the install
    min_python: tuple[int, int] = (3, 10)


TOOLS = (
    Tool("vllm-router", "vllm-router==0.1.17", "vllm-router"),
    Tool("sglang-router", "sglang-router==0.3.2", "sglang-router"),
    Tool("inference-perf", "inference-perf==0.7.0", "inference-perf", min_python=(3, 12)),
)

# inference-perf needs a Hugging Face tokenizer and none can be downloaded here.  A word-level one
# over 4,095 three-letter words: random token ids decode to "abc def ..." and encode back to the same
# ids, so inference-perf's exact-length prompts converge (a byte-level BPE trained on a few words does
# not round-trip long random texts), and a token is 4 characters, the simulator's own token size.
_MAKE_TOKENIZER = r"""
import itertools, random, sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
words = ["".join(p) for p in itertools.product("abcdefghijklmnopqrstuvwxyz", repeat=3)]
random.Random(0).shuffle(words)
vocab = {"<|endoftext|>": 0}
for w in words[:4095]:
    vocab[w] = len(vocab)
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                        unk_token="<|endoftext|>", pad_token="<|endoftext|>",
                        model_max_length=1_000_000).save_pretrained(sys.argv[1])
"""


def venv_bin(name: str, script: str) -> Path | None:
    """The console script of an installed tool, or None when the tool is not installed."""
    venv = VENVS / name
    path = venv / "bin" / script
    return path if (venv / _MARKER).exists() and path.exists() else None


def tokenizer_dir() -> Path | None:
    return TOKENIZER if (TOKENIZER / "tokenizer.json").exists() else None


def find_python(min_version: tuple[int, int]) -> str | None:
    """An interpreter >= ``min_version``: this one, then pythonX.Y on PATH, then pyenv's."""
    if sys.version_info[:2] >= min_version:
        return sys.executable
    candidates = [f"python{min_version[0]}.{v}" for v in range(min_version[1], min_version[1] + 3)]
    # PATH first, then pyenv's own builds (its shims may point at a version not selected here)
    for c in candidates:
        found = shutil.which(c)
        if found and _version_ok(found, min_version):
            return found
    root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    versions = Path(root) / "versions"
    if versions.is_dir():  # the oldest that qualifies: the one the tools were verified with
        for d in sorted(versions.iterdir(), key=lambda d: _numeric(d.name)):
            exe = d / "bin" / "python"
            if exe.exists() and _numeric(d.name)[:2] >= min_version and _version_ok(str(exe), min_version):
                return str(exe)
    return None


def _numeric(version: str) -> tuple[int, ...]:
    parts = [int(p) for p in re.findall(r"\d+", version)]
    return tuple(parts) or (0,)


def _version_ok(exe: str, min_version: tuple[int, int]) -> bool:
    try:
        out = subprocess.run(
            [exe, "-c", "import sys; print(*sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return False
    return (int(out[0]), int(out[1])) >= min_version


def install(tool: Tool) -> str:
    """Create the tool's venv; returns a one-line status."""
    venv = VENVS / tool.name
    marker = venv / _MARKER
    if marker.exists() and marker.read_text().strip() == tool.requirement:
        return f"{tool.name}: already installed ({tool.requirement})"
    python = find_python(tool.min_python)
    if python is None:
        return f"{tool.name}: SKIPPED, needs Python >= {tool.min_python[0]}.{tool.min_python[1]} (none found)"
    if venv.exists():
        shutil.rmtree(venv)
    started = time.monotonic()
    log = VENVS / f"{tool.name}.install.log"
    try:
        with open(log, "wb") as out:
            subprocess.run([python, "-m", "venv", str(venv)], check=True, stdout=out, stderr=out)
            pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check"]
            subprocess.run([*pip, tool.requirement], check=True, timeout=900, stdout=out, stderr=out)
    except (OSError, subprocess.SubprocessError) as e:
        shutil.rmtree(venv, ignore_errors=True)
        tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.exists() else []
        return f"{tool.name}: FAILED ({e}; {' | '.join(tail)}); benchmarks run without it"
    marker.write_text(tool.requirement + "\n")
    return f"{tool.name}: installed {tool.requirement} in {time.monotonic() - started:.0f} s"


def build_tokenizer() -> str:
    if tokenizer_dir() is not None:
        return f"tokenizer: already built ({TOKENIZER})"
    python = venv_bin("inference-perf", "python")
    if python is None:
        return "tokenizer: SKIPPED (needs the inference-perf venv for tokenizers/transformers)"
    TOKENIZER.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(
            [str(python), "-c", _MAKE_TOKENIZER, str(TOKENIZER)],
            check=True,
            timeout=300,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
    except (OSError, subprocess.SubprocessError) as e:
        shutil.rmtree(TOKENIZER, ignore_errors=True)
        return f"tokenizer: FAILED ({e})"
    return f"tokenizer: built in {TOKENIZER}"


def setup(only: set[str] | None = None) -> list[str]:
    VENVS.mkdir(parents=True, exist_ok=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    lines = []
    for tool in TOOLS:
        if only is None or tool.name in only:
            print(f"[setup] {tool.name} ...", flush=True)
            lines.append(install(tool))
            print(f"[setup] {lines[-1]}", flush=True)
    if only is None or "tokenizer" in only:
        lines.append(build_tokenizer())
        print(f"[setup] {lines[-1]}", flush=True)
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.setup", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--only",
        default="",
        help="comma-separated subset of: " + ", ".join([t.name for t in TOOLS] + ["tokenizer"]),
    )
    args = ap.parse_args(argv)
    only = {s.strip() for s in args.only.split(",") if s.strip()} or None
    setup(only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
