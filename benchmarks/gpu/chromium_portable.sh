#!/usr/bin/env bash
# A portable headless Chromium + chromedriver for MiniWoB++ on a machine without them (no root):
# Debian's chromium packages and the shared libraries they need, fetched on a Debian machine,
# carried in parts of <= 38 MB, unpacked with `dpkg -x` into a prefix and run through wrapper
# scripts that set LD_LIBRARY_PATH for the browser alone (exported for the whole shell, the
# Debian libraries would also be loaded by Python and JAX).
#
#   bash benchmarks/gpu/chromium_portable.sh pack DEST         # on Debian 12: apt-get download the
#                                                          # packages into DEST/p1, p2, ...
#   bash benchmarks/gpu/chromium_portable.sh unpack DEST PREFIX  # anywhere with dpkg: unpack them
#   bash benchmarks/gpu/chromium_portable.sh check PREFIX      # headless page + selenium session
#   source benchmarks/gpu/chromium_portable.sh env PREFIX      # PATH, MINIWOB_CHROME_BINARY,
#                                                          # MINIWOB_CHROMEDRIVER for this shell
#
# `unpack` checks every package against DEST/SHA256SUMS (written by `pack`). `check` fails when
# the browser would load a library from outside PREFIX that the target may lack (anything but
# the C/C++ runtime, which every Linux has, and newer there than Debian 12's).
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then set -euo pipefail; fi  # not in a sourcing shell

# A call's carry holds 64 MiB with the working tree (~23 MB), so a part is at most 38 MB; a
# part of 53 MB (the old 55-MB default) did not travel and had to be split by hand.
PART_MB=${PART_MB:-38}    # a part folder holds at most this many MB
PIECE_MB=${PIECE_MB:-36}  # packages larger than this are split into pieces of this size
# chromium, chromium-common, chromium-driver and what `ldd` of the browser, its driver and its
# libraries resolves to on Debian 12 (libc6, libgcc-s1, libstdc++6 and zlib1g excluded: every
# target has them), plus dbus, the fonts and fontconfig's configuration
PACKAGES="chromium chromium-common chromium-driver fontconfig-config fonts-dejavu-core libexpat1
libdbus-1-3 libasound2 libasyncns0 libatk-bridge2.0-0 libatk1.0-0 libatspi2.0-0 libavahi-client3
libavahi-common3 libblkid1 libbrotli1 libbsd0 libcairo2 libcups2 libdatrie1 libdav1d6
libdouble-conversion3 libdrm2 libffi8 libflac12 libfontconfig1 libfreetype6 libfribidi0 libgbm1
libgcrypt20 libglib2.0-0 libgmp10 libgnutls30 libgraphite2-3 libgssapi-krb5-2
libharfbuzz-subset0 libharfbuzz0b libhogweed6 libidn2-0 libjpeg62-turbo libk5crypto3 libkrb5-3
libkrb5support0 liblcms2-2 liblz4-1 libmd0 libminizip1 libmount1 libmp3lame0 libmpg123-0
libnettle8 libnspr4 libnss3 libogg0 libopenh264-7 libopenjp2-7 libopus0 libp11-kit0
libpango-1.0-0 libpangocairo-1.0-0 libpangoft2-1.0-0 libpcre2-8-0 libpixman-1-0 libpng16-16
libpulse0 libsndfile1 libsystemd0 libtasn1-6 libthai0 libthai-data libudev1 libunistring2
libvorbis0a libvorbisenc2 libwayland-server0 libx11-6 libx11-data libx11-xcb1 libxau6
libxcb-render0 libxcb-shm0 libxcb1 libxcomposite1 libxdamage1 libxdmcp6 libxext6 libxfixes3
libxi6 libxkbcommon0 libxnvctrl0 libxrandr2 libxrender1 libzstd1 libkeyutils1 libcom-err2
libgpg-error0 libselinux1 libxshmfence1 libcap2 liblzma5 libwayland-client0"
# libraries the browser may take from the target system
SYSTEM_LIBS='^(libc|libm|libdl|libpthread|librt|libresolv|libutil|ld-linux-x86-64|libstdc\+\+|libgcc_s|libz)\.so'

die() { echo "chromium_portable: $*" >&2; exit 1; }

pack() {
    local dest=$1 tmp
    command -v apt-get >/dev/null || die "pack needs apt-get (Debian 12)"
    tmp=$(mktemp -d)
    # shellcheck disable=SC2086
    (cd "$tmp" && apt-get download $PACKAGES >/dev/null) || die "apt-get download failed"
    mkdir -p "$dest"
    (cd "$tmp" && sha256sum ./*.deb | sed 's# \./# #') > "$dest/SHA256SUMS"
    # split the large packages, then fill part folders (largest first) up to PART_MB each
    local f size part=1 used=0
    (cd "$tmp" && for f in *.deb; do
        if [ "$(stat -c %s "$f")" -gt $((PIECE_MB * 1000000)) ]; then
            split -b $((PIECE_MB * 1000000)) -d -a 2 "$f" "$f.piece-" && rm "$f"
        fi
    done)
    rm -rf "$dest"/p[0-9]*
    mkdir -p "$dest/p1"
    while read -r size f; do
        if [ $((used + size)) -gt $((PART_MB * 1000000)) ]; then
            part=$((part + 1)); used=0; mkdir -p "$dest/p$part"
        fi
        mv "$tmp/$f" "$dest/p$part/"; used=$((used + size))
    done < <(cd "$tmp" && stat -c '%s %n' -- * | sort -rn)
    rmdir "$tmp"
    du -sh "$dest"/p*
}

unpack() {
    local src=$1 prefix=$2 debs f base
    command -v dpkg >/dev/null || die "unpack needs dpkg (dpkg -x)"
    [ -f "$src/SHA256SUMS" ] || die "$src/SHA256SUMS missing (made by 'pack')"
    src=$(cd "$src" && pwd)  # the checksums are read from inside the unpacking folder
    mkdir -p "$prefix"
    prefix=$(cd "$prefix" && pwd)
    debs="$prefix/debs"
    rm -rf "$debs" "$prefix/root"; mkdir -p "$debs" "$prefix/root" "$prefix/bin"
    for f in "$src"/p*/*.deb; do [ -e "$f" ] && cp "$f" "$debs/"; done
    # pieces of one package, in order (-d suffixes sort numerically)
    for base in $(ls "$src"/p*/*.deb.piece-* 2>/dev/null | sed 's#.*/##; s#\.piece-[0-9]*$##' | sort -u); do
        cat $(ls "$src"/p*/"$base".piece-* | awk -F'.piece-' '{print $NF" "$0}' | sort -n | cut -d' ' -f2-) > "$debs/$base"
    done
    (cd "$debs" && sha256sum --quiet -c "$src/SHA256SUMS") || die "a package does not match SHA256SUMS (a part missing or damaged?)"
    for f in "$debs"/*.deb; do dpkg -x "$f" "$prefix/root"; done
    rm -rf "$debs"
    local root="$prefix/root" lib
    lib="$root/usr/lib/x86_64-linux-gnu:$root/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu/pulseaudio:$root/usr/lib/chromium"
    cat > "$prefix/fonts.conf" <<EOF
<?xml version="1.0"?>
<!DOCTYPE fontconfig SYSTEM "urn:fontconfig:fonts.dtd">
<fontconfig>
  <dir>$root/usr/share/fonts</dir>
  <dir>/usr/share/fonts</dir>
  <cachedir>$prefix/fontcache</cachedir>
</fontconfig>
EOF
    local name target
    for name in chromium chromedriver; do
        target="$root/usr/lib/chromium/chromium"
        [ "$name" = chromedriver ] && target="$root/usr/bin/chromedriver"
        [ -x "$target" ] || die "$target missing after unpacking"
        cat > "$prefix/bin/$name" <<EOF
#!/bin/sh
# $name from $root (made by benchmarks/gpu/chromium_portable.sh)
export LD_LIBRARY_PATH="$lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export FONTCONFIG_FILE="$prefix/fonts.conf"
export GIO_MODULE_DIR="$root/usr/lib/x86_64-linux-gnu/gio/modules"
exec "$target" "\$@"
EOF
        chmod +x "$prefix/bin/$name"
    done
    echo "unpacked into $prefix; use: source benchmarks/gpu/chromium_portable.sh env $prefix"
}

env_exports() {
    local prefix
    prefix=$(cd "$1" && pwd)
    [ -x "$prefix/bin/chromium" ] || { echo "chromium_portable: $prefix/bin/chromium missing (run unpack)" >&2; return 1; }
    export PATH="$prefix/bin:$PATH"
    export MINIWOB_CHROME_BINARY="$prefix/bin/chromium"
    export MINIWOB_CHROMEDRIVER="$prefix/bin/chromedriver"
}

check() {
    local prefix root lib outside html
    prefix=$(cd "$1" && pwd); root="$prefix/root"
    lib="$root/usr/lib/x86_64-linux-gnu:$root/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu/pulseaudio:$root/usr/lib/chromium"
    # 1. every library the browser and the driver load comes from the prefix (or the C runtime)
    for bin in "$root/usr/lib/chromium/chromium" "$root/usr/bin/chromedriver"; do
        outside=$(LD_LIBRARY_PATH="$lib" ldd "$bin" | awk '/=>/{print $1" "$3}' \
                  | grep -v " $root/" | grep -Ev "$SYSTEM_LIBS" || true)
        [ -z "$outside" ] || die "$(basename "$bin") loads libraries from outside $prefix: $outside"
        if LD_LIBRARY_PATH="$lib" ldd "$bin" | grep -q "not found"; then
            die "$(basename "$bin"): $(LD_LIBRARY_PATH="$lib" ldd "$bin" | grep 'not found' | tr '\n' ' ')"
        fi
    done
    echo "libraries: every one from $prefix or the C/C++ runtime"
    # (libraries opened at run time are not in ldd's list: see the loaded ones with
    # 'cat /proc/<pid>/maps' of a running browser; glibc's NSS plugins come from the system)
    # 2. a headless page renders
    html=$("$prefix/bin/chromium" --headless=new --no-sandbox --disable-gpu --dump-dom \
           'data:text/html,<p id=x>portable</p><script>document.getElementById("x").textContent+=" ok"</script>' 2>/dev/null)
    echo "$html" | grep -q "portable ok" || die "headless chromium did not render the test page"
    echo "headless chromium: rendered a page with JavaScript"
    "$prefix/bin/chromedriver" --version
    # 3. selenium through the driver, with the browser of the prefix (its version reported back)
    env_exports "$prefix"
    python3 - <<'EOF'
import os
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

options = webdriver.ChromeOptions()
for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
    options.add_argument(flag)
options.binary_location = os.environ["MINIWOB_CHROME_BINARY"]
driver = webdriver.Chrome(options=options, service=Service(executable_path=os.environ["MINIWOB_CHROMEDRIVER"]))
try:
    driver.get("data:text/html,<button id=b onclick=\"this.textContent='clicked'\">press</button>")
    driver.find_element("id", "b").click()
    assert driver.find_element("id", "b").text == "clicked"
    print("selenium: clicked a button in Chromium", driver.capabilities["browserVersion"],
          "via", os.environ["MINIWOB_CHROMEDRIVER"])
finally:
    driver.quit()
EOF
}

case "${1:-}" in
    pack) [ $# -eq 2 ] || die "usage: pack DEST"; pack "$2" ;;
    unpack) [ $# -eq 3 ] || die "usage: unpack DEST PREFIX"; unpack "$2" "$3" ;;
    check) [ $# -eq 2 ] || die "usage: check PREFIX"; check "$2" ;;
    env) [ $# -eq 2 ] || { echo "usage: source $0 env PREFIX" >&2; return 1 2>/dev/null || exit 1; }
         env_exports "$2" ;;
    *) die "usage: pack DEST | unpack DEST PREFIX | check PREFIX | (source) env PREFIX" ;;
esac
