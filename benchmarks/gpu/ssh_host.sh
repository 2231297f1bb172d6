# The loop's trials through SSH on the machine they run on: sourced by the GPU tool's time-to-best run
# with --host ssh (benchmarks/gpu/tool/ttb.py). Starts the carried OpenSSH server (benchmarks/gpu/sshd_bundle.sh builds .sshd/) on a
# loopback port with its own loader and libraries, and registers it in the workspace as host
# $SSH_HOST_NAME, so `infergoal goal` there deploys, gates and benches every trial through the SSH
# host (orchestrator/hosts/ssh.py) instead of the local one.
#   - The login session has none of this command's environment: the host's `--python` is a wrapper
#     ($SSH_RUN/python) that sets the environment the tool runs with (CUDA, HF_HUB_OFFLINE, ...)
#     and appends the wheels' site dir to the PYTHONPATH the host tooling sets (its shipped code).
#   - The model: the orchestrator resolves forge:<preset> to its cache folder; the host has that
#     folder at the same path (same machine), so nothing is sent (`hostd model`), and the workspace's
#     model_cache = "auto" makes the same /dev/shm copy as a local run.
#   - The GPU lease is held on the host by `hostd lease` in $SSH_RUN/leases (sshd's SetEnv).
# Needs from the caller: ROOT WS_ROOT PY OUT WHEELS_SITE (the wheels' --target, or empty) and log(). Variables: SSHD_BUNDLE=$ROOT/.sshd
# SSH_RUN=$WS_ROOT/sshd-run SSH_HOST_NAME=gpu-ssh SSHD_LOGLEVEL=INFO.
SSHD_BUNDLE=${SSHD_BUNDLE:-$ROOT/.sshd}
SSH_RUN=${SSH_RUN:-$WS_ROOT/sshd-run}
SSH_HOST_NAME=${SSH_HOST_NAME:-gpu-ssh}
SSHD_PID=

sshd_config() {  # sshd_config RUN PORT: the server's config, the test suite's (tests/sshd_config.template)
  sed -e "s|@RUN@|$1|g" -e "s|@PORT@|$2|g" -e "s|@LOGLEVEL@|${SSHD_LOGLEVEL:-INFO}|g" "$ROOT/tests/sshd_config.template"
}

python_wrapper() {  # python_wrapper PY SITE: a Python for SSH sessions, with this shell's environment (not the lease
  # dir: the host's is sshd's SetEnv; not PYTHONPATH: the host tooling sets it to its shipped code, SITE goes after)
  echo '#!/bin/bash'
  echo "# written by benchmarks/gpu/ssh_host.sh: the environment the GPU tool ran with, for an SSH session"
  export -p | grep -vE '^declare -x (PWD|OLDPWD|SHLVL|_|PYTHONPATH|INFERGOAL_LEASE_DIR|HOME|USER|LOGNAME|MAIL|SSH_[A-Z_]*)(=|$)'
  [ -n "$2" ] && echo "export PYTHONPATH=\"\${PYTHONPATH:+\$PYTHONPATH:}$2\""
  echo "exec $1 \"\$@\""
}

ssh_host_up() {  # ssh_host_up WS: start the bundled sshd, register it in WS as $SSH_HOST_NAME
  local ws=$1 b=$SSHD_BUNDLE run=$SSH_RUN ld port user py site t0=$SECONDS
  ld=$(ls "$b"/ld-linux-*.so.* 2>/dev/null | head -1)
  if [ ! -f "$b/sshd" ] || [ -z "$ld" ]; then
    log "no sshd bundle in $b (build it with benchmarks/gpu/sshd_bundle.sh and carry .sshd)"; return 1
  fi
  rm -rf "$run"; mkdir -p "$run/leases"
  install -m 600 "$b/keys/host_ed25519" "$b/keys/user_ed25519" "$run/"
  cp "$b/keys/user_ed25519.pub" "$run/authorized_keys"
  chmod 755 "$ld" "$b/sshd" 2>/dev/null
  if [ "$(id -u)" = 0 ]; then  # privilege separation: a root-owned empty dir and an unprivileged user `sshd`
    mkdir -p /run/sshd && chown 0:0 /run/sshd && chmod 755 /run/sshd
    if ! grep -q '^sshd:' /etc/passwd; then
      echo "sshd:x:$(awk -F: 'BEGIN{u=100} $3>=u && $3<60000{u=$3+1} END{print u}' /etc/passwd):65534::/run/sshd:/usr/sbin/nologin" >> /etc/passwd
      log "added user sshd to /etc/passwd"
    fi
    # With UsePAM no, sshd refuses an account whose shadow password starts with "!" (locked), key or
    # not; a throwaway image's root may be so: "*" (no password, not locked) lets the key log in.
    if grep -q "^$(id -un):!" /etc/shadow 2>/dev/null; then
      sed -i "s/^$(id -un):![^:]*:/$(id -un):*:/" /etc/shadow; log "unlocked $(id -un) in /etc/shadow for the key login"
    fi
  fi
  port=$($PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  sshd_config "$run" "$port" > "$run/sshd_config"
  # No environment (nothing of this machine's), and no OpenSSL config file (the device's may be another version's).
  env -i OPENSSL_CONF=/dev/null "$ld" --library-path "$b/lib" "$b/sshd" -D -e -r -f "$run/sshd_config" </dev/null >>"$run/sshd.log" 2>&1 &
  SSHD_PID=$!
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    kill -0 "$SSHD_PID" 2>/dev/null || { log "sshd exited:"; cat "$run/sshd.log"; SSHD_PID=; return 1; }
    sleep 0.1
  done
  # What the daemon runs on: its loader and libraries from the bundle, none of this machine's.
  local libs; libs=$(awk '$6 ~ /\.so/ {print $6}' "/proc/$SSHD_PID/maps" 2>/dev/null | sort -u)
  log "sshd maps $(grep -c "^$b/" <<<"$libs") libraries from $b, others: $(grep -v "^$b/" <<<"$libs" | tr '\n' ' ')"
  user=$(id -un)
  py=$(command -v "$PY")
  python_wrapper "$py" "${WHEELS_SITE:-}" > "$run/python"; chmod 755 "$run/python"
  mkdir -p "$ws/.infergoal"
  read -r kind blob _ < "$b/keys/host_ed25519.pub"
  echo "[127.0.0.1]:$port $kind $blob" >> "$ws/.infergoal/known_hosts"  # the carried key, pinned (no trust on first use)
  if ! (cd "$ws" && $PY -m orchestrator.cli hosts add "$SSH_HOST_NAME" "ssh://$user@127.0.0.1:$port" --key "$run/user_ed25519" \
        --python "$run/python" --workdir "$WS_ROOT/ssh-host-work" && $PY -m orchestrator.cli hosts check "$SSH_HOST_NAME") \
        > "$run/register.log" 2>&1; then
    tail -12 "$run/register.log"; log "the SSH host does not answer; sshd's log:"; tail -20 "$run/sshd.log"; return 1
  fi
  tail -12 "$run/register.log"
  log "sshd $SSHD_PID on 127.0.0.1:$port ($(head -1 "$b/VERSION" 2>/dev/null)), host $SSH_HOST_NAME registered in $ws ($((SECONDS - t0))s)"
}

ssh_host_down() {  # stop the daemon and its sessions; its log to $OUT
  if [ -n "$SSHD_PID" ]; then
    pkill -TERM -P "$SSHD_PID" 2>/dev/null; kill "$SSHD_PID" 2>/dev/null; wait "$SSHD_PID" 2>/dev/null
    SSHD_PID=
  fi
  [ -f "$SSH_RUN/sshd.log" ] && cp "$SSH_RUN/sshd.log" "$OUT/sshd.log"
  ls "$SSH_RUN/leases" > "$OUT/ssh_leases.txt" 2>/dev/null
}
