#!/usr/bin/env bash
# Build "Mentor Lab.app".
#
#   bundle/make_bundle.sh                 on a Mac: release build with Metal, ad-hoc signed
#   bundle/make_bundle.sh --universal     on a Mac: arm64 + x86_64 in one binary (lipo)
#   bundle/make_bundle.sh --macos-from-linux [--profile PROFILE]
#                                         on Linux: the arm64 macOS executable linked here
#                                         (bundle/link_macos.sh; PROFILE release by default),
#                                         checked statically (bundle/check_macos_app.py) and, where
#                                         rcodesign is installed, signed ad hoc
#   bundle/make_bundle.sh --linux [--binary PATH]
#                                         anywhere: the same folder layout around a Linux
#                                         binary (to check the layout; it does not run on macOS)
#   --out DIR                             where to put the .app (default: target/bundle)
#
# Every bundle carries the default target model (SmolLM2-135M-Instruct, Apache-2.0, with its
# licence), so that a first launch works offline and without Python.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
out="$root/target/bundle"
mode=mac
universal=0
binary=""
profile=release
while [ $# -gt 0 ]; do
  case "$1" in
    --linux) mode=linux ;;
    --macos-from-linux) mode=macos-from-linux ;;
    --profile) profile="$2"; shift ;;
    --universal) universal=1 ;;
    --binary) binary="$2"; shift ;;
    --out) out="$2"; shift ;;
    *) echo "unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
  shift
done

version="$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$root/Cargo.toml" | head -n1)"
[ -n "$version" ] || { echo "no version in Cargo.toml" >&2; exit 1; }

if [ "$mode" = mac ]; then
  [ "$(uname -s)" = Darwin ] || { echo "the macOS bundle is built on a Mac; use --linux here" >&2; exit 1; }
  if [ "$universal" = 1 ]; then
    for t in aarch64-apple-darwin x86_64-apple-darwin; do
      rustup target add "$t"
      (cd "$root" && cargo build --release --features metal --target "$t")
    done
    mkdir -p "$root/target/universal"
    lipo -create -output "$root/target/universal/mentor-lab" \
      "$root/target/aarch64-apple-darwin/release/mentor-lab" "$root/target/x86_64-apple-darwin/release/mentor-lab"
    binary="$root/target/universal/mentor-lab"
  else
    (cd "$root" && cargo build --release --features metal)
    binary="$root/target/release/mentor-lab"
  fi
elif [ "$mode" = macos-from-linux ]; then
  binary="$(bash "$here/link_macos.sh" --profile "$profile" | tail -n1)"
elif [ -z "$binary" ]; then
  (cd "$root" && cargo build --release)
  binary="$root/target/release/mentor-lab"
fi
[ -x "$binary" ] || { echo "no executable at $binary" >&2; exit 1; }

app="$out/Mentor Lab.app"
rm -rf "$app"
mkdir -p "$app/Contents/MacOS" "$app/Contents/Resources"
sed "s/@VERSION@/$version/g" "$here/Info.plist.in" > "$app/Contents/Info.plist"
printf 'APPL????' > "$app/Contents/PkgInfo"
# Named as the app: macOS titles the application menu ("Quit Mentor Lab") after the process.
cp "$binary" "$app/Contents/MacOS/Mentor Lab"
chmod 755 "$app/Contents/MacOS/Mentor Lab"
# Assets (default draft, prompts, icon source) where the app looks for them inside a bundle.
mkdir -p "$app/Contents/Resources/assets"
for item in models prompts icon.png; do
  [ -e "$root/assets/$item" ] && cp -R "$root/assets/$item" "$app/Contents/Resources/assets/"
done
# The feature draft reads the target's hidden states on the CPU step only; the bundle runs on
# Metal, where it would only give an error. (It stays in the repository for CPU runs.)
rm -f "$app/Contents/Resources/assets/models/smollm2-135m-feature-draft.Q8_0.gguf"
python3 "$here/make_icon.py" icns "$root/assets/icon.png" "$app/Contents/Resources/AppIcon.icns"
python3 "$here/default_model.py" "$app/Contents/Resources/assets/models"

if [ "$mode" = mac ]; then
  plutil -lint "$app/Contents/Info.plist"
  codesign --force --deep -s - "$app"
  echo "built and ad-hoc signed: $app"
elif [ "$mode" = macos-from-linux ]; then
  python3 "$here/check_macos_app.py" "$app"
  if command -v rcodesign >/dev/null; then
    rcodesign sign "$app"
    echo "built, checked and ad-hoc signed: $app"
  else
    echo "built and checked: $app (only the linker's signature: sign with 'rcodesign sign', see docs/macos.md)"
  fi
else
  echo "built (Linux layout check): $app"
fi
