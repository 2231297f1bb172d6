#!/bin/bash
# An OpenSSH server that runs on a machine with no sshd (the GPU device: a bare CUDA image, nothing
# to install, glibc version unknown): this machine's /usr/sbin/sshd with every library `ldd` lists
# and this machine's dynamic loader, started as `DIR/ld-linux-x86-64.so.2 --library-path DIR DIR/sshd`,
# so none of the device's own libraries is used (the processes sshd execs, the login shell and
# what it runs, are the device's own, as they should be). Plus a throwaway host key and user key.
#   benchmarks/gpu/sshd_bundle.sh [DIR]     # default .sshd/ at the repository root (~10 MB; carry it)
# benchmarks/gpu/ssh_host.sh starts it (the GPU tool's `ttb --host ssh`).
set -eu
DIR=${1:-$PWD/.sshd}
SSHD=${SSHD:-/usr/sbin/sshd}
rm -rf "$DIR"; mkdir -p "$DIR/lib" "$DIR/keys"
cp -L "$SSHD" "$DIR/sshd"
# Every library sshd links, and the loader itself (ldd prints it without "=>").
ldd "$SSHD" | awk '/=> \//{print $3} $1 ~ /^\/.*ld-linux/{print $1}' | sort -u | while read -r lib; do
  cp -L "$lib" "$DIR/lib/"
done
# Name-service modules glibc loads by name (nsswitch.conf: "compat" on some images; "files" is built in
# since glibc 2.34, carried anyway in case the device's nsswitch.conf names it and it is looked up).
for lib in libnss_compat.so.2 libnss_files.so.2; do
  for d in $(dirname "$(ldd "$SSHD" | awk '/libc\.so/{print $3}')"); do [ -f "$d/$lib" ] && cp -L "$d/$lib" "$DIR/lib/"; done
done
LD=$(ls "$DIR"/lib/ld-linux-*.so.* | head -1)
mv "$LD" "$DIR/"; LD=$DIR/$(basename "$LD")
chmod 755 "$DIR/sshd" "$LD"
ssh-keygen -q -t ed25519 -N "" -C infergoal-bundle-host -f "$DIR/keys/host_ed25519"
ssh-keygen -q -t ed25519 -N "" -C infergoal-bundle-user -f "$DIR/keys/user_ed25519"
"$DIR/sshd" -V 2>&1 | head -1 > "$DIR/VERSION"
ldd --version | head -1 >> "$DIR/VERSION"
# The bundle must stand alone: run its sshd's config test through its own loader, with no environment.
cat > "$DIR/check_config" <<EOF
HostKey $DIR/keys/host_ed25519
UsePAM no
EOF
env -i "$LD" --library-path "$DIR/lib" "$DIR/sshd" -t -f "$DIR/check_config" 2>&1 | grep -v "^$" || true
rm -f "$DIR/check_config"
echo "bundle in $DIR: $(du -sh "$DIR" | cut -f1), $(ls "$DIR/lib" | wc -l) libraries; $(head -1 "$DIR/VERSION")"
