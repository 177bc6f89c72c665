#!/usr/bin/env bash
# A real multi-node Slurm cluster on this one machine, for hetrl's tests and for trying the Slurm
# path on a laptop-class Debian/Ubuntu box (root required; it writes /etc/slurm/slurm.conf).
#
#   slurm/local/cluster.sh start    # install (apt) if needed, configure, start; idempotent
#   slurm/local/cluster.sh status   # daemons, nodes, partitions; exit 0 only when jobs can run
#   slurm/local/cluster.sh stop     # stop every daemon this script started
#
# Layout: virtual nodes gpu[1-4] (2 fake GPUs each) in partition `gpu`, cpu[1-4] in partition `cpu`,
# one slurmd per virtual node (hetjob components never share a node, so one node is not enough).
# Accounting goes through slurmdbd + MariaDB on loopback, so `sacct` (and submitit) see job states.
# Partitions `scale_gpu` (sgpu[1-1024], 8 GPUs) and `scale_cpu` (scpu[1-64]) are powered-down
# CLOUD nodes that never boot: they exist so `sbatch --test-only` can validate 128- and 1024-node
# renders. Never submit real jobs to them.
#
# Facts this relies on (seen on Debian 12, Slurm 22.05): hetjobs start only in the backfill pass
# (bf_interval=1,bf_hetjob_immediate makes that 1-2 s); gres File= must name character devices
# (plain files are rejected), so the fake GPUs are mknod'ed copies of /dev/null; `config_overrides`
# lets virtual nodes claim more CPUs than the host has.
set -euo pipefail

CLUSTER=hetrl
STATE=${HETRL_SLURM_STATE:-/var/lib/hetrl-slurm}
RUN=/run/hetrl-slurm
LOG=/var/log/hetrl-slurm
CONF=/etc/slurm/slurm.conf
DBD_CONF=/etc/slurm/slurmdbd.conf
GRES_CONF=/etc/slurm/gres.conf
NUM_GPU_NODES=4
NUM_CPU_NODES=4
GPUS_PER_NODE=2
GPU_PORT0=17000
CPU_PORT0=17100
DB_SOCKET=$RUN/mysqld.sock
DB_PASS=hetrl-local  # loopback-only database of a throwaway test cluster
HOST=$(hostname -s)

log() { printf 'cluster.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

node_names() {
  local i
  for i in $(seq 1 "$NUM_GPU_NODES"); do echo "gpu$i"; done
  for i in $(seq 1 "$NUM_CPU_NODES"); do echo "cpu$i"; done
}

install_packages() {
  local missing=()
  for bin in slurmctld slurmd sbatch slurmdbd munged mariadbd; do
    command -v "$bin" >/dev/null 2>&1 || [[ -x /usr/sbin/$bin ]] || missing+=("$bin")
  done
  (( ${#missing[@]} == 0 )) && return 0
  log "installing slurm, munge, slurmdbd, mariadb (missing: ${missing[*]})"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq slurmctld slurmd slurm-client slurmdbd munge mariadb-server >/dev/null
}

write_slurm_conf() {
  local gpu_last=$((GPU_PORT0 + NUM_GPU_NODES)) cpu_last=$((CPU_PORT0 + NUM_CPU_NODES))
  mkdir -p /etc/slurm "$STATE/ctld" "$RUN" "$LOG"
  cat >"$CONF" <<EOF
# Written by hetrl slurm/local/cluster.sh; rewritten on every start.
ClusterName=$CLUSTER
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# A requeued job may restart only once its old credentials expire (default 120 s): a test cluster
# need not wait that long.
AuthInfo=cred_expire=10
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/slurmd-%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,bf_hetjob_immediate
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SlurmdParameters=config_overrides
ReturnToService=2
# Reject requests larger than a partition at submission (like most production sites), not pend forever.
EnforcePartLimits=ALL
JobRequeue=1
KillWait=5
MinJobAge=600
InactiveLimit=0
SlurmdTimeout=60
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# The scale_* nodes are CLOUD nodes that stay powered down (for sbatch --test-only only).
SuspendProgram=/bin/true
ResumeProgram=/bin/true
SuspendTime=-1
SuspendExcParts=gpu,cpu
ResumeTimeout=60
NodeName=gpu[1-$NUM_GPU_NODES] NodeHostname=$HOST NodeAddr=127.0.0.1 Port=[$((GPU_PORT0 + 1))-$gpu_last] CPUs=8 RealMemory=4000 Gres=gpu:$GPUS_PER_NODE State=UNKNOWN
NodeName=cpu[1-$NUM_CPU_NODES] NodeHostname=$HOST NodeAddr=127.0.0.1 Port=[$((CPU_PORT0 + 1))-$cpu_last] CPUs=8 RealMemory=4000 State=UNKNOWN
NodeName=sgpu[1-1024] NodeAddr=127.0.0.1 Port=16999 CPUs=96 RealMemory=2000000 Gres=gpu:8 State=CLOUD
NodeName=scpu[1-64] NodeAddr=127.0.0.1 Port=16999 CPUs=96 RealMemory=2000000 State=CLOUD
PartitionName=gpu Nodes=gpu[1-$NUM_GPU_NODES] Default=YES MaxTime=INFINITE State=UP
PartitionName=cpu Nodes=cpu[1-$NUM_CPU_NODES] MaxTime=INFINITE State=UP
PartitionName=scale_gpu Nodes=sgpu[1-1024] MaxTime=INFINITE State=UP
PartitionName=scale_cpu Nodes=scpu[1-64] MaxTime=INFINITE State=UP
EOF
  # Fake GPUs: character devices (gres rejects plain files); c 1 3 is /dev/null's major/minor.
  local g
  for g in $(seq 0 $((GPUS_PER_NODE - 1))); do
    [[ -c /dev/hetrl_fake_gpu$g ]] || mknod /dev/hetrl_fake_gpu$g c 1 3
  done
  cat >"$GRES_CONF" <<EOF
NodeName=gpu[1-$NUM_GPU_NODES] Name=gpu File=/dev/hetrl_fake_gpu[0-$((GPUS_PER_NODE - 1))]
NodeName=sgpu[1-1024] Name=gpu Count=8
EOF
}

write_dbd_conf() {
  cat >"$DBD_CONF" <<EOF
# Written by hetrl slurm/local/cluster.sh.
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$LOG/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageLoc=slurm_acct_db
StorageUser=slurm
StoragePass=$DB_PASS
StoragePort=3306
EOF
  chmod 600 "$DBD_CONF"
}

running() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local seconds=$1 what=$2; shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    (( SECONDS < deadline )) || die "$what did not come up in ${seconds}s (logs: $LOG)"
    sleep 0.2
  done
}

start_munge() {
  pgrep -u munge -x munged >/dev/null && return 0
  [[ -s /etc/munge/munge.key ]] || { mungekey -c -f -k /etc/munge/munge.key; chown munge:munge /etc/munge/munge.key; }
  mkdir -p /run/munge && chown munge:munge /run/munge
  runuser -u munge -- /usr/sbin/munged
  wait_for 10 munged munge -n
}

start_mariadb() {
  if ! running "$RUN/mysqld.pid"; then
    mkdir -p "$RUN" && chown mysql:mysql "$RUN"
    [[ -d /var/lib/mysql/mysql ]] || mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
    nohup /usr/sbin/mariadbd --user=mysql --datadir=/var/lib/mysql --bind-address=127.0.0.1 --port=3306 \
      --socket="$DB_SOCKET" --pid-file="$RUN/mysqld.pid" >"$LOG/mariadb.log" 2>&1 &
    wait_for 30 mariadb mariadb --socket="$DB_SOCKET" -e 'select 1'
  fi
  mariadb --socket="$DB_SOCKET" -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db; \
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS'; \
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
}

start_slurmdbd() {
  running "$RUN/slurmdbd.pid" && return 0
  MYSQL_UNIX_PORT=$DB_SOCKET /usr/sbin/slurmdbd
  wait_for 30 slurmdbd sacctmgr -n list cluster
  sacctmgr -i -Q add cluster "$CLUSTER" >/dev/null 2>&1 || true
}

start_slurmctld() {
  running "$RUN/slurmctld.pid" && return 0
  /usr/sbin/slurmctld -i
  wait_for 30 slurmctld scontrol ping
}

start_slurmds() {
  local node
  for node in $(node_names); do
    running "$RUN/slurmd-$node.pid" || /usr/sbin/slurmd -N "$node"
  done
  wait_for 60 "the virtual nodes" all_nodes_idle
}

all_nodes_idle() {
  local states
  states=$(sinfo -h -p gpu,cpu -N -o '%T' | sort -u)
  [[ -n $states ]] && ! grep -qvE "^(idle|mixed|allocated|planned|completing)$" <<<"$states"
}

cmd_start() {
  [[ $(id -u) == 0 ]] || die "run as root (it installs packages and starts system daemons)"
  install_packages
  mkdir -p "$STATE" "$RUN" "$LOG"
  # Rewriting the config under running daemons would desynchronise them: only when stopped.
  running "$RUN/slurmctld.pid" || { write_slurm_conf; write_dbd_conf; }
  start_munge
  start_mariadb
  start_slurmdbd
  start_slurmctld
  start_slurmds
  # Nodes left DOWN by an earlier unclean stop come back here.
  scontrol update nodename="gpu[1-$NUM_GPU_NODES],cpu[1-$NUM_CPU_NODES]" state=resume >/dev/null 2>&1 || true
  wait_for 30 "the virtual nodes" all_nodes_idle
  log "up: $(sinfo -h -p gpu,cpu -o '%P=%D' | tr '\n' ' ')(accounting via slurmdbd)"
}

stop_pidfiles() {  # stop_pidfiles PIDFILE...: SIGTERM all at once, SIGKILL what is left after 15 s
  local file pids=()
  for file in "$@"; do
    running "$file" && pids+=("$(cat "$file")")
  done
  (( ${#pids[@]} )) || return 0
  kill "${pids[@]}" 2>/dev/null || true
  local deadline=$((SECONDS + 15)) pid
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null; do
      (( SECONDS < deadline )) || { log "pid $pid ignores SIGTERM: SIGKILL"; kill -9 "$pid"; break; }
      sleep 0.1
    done
  done
}

cmd_stop() {
  [[ $(id -u) == 0 ]] || die "run as root"
  local node slurmds=()
  if running "$RUN/slurmctld.pid"; then
    scancel --state=RUNNING,PENDING -u root >/dev/null 2>&1 || true
  fi
  for node in $(node_names); do slurmds+=("$RUN/slurmd-$node.pid"); done
  stop_pidfiles "${slurmds[@]}"
  stop_pidfiles "$RUN/slurmctld.pid"
  stop_pidfiles "$RUN/slurmdbd.pid"
  stop_pidfiles "$RUN/mysqld.pid"
  log "stopped (munged left running: other tools may use it)"
}

cmd_status() {
  local ok=0 node
  for d in slurmctld slurmdbd mysqld; do
    if running "$RUN/$d.pid"; then echo "$d: running (pid $(cat "$RUN/$d.pid"))"; else echo "$d: stopped"; ok=1; fi
  done
  for node in $(node_names); do
    running "$RUN/slurmd-$node.pid" || { echo "slurmd $node: stopped"; ok=1; }
  done
  if (( ok == 0 )); then
    sinfo -p gpu,cpu -o '%10P %5D %10T %N %G'
    all_nodes_idle || { echo "nodes not all up"; ok=1; }
  fi
  return $ok
}

case ${1:-} in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
