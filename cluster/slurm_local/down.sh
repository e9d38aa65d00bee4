#!/usr/bin/env bash
# Stop what up.sh started (same ROOT), by PID file; safe to call twice or when nothing runs.
# usage: ROOT=/tmp/quartet-slurm bash cluster/slurm_local/down.sh
ROOT=${ROOT:-/tmp/quartet-slurm}
export SLURM_CONF=$ROOT/etc/slurm.conf
[ -s "$SLURM_CONF" ] && timeout 20 scontrol shutdown >/dev/null 2>&1   # stops slurmctld + slurmd
for f in "$ROOT/run/slurmctld.pid" "$ROOT/run/slurmd.localhost.pid" "$ROOT/run/slurmdbd.pid" \
         "$ROOT/db/run/mysqld.pid" "$ROOT/munge/run/munged.pid"; do
  [ -s "$f" ] || continue
  p=$(cat "$f")
  if kill -0 "$p" 2>/dev/null; then
    kill -TERM "$p"
    for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$p" 2>/dev/null && kill -KILL "$p"
  fi
  rm -f "$f"
done
rm -f "$ROOT/env.sh"
echo "local Slurm stopped ($ROOT)"
exit 0
