#!/usr/bin/env python3
"""Lay out the stub macOS SDK that `bundle/link_macos.sh` links against on Linux.

No package registry ships Apple's SDK. What the linker needs from it is, for every system library
the program links, the library's install name (where dyld finds it on a Mac) and, for libSystem,
its export list. So:

- libSystem.tbd (text stub with the real export list) comes from the `ziglang` wheel on PyPI,
  fetched with pip at build time into a cache and never committed. Two edits make rust-lld's TextAPI
  reader accept it: `arm64e.x1-*` targets are dropped, and `arm64-macos` is listed wherever only
  `arm64e-macos` is.
- Every framework and the other libraries get a stub with only their install name; their symbols
  are bound at run time by flat-namespace lookup (`-undefined dynamic_lookup`), and
  `bundle/check_macos_app.py` checks each such symbol against the frameworks it may come from.

Usage: macos_sdk.py SDK_DIR [--cache DIR]
"""
import argparse
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ZIGLANG = "ziglang==0.13.0"
LIBSYSTEM_MEMBER = "ziglang/lib/libc/darwin/libSystem.tbd"

# Frameworks the dependency graph links on macOS (winit, wgpu/metal, rfd, objc2, candle's Metal
# backend) and the version directory of each framework's binary.
FRAMEWORKS = {
    "AppKit": "C",
    "Foundation": "C",
    "CoreFoundation": "A",
    "CoreGraphics": "A",
    "CoreServices": "A",
    "ApplicationServices": "A",
    "QuartzCore": "A",
    "CoreVideo": "A",
    "Metal": "A",
    "MetalKit": "A",
    "MetalPerformanceShaders": "A",
    "CoreData": "A",
    "CoreImage": "A",
    "CoreText": "A",
    "IOSurface": "A",
    "IOKit": "A",
    "Carbon": "A",
    "OpenGL": "A",
    "Security": "A",
    "SystemConfiguration": "A",
    "UniformTypeIdentifiers": "A",
}
# Plain libraries besides libSystem: link name -> install name.
LIBRARIES = {
    "objc": "/usr/lib/libobjc.A.dylib",
    "iconv": "/usr/lib/libiconv.2.dylib",
    "c++": "/usr/lib/libc++.1.dylib",
    "resolv": "/usr/lib/libresolv.9.dylib",
}
# Names that are part of libSystem on macOS; `-lc`, `-lm`, `-lpthread` resolve to it.
LIBSYSTEM_ALIASES = ["c", "m", "pthread", "dl"]

STUB = """--- !tapi-tbd
tbd-version:     4
targets:         [ x86_64-macos, arm64-macos ]
install-name:    '{install}'
current-version: 1
...
"""


def framework_install_name(name: str) -> str:
    return f"/System/Library/Frameworks/{name}.framework/Versions/{FRAMEWORKS[name]}/{name}"


def fix_targets(text: str) -> str:
    """Drop `arm64e.x1-*` targets and add `arm64-macos` wherever only `arm64e-macos` is listed."""

    def fix(m: re.Match) -> str:
        items = [t.strip() for t in m.group(1).replace("\n", " ").split(",") if t.strip()]
        items = [t for t in items if not t.startswith("arm64e.x1")]
        if "arm64e-macos" in items and "arm64-macos" not in items:
            items.insert(items.index("arm64e-macos"), "arm64-macos")
        return "targets:         [ " + ", ".join(items) + " ]"

    return re.sub(r"targets:\s*\[([^\]]*)\]", fix, text)


def fetch_libsystem(cache: Path) -> str:
    """libSystem.tbd from the ziglang wheel (downloaded once into `cache`)."""
    cache.mkdir(parents=True, exist_ok=True)
    wheels = sorted(cache.glob("ziglang-*.whl"))
    if not wheels:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache), ZIGLANG]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"macos_sdk: `{' '.join(cmd)}` failed; libSystem's export list comes from that wheel.\n{done.stderr}")
        wheels = sorted(cache.glob("ziglang-*.whl"))
    with zipfile.ZipFile(wheels[0]) as z:
        return z.read(LIBSYSTEM_MEMBER).decode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sdk", type=Path)
    ap.add_argument("--cache", type=Path, default=None, help="where the ziglang wheel is kept")
    args = ap.parse_args()
    sdk: Path = args.sdk
    lib = sdk / "usr" / "lib"
    lib.mkdir(parents=True, exist_ok=True)
    libsystem = fix_targets(fetch_libsystem(args.cache or sdk.parent / "macos-sdk-cache"))
    (lib / "libSystem.tbd").write_text(libsystem)
    for alias in LIBSYSTEM_ALIASES:
        (lib / f"lib{alias}.tbd").write_text(libsystem)
    for name, install in LIBRARIES.items():
        (lib / f"lib{name}.tbd").write_text(STUB.format(install=install))
    fw_root = sdk / "System" / "Library" / "Frameworks"
    for name in FRAMEWORKS:
        d = fw_root / f"{name}.framework"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{name}.tbd").write_text(STUB.format(install=framework_install_name(name)))
    print(f"macos_sdk: stub SDK in {sdk} ({len(FRAMEWORKS)} frameworks, libSystem from {ZIGLANG})")


if __name__ == "__main__":
    main()
