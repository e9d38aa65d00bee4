#!/usr/bin/env bash
# Start a single-node Slurm on this machine (Debian 12, slurm-wlm 22.05), without systemd, for the
# `slurm`-marked tests and for trying sweeps out. All state lives under $ROOT; nothing under /etc is
# edited except the munge key the Debian package already creates.
#
# usage (as root):  ROOT=/tmp/quartet-slurm ACCT=0 bash cluster/slurm_local/up.sh
#                   source /tmp/quartet-slurm/env.sh        # exports SLURM_CONF for clients
# ACCT=1 also starts MariaDB + slurmdbd so that `sacct` works (needs mariadb-server slurmdbd).
# Stop with cluster/slurm_local/down.sh (same ROOT).
#
# Non-obvious settings (measured on the CI VM, see docs/cluster.md):
#  - slurmd -N localhost: the VM's hostname is not what slurm.conf names the node.
#  - DefMemPerCPU: otherwise every job asks for all node memory and jobs run one at a time.
#  - cred_expire=10 + sched_interval=5: a requeued job runs again after ~14 s instead of ~2-3 min.
#  - proctrack/linuxproc + task/none: no cgroups needed.
set -euo pipefail
ROOT=${ROOT:-/tmp/quartet-slurm}
ACCT=${ACCT:-0}
export SLURM_CONF=$ROOT/etc/slurm.conf

if [ "$(id -u)" != 0 ]; then echo "up.sh: must run as root (starts munged/slurmctld/slurmd)" >&2; exit 1; fi
for b in /usr/sbin/munged /usr/sbin/slurmctld /usr/sbin/slurmd sinfo; do
  command -v "$b" >/dev/null || { echo "up.sh: $b missing; apt-get install slurmctld slurmd slurm-client munge" >&2; exit 1; }
done
# Already up (e.g. CI started it and a test calls us again): nothing to do.
if [ -s "$SLURM_CONF" ] && sinfo -h -o %T 2>/dev/null | grep -Eq 'idle|mix|alloc'; then
  echo "export SLURM_CONF=$SLURM_CONF" > "$ROOT/env.sh"; echo "local Slurm already up ($SLURM_CONF)"; exit 0
fi

CPUS=$(nproc)
MEM=$(( $(awk '/MemTotal/{print int($2/1024)}' /proc/meminfo) * 8 / 10 ))
mkdir -p "$ROOT"/{etc,state,spool,log,run} "$ROOT"/munge/{run,log,lib}
chown -R munge:munge "$ROOT/munge"; chmod 700 "$ROOT/munge/log" "$ROOT/munge/lib"; chmod 755 "$ROOT/munge/run"
SOCK=$ROOT/munge/run/munge.socket.2
if [ ! -s /etc/munge/munge.key ]; then
  mkdir -p /etc/munge; dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
  chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
fi
runuser -u munge -- /usr/sbin/munged --socket="$SOCK" --pid-file="$ROOT/munge/run/munged.pid" \
    --log-file="$ROOT/munge/log/munged.log" --seed-file="$ROOT/munge/lib/munged.seed"

if [ "$ACCT" = 1 ]; then
  ACCTLINES="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
AccountingStoragePass=$SOCK"
else
  ACCTLINES="AccountingStorageType=accounting_storage/none"
fi
cat > "$SLURM_CONF" <<CONF
ClusterName=local
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCK,cred_expire=10
StateSaveLocation=$ROOT/state
SlurmdSpoolDir=$ROOT/spool/slurmd.%n
SlurmctldPidFile=$ROOT/run/slurmctld.pid
SlurmdPidFile=$ROOT/run/slurmd.%n.pid
SlurmctldLogFile=$ROOT/log/slurmctld.log
SlurmdLogFile=$ROOT/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
JobAcctGatherType=jobacct_gather/none
$ACCTLINES
JobCompType=jobcomp/filetxt
JobCompLoc=$ROOT/log/jobcomp.txt
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=5,bf_interval=5
MinJobAge=300
KillWait=5
JobRequeue=1
MaxArraySize=1001
NodeName=localhost CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF

if [ "$ACCT" = 1 ]; then
  D=$ROOT/db; mkdir -p "$D"/{data,run,log}; chown -R mysql:mysql "$D"
  [ -d "$D/data/mysql" ] || mariadb-install-db --user=mysql --datadir="$D/data" \
      --auth-root-authentication-method=socket > "$D/log/install.log" 2>&1
  setsid /usr/sbin/mariadbd --user=mysql --datadir="$D/data" --socket="$D/run/mysqld.sock" \
      --pid-file="$D/run/mysqld.pid" --port=3307 --bind-address=127.0.0.1 --log-error="$D/log/err.log" \
      --skip-log-bin < /dev/null > "$D/log/stdout.log" 2>&1 &
  for _ in $(seq 1 100); do [ -S "$D/run/mysqld.sock" ] && break; sleep 0.1; done
  mariadb -S "$D/run/mysqld.sock" -u root -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurmpw'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
  cat > "$ROOT/etc/slurmdbd.conf" <<CONF
AuthType=auth/munge
AuthInfo=socket=$SOCK
DbdHost=localhost
DbdPort=6819
SlurmUser=root
LogFile=$ROOT/log/slurmdbd.log
PidFile=$ROOT/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=3307
StorageUser=slurm
StoragePass=slurmpw
StorageLoc=slurm_acct_db
CONF
  chmod 600 "$ROOT/etc/slurmdbd.conf"
  /usr/sbin/slurmdbd
  for _ in $(seq 1 100); do grep -q 'slurmdbd version .* started' "$ROOT/log/slurmdbd.log" 2>/dev/null && break; sleep 0.1; done
fi

/usr/sbin/slurmctld -i
/usr/sbin/slurmd -N localhost
for _ in $(seq 1 100); do sinfo -h -o %T 2>/dev/null | grep -qx idle && break; sleep 0.1; done
sinfo -h -o %T | grep -qx idle || { echo "up.sh: node did not become idle; see $ROOT/log" >&2; exit 1; }
echo "export SLURM_CONF=$SLURM_CONF" > "$ROOT/env.sh"
echo "local Slurm up: export SLURM_CONF=$SLURM_CONF"
