#!/usr/bin/env python3
"""Check a `Mentor Lab.app` statically, without a Mac: what macOS looks at before the first line
of the program runs, and what would make the launch fail.

- The executable is a Mach-O executable for arm64 (and x86_64 in a universal binary), with an
  LC_MAIN entry point and a code signature (the linker's ad-hoc one at least).
- LC_BUILD_VERSION says macOS, with the minimum version Info.plist declares.
- Every LC_LOAD_DYLIB is a system library or framework that macOS 12 has (no path into a build
  machine, no Homebrew library).
- Every undefined symbol is bound either to one of those libraries or, for the flat-namespace
  binds that `-undefined dynamic_lookup` leaves, has a name that one of the loaded frameworks
  exports (by the frameworks' naming prefixes): a symbol no loaded library has would stop the app
  at launch.
- Info.plist has the keys macOS needs, the icon it names exists and is a valid .icns, and the
  default models are inside with the target's licence and checksum.

Usage: check_macos_app.py "Mentor Lab.app"     (exit status 1 and a list of problems on failure)
"""
import hashlib
import plistlib
import re
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import macos_sdk  # noqa: E402  (the install names the link used)

ROOT = Path(__file__).resolve().parent.parent
CPU_ARM64, CPU_X86_64 = 0x0100000C, 0x01000007
MH_EXECUTE = 2
LC_SYMTAB, LC_LOAD_DYLIB, LC_CODE_SIGNATURE, LC_BUILD_VERSION = 0x2, 0xC, 0x1D, 0x32
LC_LOAD_WEAK_DYLIB, LC_REEXPORT_DYLIB, LC_MAIN = 0x80000018, 0x8000001F, 0x80000028
PLATFORM_MACOS = 1
DYNAMIC_LOOKUP_ORDINAL = 0xFE

# Which loaded library a flat-namespace symbol may come from, by its name's prefix (Objective-C
# class and metaclass references, C functions and constants of each framework).
FLAT_PREFIXES = {
    "AppKit": ["_OBJC_CLASS_$_NS", "_OBJC_METACLASS_$_NS", "_NS", "_kNS"],
    "Foundation": ["_OBJC_CLASS_$_NS", "_OBJC_METACLASS_$_NS", "_NS", "_kNS"],
    "CoreFoundation": ["_CF", "_kCF", "___CFConstantStringClassReference"],
    "CoreGraphics": ["_CG", "_kCG"],
    "ApplicationServices": ["_AX", "_kAX", "_CG", "_kCG", "_TIS", "_kTIS", "_LM"],
    "CoreVideo": ["_CV", "_kCV"],
    "Carbon": ["_TIS", "_kTIS", "_LM", "_kLM", "_UCKeyTranslate", "_KBGetLayoutType", "_GetCurrentEvent"],
    "QuartzCore": ["_OBJC_CLASS_$_CA", "_OBJC_METACLASS_$_CA", "_CA", "_kCA"],
    "Metal": ["_MTL", "_OBJC_CLASS_$_MTL"],
    "IOSurface": ["_IOSurface", "_kIOSurface"],
    "IOKit": ["_IO", "_kIO"],
    "OpenGL": ["_CGL", "_gl"],
    "Security": ["_Sec", "_kSec"],
    "CoreServices": ["_LS", "_kLS", "_FS", "_kFS", "_UT", "_kUT"],
    "objc": ["_objc_", "_OBJC_", "__objc_", "_class_", "_object_", "_sel_", "_method_", "_ivar_", "_protocol_",
             "_property_"],
    "iconv": ["_iconv", "_libiconv"],
}


class MachO:
    """One architecture's Mach-O image: header, load commands, undefined symbols."""

    def __init__(self, data: bytes):
        magic, self.cputype, _sub, self.filetype, ncmds, _size, _flags, _res = struct.unpack_from("<IiiIIIII", data)
        if magic != 0xFEEDFACF:
            raise ValueError(f"not a 64-bit little-endian Mach-O (magic {magic:#x})")
        self.dylibs, self.build, self.has_main, self.has_signature = [], None, False, False
        self.undefined = []  # (name, library ordinal)
        off = 32
        for _ in range(ncmds):
            cmd, size = struct.unpack_from("<II", data, off)
            if cmd in (LC_LOAD_DYLIB, LC_LOAD_WEAK_DYLIB, LC_REEXPORT_DYLIB):
                (name_off,) = struct.unpack_from("<I", data, off + 8)
                self.dylibs.append(data[off + name_off:off + size].split(b"\0", 1)[0].decode())
            elif cmd == LC_BUILD_VERSION:
                platform, minos, sdk = struct.unpack_from("<III", data, off + 8)
                self.build = (platform, minos, sdk)
            elif cmd == LC_MAIN:
                self.has_main = True
            elif cmd == LC_CODE_SIGNATURE:
                self.has_signature = True
            elif cmd == LC_SYMTAB:
                symoff, nsyms, stroff, _strsize = struct.unpack_from("<IIII", data, off + 8)
                for i in range(nsyms):
                    strx, ntype, _sect, desc, _value = struct.unpack_from("<IBBHQ", data, symoff + 16 * i)
                    if ntype & 0x0E == 0 and ntype & 0x01:  # N_UNDF, N_EXT
                        name = data[stroff + strx:].split(b"\0", 1)[0].decode(errors="replace")
                        self.undefined.append((name, (desc >> 8) & 0xFF))
            off += size


def slices(data: bytes):
    """(architecture name, image bytes) for a thin or fat (universal) file."""
    if data[:4] == b"\xca\xfe\xba\xbe":
        (n,) = struct.unpack_from(">I", data, 4)
        for i in range(n):
            cputype, _sub, offset, size, _align = struct.unpack_from(">iiIII", data, 8 + 20 * i)
            yield cputype, data[offset:offset + size]
    else:
        yield struct.unpack_from("<i", data, 4)[0], data


def version(v: int) -> str:
    return f"{v >> 16}.{(v >> 8) & 0xFF}.{v & 0xFF}"


def allowed_dylibs() -> dict:
    """Install name -> short name, for every library the stub SDK provides."""
    out = {macos_sdk.framework_install_name(f): f for f in macos_sdk.FRAMEWORKS}
    out.update({path: name for name, path in macos_sdk.LIBRARIES.items()})
    out["/usr/lib/libSystem.B.dylib"] = "System"
    return out


def check_executable(exe: Path, minos_plist: str, problems: list) -> list:
    data = exe.read_bytes()
    allowed = allowed_dylibs()
    report = []
    archs = []
    for cputype, image in slices(data):
        arch = {CPU_ARM64: "arm64", CPU_X86_64: "x86_64"}.get(cputype, f"cpu {cputype:#x}")
        archs.append(arch)
        try:
            m = MachO(image)
        except ValueError as e:
            problems.append(f"{arch}: {e}")
            continue
        if m.filetype != MH_EXECUTE or not m.has_main:
            problems.append(f"{arch}: not an executable with an entry point (filetype {m.filetype})")
        if not m.has_signature:
            problems.append(f"{arch}: no code signature (arm64 code must be signed, ad hoc at least)")
        if m.build is None:
            problems.append(f"{arch}: no LC_BUILD_VERSION")
        else:
            platform, minos, sdk = m.build
            if platform != PLATFORM_MACOS:
                problems.append(f"{arch}: built for platform {platform}, not macOS")
            if version(minos) != f"{minos_plist}.0" and version(minos) != minos_plist:
                problems.append(f"{arch}: minimum macOS {version(minos)}, Info.plist says {minos_plist}")
        short = []
        for d in m.dylibs:
            if d not in allowed:
                problems.append(f"{arch}: loads {d}, which is not a system library this app may use")
            short.append(allowed.get(d, d))
        flat = [name for name, ordinal in m.undefined if ordinal == DYNAMIC_LOOKUP_ORDINAL]
        bound = [(name, o) for name, o in m.undefined if 0 < o <= len(m.dylibs)]
        stray = [(name, o) for name, o in m.undefined if o != DYNAMIC_LOOKUP_ORDINAL and not 0 < o <= len(m.dylibs)]
        for name, o in stray:
            problems.append(f"{arch}: undefined symbol {name} has library ordinal {o}, which names no loaded library")
        loaded = set(short)
        for name in flat:
            sources = [lib for lib, prefixes in FLAT_PREFIXES.items()
                       if lib in loaded and any(name.startswith(p) for p in prefixes)]
            if not sources:
                problems.append(f"{arch}: flat-namespace symbol {name} matches none of the loaded frameworks")
        report.append(f"{arch}: minos {version(m.build[1]) if m.build else '?'}, {len(m.dylibs)} libraries "
                      f"({', '.join(short)}), {len(bound)} symbols bound to them, {len(flat)} flat-namespace binds, "
                      f"signature {'present' if m.has_signature else 'missing'}")
    if "arm64" not in archs:
        problems.append(f"no arm64 code in {exe} (found: {', '.join(archs)})")
    return report


def check_icns(path: Path, problems: list) -> None:
    data = path.read_bytes() if path.is_file() else b""
    if data[:4] != b"icns" or struct.unpack_from(">I", data, 4)[0] != len(data):
        problems.append(f"{path} is not a valid .icns file")
        return
    types, off = [], 8
    while off + 8 <= len(data):
        kind, size = data[off:off + 4].decode(errors="replace"), struct.unpack_from(">I", data, off + 4)[0]
        if size < 8:
            problems.append(f"{path}: entry {kind} has size {size}")
            return
        types.append(kind)
        off += size
    if not {"ic10", "ic09", "ic08"} & set(types):
        problems.append(f"{path} has no 256-1024 px image (entries: {', '.join(types)})")


def constant(name: str) -> str:
    m = re.search(rf'const {name}: &str = "([^"]+)";', (ROOT / "src" / "models.rs").read_text())
    return m.group(1) if m else ""


def check_models(resources: Path, problems: list) -> None:
    models = resources / "assets" / "models"
    target = models / constant("DEFAULT_TARGET_FILE")
    if not target.is_file():
        problems.append(f"the default target is not in the bundle ({target})")
    else:
        h = hashlib.sha256(target.read_bytes()).hexdigest()
        if h != constant("DEFAULT_TARGET_SHA256"):
            problems.append(f"{target} has SHA-256 {h}, not the published one")
        licence = models / f"{target.stem}.LICENSE.txt"
        if not licence.is_file() or "Apache License" not in licence.read_text():
            problems.append(f"the default target's licence text is not beside it ({licence})")
    if not (models / constant("DEFAULT_DRAFT_FILE")).is_file():
        problems.append("the default draft is not in the bundle")


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    app = Path(sys.argv[1])
    contents = app / "Contents"
    problems = []
    try:
        plist = plistlib.loads((contents / "Info.plist").read_bytes())
    except Exception as e:  # noqa: BLE001  (any parse failure is the finding)
        sys.exit(f"{contents / 'Info.plist'} does not parse: {e}")
    for key, want in [("CFBundleName", "Mentor Lab"), ("CFBundleDisplayName", "Mentor Lab"),
                      ("CFBundlePackageType", "APPL"), ("CFBundleIdentifier", "org.mentorlab.MentorLab"),
                      ("CFBundleExecutable", "Mentor Lab"), ("NSHighResolutionCapable", True)]:
        if plist.get(key) != want:
            problems.append(f"Info.plist: {key} is {plist.get(key)!r}, expected {want!r}")
    for key in ["CFBundleShortVersionString", "CFBundleVersion", "LSMinimumSystemVersion", "CFBundleIconFile"]:
        if not plist.get(key):
            problems.append(f"Info.plist lacks {key}")
    exe = contents / "MacOS" / str(plist.get("CFBundleExecutable", ""))
    report = []
    if not exe.is_file():
        problems.append(f"no executable at {exe}")
    else:
        report = check_executable(exe, str(plist.get("LSMinimumSystemVersion", "")), problems)
    icon = str(plist.get("CFBundleIconFile", ""))
    check_icns(contents / "Resources" / (icon if icon.endswith(".icns") else icon + ".icns"), problems)
    check_models(contents / "Resources", problems)
    sealed = (contents / "_CodeSignature" / "CodeResources").is_file()
    for line in report:
        print(f"check_macos_app: {line}")
    print(f"check_macos_app: bundle signature {'present' if sealed else 'absent (sign with rcodesign or codesign)'}")
    if problems:
        print("check_macos_app: FAILED", *problems, sep="\n  ")
        sys.exit(1)
    print(f"check_macos_app: {app} passes")


if __name__ == "__main__":
    main()
