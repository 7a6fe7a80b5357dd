#!/usr/bin/env bash
# Every command of the deltamem CLI on a large bank, timed in one run, with
# the disk's sequential write speed beside it (issue 15's table).
#
#   tools/bench-million.sh [--rows N] [--dim D] [--precision f32|f16|int8]
#                          [--rounds R] [--work DIR] [--keep]
#                          [--memory-limit-mb M]
#
# Defaults: 1,000,000 x 768 f32, 3 rounds, work dir target/bench-million.
# The larger-than-memory run of the issue is
#   tools/bench-million.sh --rows 10000000 --dim 384 --precision f16 \
#       --memory-limit-mb 2048
# --memory-limit-mb runs every timed command inside a memory cgroup (v2
# memory.max or v1 memory.limit_in_bytes; needs root) that caps heap AND
# page cache, so a bank larger than M does not fit in the memory the
# command may use: scans and maintenance then read from the disk. "warm
# cache" then means as warm as the cap allows; the table adds the disk's
# cold sequential read speed (cat of the bank, caches dropped, in the cgroup).
#
# Each round, in this order (so rounds interleave and see the same machine):
#   dd          a file of the bank's size, bs=4M conv=fdatasync (MB/s), then
#               the same with oflag=direct (around the page cache, as a
#               load writes its vectors)
#   import      init + `import --npy` of the whole matrix (read back into
#               the page cache first) into a fresh bank; then its disk peer: the bytes the import wrote (the bank's
#               size) written to one file in 4 MiB writes with an
#               fdatasync after each group's share, as the import makes
#               each group of batches (4,096 rows each, together >= 64 MiB
#               of f32 vectors: LOAD_GROUP_BYTES) durable before the next
#   query       one query (k = 10, one thread) in a fresh process right
#               after the import (the bank not in the page cache: a load
#               writes around it); then the same with the page cache
#               warm; beside it the warm in-process query of the same bank
#               (examples/bench_scan scan: median of 5 after a first query)
#   stats       warm, then cold (echo 3 > /proc/sys/vm/drop_caches; needs
#               root, else reported as n/a)
#   verify      after reading the bank back into the page cache
#   freeze      into a new directory (the CLI then reads back and checks
#               all but the copy's vector columns), then again with
#               --verify-vectors (the whole copy read back); each also as
#               a ratio to the faster of the round's two dd figures
#   compact     the live bank
#   import_cold `import --npy` again into a second bank, the page cache
#               dropped first (root only), the bank deleted after
# Every command runs with DELTAMEM_PEAK_HEAP=1: the binary's counting
# allocator prints its peak live heap (mapped files are not heap).
# Prints a Markdown table of medians (min-max in brackets) on stdout; raw
# figures go to DIR/results.txt. Needs about 2.2x the bank's size on disk
# (matrix, bank, frozen copy); banks are deleted at the end unless --keep.
set -euo pipefail
cd "$(dirname "$0")/.."

ROWS=1000000 DIM=768 PRECISION=f32 ROUNDS=3 WORK=target/bench-million KEEP=0 LIMIT_MB=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --rows) ROWS=$2; shift 2 ;;
        --dim) DIM=$2; shift 2 ;;
        --precision) PRECISION=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --work) WORK=$2; shift 2 ;;
        --keep) KEEP=1; shift ;;
        --memory-limit-mb) LIMIT_MB=$2; shift 2 ;;
        *) echo "bench-million: unknown argument $1" >&2; exit 2 ;;
    esac
done

# BENCH_BIN_DIR: take deltamem and bench_scan from there instead of
# building (e.g. a copy, so a build during a long run cannot swap them).
if [[ -n "${BENCH_BIN_DIR:-}" ]]; then
    D="$BENCH_BIN_DIR/deltamem" H="$BENCH_BIN_DIR/bench_scan"
else
    cargo build --release --bin deltamem --example bench_scan >&2
    TARGET="${CARGO_TARGET_DIR:-target}/release"
    D="$TARGET/deltamem" H="$TARGET/examples/bench_scan"
fi
mkdir -p "$WORK"
DATA="$WORK/data-${ROWS}x${DIM}.npy"
QUERIES="$WORK/queries-${ROWS}x${DIM}.npy"
ONE="$WORK/query1-${DIM}.npy"
if [[ ! -f "$DATA" || ! -f "$QUERIES" ]]; then
    echo "bench-million: writing the ${ROWS} x ${DIM} matrix" >&2
    # An f16 bank imports an f16 matrix (half the bytes on disk).
    "$H" gen "$DATA" "$ROWS" "$DIM" 20240607 "$QUERIES" 16 "$([[ $PRECISION == f16 ]] && echo f16 || echo f32)"
fi
[[ -f "$ONE" ]] || "$H" gen "$WORK/unused.npy" 1 "$DIM" 7 "$ONE" 1
BANK="$WORK/bank-$PRECISION"
FROZEN="$WORK/frozen-$PRECISION"
RESULTS="$WORK/results.txt"
: > "$RESULTS"

now() { date +%s.%N; }
calc() { awk "BEGIN { printf \"%.6f\", $1 }"; }
last() { grep "^$1 " "$RESULTS" | tail -1 | cut -d' ' -f2; }
record() { echo "$1 $2" >> "$RESULTS"; }

# A memory cgroup for --memory-limit-mb (cgroup v2, else v1). `capped CMD`
# runs CMD inside it; without a limit it just runs CMD.
CGROUP=""
if [[ $LIMIT_MB != 0 ]]; then
    if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
        CGROUP=/sys/fs/cgroup/deltamem-bench; mkdir -p "$CGROUP"
        echo $(( LIMIT_MB * 1048576 )) > "$CGROUP/memory.max"
    elif [[ -d /sys/fs/cgroup/memory ]]; then
        CGROUP=/sys/fs/cgroup/memory/deltamem-bench; mkdir -p "$CGROUP"
        echo $(( LIMIT_MB * 1048576 )) > "$CGROUP/memory.limit_in_bytes"
    else
        echo "bench-million: --memory-limit-mb needs a writable memory cgroup" >&2; exit 2
    fi
    echo "bench-million: commands run in $CGROUP, capped at $LIMIT_MB MB (heap and page cache)" >&2
fi
capped() {
    if [[ -z $CGROUP ]]; then "$@"; return; fi
    bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' capped "$CGROUP" "$@"
}

# run NAME CMD...: times one command (stdout discarded, stdin empty) and
# records its seconds and peak heap.
run() {
    local name=$1; shift
    local start end
    start=$(now)
    if ! DELTAMEM_PEAK_HEAP=1 capped "$@" < /dev/null > "$WORK/stdout" 2> "$WORK/stderr"; then
        echo "bench-million: $name failed:" >&2; cat "$WORK/stderr" >&2; exit 1
    fi
    end=$(now)
    record "$name.s" "$(calc "$end - $start")"
    record "$name.heap_mb" "$(sed -n 's/^deltamem: peak heap \([0-9]*\) bytes$/\1/p' "$WORK/stderr" | awk '{printf "%.1f", $1 / 1048576}')"
}

drop_caches() {
    sync
    if [[ -w /proc/sys/vm/drop_caches ]]; then echo 3 > /proc/sys/vm/drop_caches; return 0; fi
    return 1
}

# Page cache is charged to the cgroup that first read a page, so under a
# cap the cache is dropped before import and warmed inside the cgroup:
# pages cached outside it would be free reads for the capped command.
warm_cache() { capped bash -c "cat '$1'/* > /dev/null"; }

for round in $(seq 1 "$ROUNDS"); do
    echo "bench-million: round $round of $ROUNDS" >&2
    rm -rf "$BANK" "$FROZEN"
    # dd: as many 4 MiB blocks as the matrix has bytes.
    blocks=$(( ($(stat -c %s "$DATA") + 4194303) / 4194304 ))
    dd_out=$(dd if=/dev/zero of="$WORK/dd.tmp" bs=4M count="$blocks" conv=fdatasync 2>&1 | tail -1)
    rm -f "$WORK/dd.tmp"
    record dd.mb_s "$(echo "$dd_out" | sed -n 's/^\([0-9]*\) bytes.*copied, \([0-9.]*\) s.*$/\1 \2/p' | awk '{printf "%.0f", $1 / $2 / 1e6}')"
    # The same around the page cache (O_DIRECT), as a load writes its vectors.
    dd_out=$(dd if=/dev/zero of="$WORK/dd.tmp" bs=4M count="$blocks" oflag=direct conv=fdatasync 2>&1 | tail -1)
    rm -f "$WORK/dd.tmp"
    record dd_direct.mb_s "$(echo "$dd_out" | sed -n 's/^\([0-9]*\) bytes.*copied, \([0-9.]*\) s.*$/\1 \2/p' | awk '{printf "%.0f", $1 / $2 / 1e6}')"

    "$D" --quiet init "$BANK" --dim "$DIM" --tree all --precision "$PRECISION" > /dev/null
    if [[ -n $CGROUP ]]; then drop_caches || true; fi
    # The import reads a matrix in the page cache (as right after writing
    # it); a cold-cache step of the previous round (stats, below) dropped
    # it, so it is read back first. The import of a cold matrix is timed
    # apart, at the end of the round. Each round records how much of the
    # matrix the page cache held as the import started.
    capped cat "$DATA" > /dev/null
    if command -v fincore > /dev/null; then
        record import.source_cached_pct "$(fincore --bytes --noheadings -o RES,SIZE "$DATA" | awk '{printf "%.0f", $2 ? 100 * $1 / $2 : 0}')"
    fi
    run import "$D" --quiet import "$BANK" --tree all --npy "$DATA"
    record import.rows_s "$(calc "$ROWS / $(last import.s)")"
    bank_bytes=$(du -sb "$BANK" | cut -f1)
    record bank.mb "$(calc "$bank_bytes / 1000000")"
    group_batches=$(( (67108864 + 4096 * DIM * 4 - 1) / (4096 * DIM * 4) ))
    group_rows=$(( 4096 * group_batches ))
    peer_s=$(python3 - "$WORK/peer.tmp" "$bank_bytes" $(( (ROWS + group_rows - 1) / group_rows )) <<'EOF'
import os, sys, time
path, total, pieces = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
block = memoryview(os.urandom(4 << 20))
per_piece = -(-total // pieces)
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
start = time.perf_counter()
done = 0
while done < total:
    end = min(done + per_piece, total)
    while done < end:
        done += os.write(fd, block[: min(len(block), end - done)])
    os.fdatasync(fd)
print(f"{time.perf_counter() - start:.6f}")
os.close(fd)
os.unlink(path)
EOF
)
    record peer.s "$peer_s"
    record peer.mb_s "$(calc "$bank_bytes / $peer_s / 1e6")"
    record import.vs_peer "$(calc "$peer_s / $(last import.s)")"
    record import.mb_s "$(calc "$bank_bytes / $(last import.s) / 1e6")"

    # A load writes around the page cache: the first query reads the bank
    # from the disk.
    run query_after_import "$D" --quiet query "$BANK" --tree all --npy "$ONE" --k 10 --threads 1
    warm_cache "$BANK"
    run query "$D" --quiet query "$BANK" --tree all --npy "$ONE" --k 10 --threads 1
    # Under a memory cap every scan reads the disk: three scans of one
    # query, not five rounds of sixteen.
    if [[ -n $CGROUP ]]; then
        inproc=$(capped "$H" scan "$BANK" "$ONE" 10 1 3)
    else
        inproc=$(capped "$H" scan "$BANK" "$QUERIES" 10 1 5)
    fi
    record query_warm_inprocess.s "$(echo "$inproc" | sed -n 's/.*"median_ms":\([0-9.]*\).*/\1/p' | awk '{print $1 / 1000}')"
    record query_first_inprocess.s "$(echo "$inproc" | sed -n 's/.*"first_query_ms":\([0-9.]*\).*/\1/p' | awk '{print $1 / 1000}')"

    run stats_warm "$D" --quiet stats "$BANK"
    if [[ -n $CGROUP ]] && drop_caches; then
        run read_cold bash -c "cat '$BANK'/* > /dev/null"
        record read_cold.mb_s "$(calc "$bank_bytes / $(last read_cold.s) / 1e6")"
    fi
    if drop_caches; then run stats_cold "$D" --quiet stats "$BANK"; fi

    warm_cache "$BANK"
    run verify "$D" --quiet verify "$BANK"
    record verify.gb_s "$(calc "$bank_bytes / $(last verify.s) / 1e9")"

    # The stricter peer: whichever dd wrote faster this round.
    dd_best=$(calc "($(last dd.mb_s) > $(last dd_direct.mb_s) ? $(last dd.mb_s) : $(last dd_direct.mb_s))")
    for kind in freeze freeze_full; do
        flags=()
        if [[ $kind == freeze_full ]]; then flags=(--verify-vectors); fi
        run $kind "$D" --quiet freeze "$BANK" "$FROZEN" "${flags[@]}"
        record $kind.mb_s "$(calc "$bank_bytes / $(last $kind.s) / 1e6")"
        record $kind.vs_dd "$(calc "$(last $kind.mb_s) / $dd_best")"
        chmod -R u+w "$FROZEN"; rm -rf "$FROZEN"
    done

    run compact "$D" --quiet compact "$BANK"
    record compact.mb_s "$(calc "$bank_bytes / $(last compact.s) / 1e6")"
    record compact.vs_dd "$(calc "$(last compact.mb_s) / $dd_best")"

    # The import again, into a second bank, with the matrix not in the
    # page cache (it then reads the matrix from the disk, twice: its
    # check pass, then the import).
    if drop_caches; then
        "$D" --quiet init "$WORK/bank-cold" --dim "$DIM" --tree all --precision "$PRECISION" > /dev/null
        run import_cold "$D" --quiet import "$WORK/bank-cold" --tree all --npy "$DATA"
        record import_cold.rows_s "$(calc "$ROWS / $(last import_cold.s)")"
        rm -rf "$WORK/bank-cold"
    fi
done

if [[ $KEEP == 0 ]]; then rm -rf "$BANK" "$FROZEN"; fi

python3 - "$RESULTS" "$ROWS" "$DIM" "$PRECISION" "$ROUNDS" "$LIMIT_MB" <<'EOF'
import statistics, sys
path, rows, dim, precision, rounds, limit_mb = sys.argv[1:]
figures = {}
for line in open(path):
    parts = line.split()
    if len(parts) == 2:
        figures.setdefault(parts[0], []).append(float(parts[1]))

def fig(key, fmt="{:.2f}"):
    v = figures.get(key)
    if not v:
        return "n/a"
    return f"{fmt.format(statistics.median(v))} ({fmt.format(min(v))}-{fmt.format(max(v))})"

def heap(key):
    v = figures.get(key + ".heap_mb")
    return f"{max(v):.1f} MB" if v else "n/a"

med = lambda k: statistics.median(figures[k]) if figures.get(k) else float("nan")
print(f"{int(rows):,} x {dim} {precision}, bank {med('bank.mb'):.0f} MB, {rounds} rounds; "
      f"median (min-max); dd bs=4M conv=fdatasync: {fig('dd.mb_s', '{:.0f}')} MB/s, "
      f"with oflag=direct: {fig('dd_direct.mb_s', '{:.0f}')} MB/s"
      + (f"; every command capped at {limit_mb} MB of memory (heap + page cache)" if limit_mb != "0" else "")
      + "\n")
print("| command | seconds | rate | peak heap |")
print("|---|---:|---:|---:|")
print(f"| `import --npy` | {fig('import.s')} | {fig('import.rows_s', '{:,.0f}')} rows/s = {fig('import.mb_s', '{:.0f}')} MB/s | {heap('import')} |")
by_round = lambda k, fmt: " / ".join(fmt.format(x) for x in figures.get(k, []))
if figures.get("import.source_cached_pct"):
    print(f"| `import --npy` per round (matrix in the page cache at its start) | {by_round('import.s', '{:.2f}')} "
          f"| {by_round('import.source_cached_pct', '{:.0f}%')} cached | |")
if figures.get("import_cold.s"):
    print(f"| `import --npy` of a matrix not in the page cache | {fig('import_cold.s')} | "
          f"{fig('import_cold.rows_s', '{:,.0f}')} rows/s | {heap('import_cold')} |")
print(f"| disk peer: the bank's bytes through the page cache, fdatasync per import group | {fig('peer.s')} | {fig('peer.mb_s', '{:.0f}')} MB/s; import at {fig('import.vs_peer')}x of it | |")
ratio = med('query.s') / med('query_warm_inprocess.s')
print(f"| `query` (k=10, 1 thread), fresh process, warm cache | {fig('query.s', '{:.3f}')} | "
      f"{ratio:.2f}x the warm in-process query | {heap('query')} |")
print(f"| `query`, fresh process, right after the import (bank not in the page cache) | "
      f"{fig('query_after_import.s', '{:.3f}')} | | {heap('query_after_import')} |")
print(f"| query in process: first / warm | {fig('query_first_inprocess.s', '{:.3f}')} / "
      f"{fig('query_warm_inprocess.s', '{:.3f}')} | | |")
print(f"| `stats`, warm / cold cache | {fig('stats_warm.s', '{:.3f}')} / {fig('stats_cold.s', '{:.3f}')} | | {heap('stats_warm')} |")
if figures.get('read_cold.s'):
    print(f"| `cat` of the bank, caches dropped, capped (the disk's read speed) | {fig('read_cold.s')} | "
          f"{fig('read_cold.mb_s', '{:.0f}')} MB/s | |")
print(f"| `verify` (from the page cache) | {fig('verify.s')} | {fig('verify.gb_s')} GB/s | {heap('verify')} |")
print(f"| `freeze` (reads back all but the vector columns) | {fig('freeze.s')} | {fig('freeze.mb_s', '{:.0f}')} MB/s = "
      f"{fig('freeze.vs_dd')}x the faster dd | {heap('freeze')} |")
print(f"| `freeze --verify-vectors` (reads back the whole copy) | {fig('freeze_full.s')} | "
      f"{fig('freeze_full.mb_s', '{:.0f}')} MB/s = {fig('freeze_full.vs_dd')}x the faster dd | {heap('freeze_full')} |")
print(f"| `compact` | {fig('compact.s')} | {fig('compact.mb_s', '{:.0f}')} MB/s = {fig('compact.vs_dd')}x the faster dd | {heap('compact')} |")
EOF
