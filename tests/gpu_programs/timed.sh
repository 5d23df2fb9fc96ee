# Sourced by the GPU-machine scripts. timed NAME CMD...: runs CMD with its output in $dest/NAME.log, and
# appends its exit code, wall seconds and peak RSS (ru_maxrss of the command's processes) to $T.
timed() {
  local name=$1; shift
  python3 - "$dest/$name.log" "$@" <<'PY' | tee -a "$T"
import resource, subprocess, sys, time
log, command = sys.argv[1], sys.argv[2:]
start = time.monotonic()
with open(log, "w") as out:
    rc = subprocess.call(command, stdout=out, stderr=subprocess.STDOUT)
wall = time.monotonic() - start
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1e6
print(f"{log.rsplit('/', 1)[-1][:-4]}: rc={rc} wall_s={wall:.1f} peak_rss_gb={rss:.2f}")
PY
}
