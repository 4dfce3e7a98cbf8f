#!/usr/bin/env bash
# Builds the Debian packages of mgpu from the workspace: mgpu (the CLI), mgpu-scheduler and
# mgpu-node (the agent with mgpu-job-guard), each staged in OUT/stage/ from the
# release binaries and packaging/, then packed with dpkg-deb.
#
#   scripts/package.sh [--bin-dir DIR] [--out DIR] [--fast]
#
#   --bin-dir DIR   take the binaries from DIR (mgpu, mgpu-scheduler, mgpu-node,
#                   mgpu-job-guard) instead of building release ones (the tests package their
#                   debug build this way)
#   --out DIR       where the .deb files go (default target/debian)
#   --fast          gzip -1 instead of xz: quicker to build, larger files
#
# Prints the path of each package. The version is the workspace's (Cargo.toml); the
# architecture dpkg's. Binaries lose their debug sections (symbols stay, for backtraces).
# What each package installs, and why: packaging/README.md.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bin_dir="" out="$root/target/debian" compress=(-Zxz)
while [ $# -gt 0 ]; do
  case "$1" in
    --bin-dir) bin_dir="${2:?--bin-dir needs a directory}"; shift 2 ;;
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    --fast) compress=(-Zgzip -z1); shift ;;
    -h|--help) awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; exit 0 ;;
    *) echo "package.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
say() { printf '[package] %s\n' "$*" >&2; }
for tool in dpkg-deb dpkg objcopy objdump; do
  command -v "$tool" >/dev/null 2>&1 || { echo "package.sh: $tool is missing (dpkg-dev, binutils)" >&2; exit 1; }
done

if [ -z "$bin_dir" ]; then
  # The same builds as scripts/setup.sh --release, without its nats-server and tmux.
  say "building release binaries"
  cargo build --quiet --release --workspace --exclude mgpu-cli
  cargo build --quiet --manifest-path services/job-guard/Cargo.toml --target-dir target --release
  if ! cargo rustc --quiet --release -p mgpu-cli --bin mgpu -- \
      -C target-feature=+crt-static -C relocation-model=static 2> target/static-link.log; then
    say "could not link mgpu statically (see target/static-link.log); linking it dynamically"
    cargo build --quiet --release -p mgpu-cli
  fi
  bin_dir="$root/target/release"
fi
bin_dir="$(cd "$bin_dir" && pwd)"
for bin in mgpu mgpu-scheduler mgpu-node mgpu-job-guard mgpu-notify; do
  [ -x "$bin_dir/$bin" ] || { echo "package.sh: $bin_dir/$bin is missing" >&2; exit 1; }
done

version="$(awk '/^\[workspace.package\]/ { s = 1; next } /^\[/ { s = 0 } s && $1 == "version" { gsub(/"/, "", $3); print $3; exit }' Cargo.toml)"
[ -n "$version" ] || { echo "package.sh: no version in Cargo.toml's [workspace.package]" >&2; exit 1; }
arch="$(dpkg --print-architecture)"
stage="$out/stage"
rm -rf "$stage"
mkdir -p "$stage" "$out"

# put SRC DEST MODE: copies a file into the staged tree, making its directories.
put() { install -D -m "$3" "$1" "$2"; }
# put_bin NAME PKG: a binary into PKG's /usr/bin, without its debug sections.
put_bin() {
  local dest="$stage/$2/usr/bin/$1"
  install -D -m 0755 "$bin_dir/$1" "$dest"
  objcopy --strip-debug "$dest"
}
# docs PKG: the copyright file and README every package carries.
docs() {
  local dir="$stage/$1/usr/share/doc/$1"
  put packaging/README.md "$dir/README.md" 0644
  printf 'mgpu %s\nLicense: Apache-2.0 (/usr/share/common-licenses/Apache-2.0)\n' "$version" >"$dir/copyright"
  chmod 0644 "$dir/copyright"
}

# The CLI, its man pages and completions (generated from the binary itself).
put_bin mgpu mgpu
docs mgpu
man_dir="$stage/mgpu/usr/share/man/man1"
"$bin_dir/mgpu" man --out "$man_dir" >/dev/null
gzip -9n "$man_dir"/*.1
"$bin_dir/mgpu" completions bash >"$stage/mgpu.bash"
"$bin_dir/mgpu" completions zsh >"$stage/mgpu.zsh"
"$bin_dir/mgpu" completions fish >"$stage/mgpu.fish"
put "$stage/mgpu.bash" "$stage/mgpu/usr/share/bash-completion/completions/mgpu" 0644
put "$stage/mgpu.zsh" "$stage/mgpu/usr/share/zsh/vendor-completions/_mgpu" 0644
put "$stage/mgpu.fish" "$stage/mgpu/usr/share/fish/vendor_completions.d/mgpu.fish" 0644
rm -f "$stage"/mgpu.bash "$stage"/mgpu.zsh "$stage"/mgpu.fish

# The services: binary, unit, default configuration, and the directories they share.
units=/usr/lib/systemd/system
put_bin mgpu-scheduler mgpu-scheduler
put packaging/systemd/mgpu-scheduler.service "$stage/mgpu-scheduler$units/mgpu-scheduler.service" 0644
put packaging/etc/scheduler.toml "$stage/mgpu-scheduler/etc/mgpu/scheduler.toml" 0644
# The notification service ships with the scheduler: the same host, the same `mgpu` user.
put_bin mgpu-notify mgpu-scheduler
put packaging/systemd/mgpu-notify.service "$stage/mgpu-scheduler$units/mgpu-notify.service" 0644
put packaging/etc/notify.toml "$stage/mgpu-scheduler/etc/mgpu/notify.toml" 0644
docs mgpu-scheduler
for example in packaging/nats-server/nats-server.service packaging/nats-server/nats-server.conf packaging/nats-server/cluster/*.conf; do
  put "$example" "$stage/mgpu-scheduler/usr/share/doc/mgpu-scheduler/examples/${example#packaging/}" 0644
done
put_bin mgpu-node mgpu-node
# Beside mgpu-node, where the agent looks for it.
put_bin mgpu-job-guard mgpu-node
put packaging/systemd/mgpu-node.service "$stage/mgpu-node$units/mgpu-node.service" 0644
put packaging/etc/node.toml "$stage/mgpu-node/etc/mgpu/node.toml" 0644
docs mgpu-node
for pkg in mgpu-scheduler mgpu-node; do
  install -d -m 0755 "$stage/$pkg/etc/mgpu/keys" "$stage/$pkg/var/lib/mgpu"
done

# depends PKG: libc6 (at least the newest glibc symbol version its binaries use) and
# libgcc-s1 when they link libgcc_s (Rust's unwinder); nothing for static binaries.
depends() {
  local glibc="" gcc=0 bin v headers
  for bin in "$stage/$1"/usr/bin/*; do
    # Read whole, then matched: `grep -q` in a pipe would end objdump early (SIGPIPE).
    headers="$(objdump -p "$bin")"
    [[ "$headers" == *"NEEDED"*"libgcc_s"* ]] && gcc=1
    v="$(objdump -T "$bin" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -n1 || true)"
    if [ -n "$v" ] && { [ -z "$glibc" ] || [ "$(printf '%s\n%s\n' "$glibc" "$v" | sort -V | tail -n1)" = "$v" ]; }; then
      glibc="$v"
    fi
  done
  local deps=()
  [ -n "$glibc" ] && deps+=("libc6 (>= $glibc)")
  [ "$gcc" = 1 ] && deps+=("libgcc-s1")
  (IFS=,; echo "${deps[*]}" | sed 's/,/, /g')
}

for pkg in mgpu mgpu-scheduler mgpu-node; do
  dir="$stage/$pkg"
  install -d -m 0755 "$dir/DEBIAN"
  deps="$(depends "$pkg")"
  size="$(du -sk --exclude=DEBIAN "$dir" | cut -f1)"
  sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@INSTALLED_SIZE@/$size/" \
      -e "s/@DEPENDS@/$deps/" "packaging/debian/$pkg/control" \
    | { if [ -z "$deps" ]; then grep -v '^Depends: *$'; else cat; fi; } >"$dir/DEBIAN/control"
  for script in postinst prerm postrm; do
    if [ -f "packaging/debian/$pkg/$script" ]; then
      install -m 0755 "packaging/debian/$pkg/$script" "$dir/DEBIAN/$script"
    fi
  done
  # Everything under /etc is the administrator's once installed: dpkg keeps their edits.
  if [ -d "$dir/etc" ]; then
    (cd "$dir" && find etc -type f | sort | sed 's|^|/|') >"$dir/DEBIAN/conffiles"
  fi
  (cd "$dir" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z \
    | xargs -0 -r md5sum) >"$dir/DEBIAN/md5sums"
  deb="$out/${pkg}_${version}_${arch}.deb"
  dpkg-deb --root-owner-group "${compress[@]}" --build "$dir" "$deb" >/dev/null
  say "built $deb"
  echo "$deb"
done
