#!/bin/sh
# Debian's headless Chromium for the documentation's browser test (tests/docs/), unpacked into the venv like the
# Makefile's Debian data packages (apt-get download + dpkg -x), never installed system-wide, no root needed.
# The libraries below are the ones chromium-headless-shell links against that a slim Debian 12 image lacks; those
# it already has are left to the system. Usage: sh docs/site_gen/get_chromium.sh [VENV] (default .venv).
set -eu
VENV=${1:-.venv}
DEST="$VENV/debian/chromium"
PACKAGES="chromium-headless-shell chromium-common libopenh264-7 libdouble-conversion3 libopus0 libharfbuzz-subset0
libxnvctrl0 libpulse0 libflac12 libminizip1 libogg0 libsndfile1 libasyncns0 libmp3lame0 libmpg123-0 libvorbis0a
libvorbisenc2"
BIN="$DEST/usr/lib/chromium/chromium-headless-shell"
if [ -x "$BIN" ]; then
    echo "chromium already unpacked: $BIN"
    exit 0
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$DEST"
# shellcheck disable=SC2086 # one word per package
(cd "$WORK" && apt-get download $PACKAGES)
for deb in "$WORK"/*.deb; do
    dpkg -x "$deb" "$DEST"
done
LIBS="$(cd "$DEST" && pwd)/usr/lib/x86_64-linux-gnu"
if LD_LIBRARY_PATH="$LIBS:$LIBS/pulseaudio" ldd "$BIN" | grep "not found"; then
    echo "chromium-headless-shell still lacks the libraries above: add their Debian packages to $0" >&2
    exit 1
fi
echo "chromium unpacked: $BIN"
