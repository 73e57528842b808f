#!/usr/bin/env bash
# Build and link the arm64 macOS executable on Linux, with no Mac and no Apple SDK.
#
#   bundle/link_macos.sh [--profile PROFILE] [--target TRIPLE]
#
# Links with rust-lld (shipped with the Rust toolchain) against the stub SDK that
# bundle/macos_sdk.py lays out in target/macos-sdk: `-undefined dynamic_lookup` lets the system
# frameworks' symbols be bound at run time, and bundle/check_macos_app.py checks every one of them.
# Minimum macOS 12.0, as LSMinimumSystemVersion in Info.plist says. Prints the executable's path on
# its last line.
#
# PROFILE defaults to `release`; `mac-check` (no optimisation, no debug info) builds in a fraction
# of the time and gives the same load commands, for CI's static checks. On a Mac use
# bundle/make_bundle.sh, which builds with Apple's own linker.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
profile=release
target=aarch64-apple-darwin
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile="$2"; shift ;;
    --target) target="$2"; shift ;;
    *) echo "unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
  shift
done

sdk="$root/target/macos-sdk"
python3 "$here/macos_sdk.py" "$sdk" --cache "$root/target/macos-sdk-cache" >&2
rustup target add "$target" >&2
host="$(rustc -vV | sed -n 's/^host: //p')"
lld="$(rustc --print sysroot)/lib/rustlib/$host/bin/rust-lld"
[ -x "$lld" ] || { echo "no rust-lld at $lld (it ships with rustup's toolchains)" >&2; exit 1; }

export MACOSX_DEPLOYMENT_TARGET=12.0
export SDKROOT="$sdk"
# Target-specific variables, so that a Linux build in the same shell keeps its own settings.
triple_var="$(echo "$target" | tr 'a-z-' 'A-Z_')"
export "CARGO_TARGET_${triple_var}_LINKER=$lld"
export "CARGO_TARGET_${triple_var}_RUSTFLAGS=-C linker-flavor=ld64.lld \
-C link-arg=-undefined -C link-arg=dynamic_lookup \
-C link-arg=-syslibroot -C link-arg=$sdk \
-C link-arg=-L$sdk/usr/lib -C link-arg=-F$sdk/System/Library/Frameworks \
-C link-arg=-platform_version -C link-arg=macos -C link-arg=12.0 -C link-arg=15.0"
unset RUSTFLAGS
(cd "$root" && cargo build --locked --profile "$profile" --features metal --target "$target" >&2)
dir="$profile"
[ "$profile" = dev ] && dir=debug
exe="$root/target/$target/$dir/mentor-lab"
[ -f "$exe" ] || { echo "the build left no executable at $exe" >&2; exit 1; }
echo "$exe"
