#!/usr/bin/env bash
# A command that outlives the GPU call that starts it, so a job list runs across the calls of one
# warm machine without being stopped and resumed at each call's end.
#
#   bash benchmarks/gpu/detached.sh start DIR [--snapshot] -- COMMAND...   # returns at once
#   bash benchmarks/gpu/detached.sh wait DIR SECONDS      # until it ends, or SECONDS pass
#   bash benchmarks/gpu/detached.sh stop DIR [SECONDS]    # SIGTERM to its processes, then
#                                                         # wait for them (default 120 s)
#
# The lent machine kills what a call leaves running when the call returns, except a process
# that started a new session (setsid), which runs on until the machine is given back
# (/work/.library/device/README.md). A job list run by `benchmarks/gpu/jobs.sh` inside one
# 600-s call had to be stopped near the call's end (SIGTERM, a 45-s checkpoint grace) and
# resumed by the next call, paying a start-up each time (docs/PERFORMANCE.md, "What a call
# boundary costs a resumed run"). Started here, jobs.sh runs once, its --budget the session's
# device time, while each call only waits:
#
#   call 1: ... && bash benchmarks/gpu/detached.sh start /tmp/det --snapshot -- \
#             bash benchmarks/gpu/jobs.sh ... --results /tmp/res --budget 1500 \
#             && bash benchmarks/gpu/detached.sh wait /tmp/det 560
#   call 2: bash benchmarks/gpu/detached.sh wait /tmp/det 590
#   call 3: bash benchmarks/gpu/detached.sh wait /tmp/det 400; tar czf $OUT/res.tgz -C /tmp res
#
# (the calls back to back in one message: a machine idle for ~30 s is given back, and the
# detached command with it). The last call packs the results folder itself, whether or not
# jobs.sh has ended: jobs.sh copies each job's small files there as the job ends, so a job
# still running then is all that is missing (its run dies with the machine in any case).
# --snapshot: the command runs in DIR/tree, a copy of the current folder taken at `start`, with
# every PYTHONPATH entry naming the current folder pointed at the copy. Each call replaces the
# files of the repository folder it runs in, so a command that imports or reads code later (a
# lazy import, a job list's next job) must not run from that folder while later calls come
# (2026-12-06: a job's lazy import failed with ModuleNotFoundError while the next call's copy
# was written). A copy already in DIR/tree is replaced.
# `start` refuses a DIR whose command still runs (exit 2). `wait` prints the lines the command's
# log (DIR/log) gained since the last `wait`, and exits with the command's exit status once it
# has ended (DIR/rc), or 124 while it still runs after SECONDS.
set -uo pipefail
usage() { sed -n '5,8p' "$0" | sed 's/^#   //' >&2; exit 2; }
[ $# -ge 2 ] || usage
mode=$1 dir=$2
shift 2

running() { [ -f "$dir/pid" ] && [ ! -f "$dir/rc" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; }

session_members() {  # session_members SID: "PID PGID" of each process of session SID
  local stat pid line pgrp session
  for stat in /proc/[0-9]*/stat; do
    pid=${stat#/proc/} && pid=${pid%/stat}
    { read -r line < "$stat"; } 2> /dev/null || continue  # gone since the glob
    read -r _ _ pgrp session _ <<< "${line##*) }"  # after the name: state ppid pgrp session
    [ "$session" = "$1" ] && echo "$pid $pgrp"
  done
  return 0
}

show_new_lines() {  # the log's lines after those an earlier wait showed
  local shown=0 total
  [ -f "$dir/shown" ] && shown=$(cat "$dir/shown")
  [ -f "$dir/log" ] || return 0
  total=$(wc -l < "$dir/log")
  [ "$total" -gt "$shown" ] && sed -n "$((shown + 1)),${total}p" "$dir/log"
  echo "$total" > "$dir/shown"
}

case $mode in
  start)
    snapshot=0
    [ "${1:-}" = "--snapshot" ] && { snapshot=1; shift; }
    [ "${1:-}" = "--" ] && shift
    [ $# -gt 0 ] || usage
    if running; then
      echo "detached: $dir already runs a command (pid $(cat "$dir/pid")): wait or stop it" >&2
      exit 2
    fi
    mkdir -p "$dir" && rm -f "$dir/rc" "$dir/shown" "$dir/log"
    dir=$(cd "$dir" && pwd)
    if [ "$snapshot" = 1 ]; then
      here=$(pwd)
      case "$dir/" in "$here"/*)
        echo "detached: --snapshot needs DIR outside the folder it copies ($here)" >&2; exit 2 ;;
      esac
      rm -rf "$dir/tree" && cp -a "$here" "$dir/tree" || exit 2
      if [ -n "${PYTHONPATH:-}" ]; then
        paths=() && IFS=: read -ra entries <<< "$PYTHONPATH"
        for e in "${entries[@]}"; do
          if [ "$e" = "$here" ] || [ "$e" = "$here/" ]; then e=$dir/tree; fi
          paths+=("$e")
        done
        PYTHONPATH=$(IFS=:; echo "${paths[*]}") && export PYTHONPATH
      fi
      cd "$dir/tree" || exit 2
      echo "detached: runs in a copy of $here: $dir/tree"
    fi
    # the new session's leader runs the command and records its exit status when it ends; it
    # outlives a SIGTERM to the group (`stop`) to record the status the command ends with
    setsid bash -c 'trap : TERM; "$@" > "$0/log" 2>&1 < /dev/null & child=$!
      while :; do wait "$child"; rc=$?; kill -0 "$child" 2>/dev/null || break; done
      echo "$rc" > "$0/rc.tmp" && mv "$0/rc.tmp" "$0/rc"' "$dir" "$@" < /dev/null > /dev/null 2>&1 &
    pid=$!
    echo "$pid" > "$dir/pid"
    # return only once the child leads its own session: until its setsid() it is still in this
    # call's process group, which the machine kills when the call returns
    for _ in $(seq 100); do
      [ "$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f4)" = "$pid" ] && break
      sleep 0.05
    done
    echo "detached: started pid $pid (its own session), log $dir/log"
    ;;
  wait)
    seconds=${1:?usage: detached.sh wait DIR SECONDS}
    [ -f "$dir/pid" ] || { echo "detached: nothing was started in $dir" >&2; exit 2; }
    end=$((SECONDS + seconds))
    while :; do
      show_new_lines
      if [ -f "$dir/rc" ]; then
        show_new_lines  # what it printed between the look above and its exit
        echo "detached: the command ended, exit $(cat "$dir/rc")"
        exit "$(cat "$dir/rc")"
      fi
      if ! kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
        echo "detached: the command is gone without an exit status (killed?)" >&2
        exit 2
      fi
      if [ "$SECONDS" -ge "$end" ]; then
        echo "detached: still running after $seconds s (pid $(cat "$dir/pid"))"
        exit 124
      fi
      sleep 2
    done
    ;;
  stop)
    # SIGTERM to every process group of the command's session, not only its own: a job that
    # jobs.sh runs under `timeout` leads a group of its own and went on running after a stop
    # that signalled the session's group alone (2026-12-06: two RL runs held the GPU until
    # their time limit, and the profiles started after the stop failed to allocate memory).
    # Then wait until no process of the session is left, so what comes next has the machine.
    seconds=${1:-120}
    [ -f "$dir/pid" ] || { echo "detached: nothing was started in $dir"; exit 0; }
    pid=$(cat "$dir/pid")
    groups=$(session_members "$pid" | cut -d' ' -f2 | sort -u)
    [ -n "$groups" ] || { echo "detached: nothing runs in $dir"; exit 0; }
    for group in $groups; do kill -TERM -- "-$group" 2> /dev/null; done
    echo "detached: SIGTERM to process group(s) $(echo $groups) of session $pid"
    end=$((SECONDS + seconds))
    while [ -n "$(session_members "$pid")" ]; do
      if [ "$SECONDS" -ge "$end" ]; then
        echo "detached: still running $seconds s after SIGTERM (pid pgid):" \
             "$(session_members "$pid" | tr '\n' ' ')" >&2
        exit 124
      fi
      sleep 1
    done
    echo "detached: every process of session $pid has ended"
    ;;
  *) usage ;;
esac
