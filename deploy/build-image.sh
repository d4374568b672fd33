#!/usr/bin/env bash
# Builds the `atomos` image from nothing pulled: a statically linked release binary (glibc's
# static libraries, `-C target-feature=+crt-static`) copied onto `FROM scratch`.
# Usage: deploy/build-image.sh [TAG]   (default atomos:latest)
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:-atomos:latest}
target=x86_64-unknown-linux-gnu
# Its own target directory: the static flags would otherwise rebuild everything elsewhere.
export CARGO_TARGET_DIR=${ATOMOS_IMAGE_TARGET_DIR:-target/image}
# No debug information in the image (a tenth of the size).
CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=true \
  RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked -p atomos-cli \
  --target "$target" ${ATOMOS_IMAGE_CARGO_FLAGS:-}
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
cp "$CARGO_TARGET_DIR/$target/release/atomos" deploy/Dockerfile "$context/"
docker build --quiet -t "$tag" "$context"
echo "built $tag"
