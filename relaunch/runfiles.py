"""Pure builders of the per-run scripts the host executes, and the parser of a health poll."""

from __future__ import annotations

import re
import shlex
from datetime import datetime, timezone

from relaunch.config import Target
from relaunch.snapshot import GpuSample, HealthSnapshot

MARK = "@@relaunch@@ "


def utc_stamp(now: datetime | None = None) -> str:
    """Sortable, and unique enough for names made in one recovery (microseconds)."""
    return (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%S.%fZ")


def new_run_id(attempt: int, now: datetime | None = None) -> str:
    return f"{utc_stamp(now)}-a{attempt}"


def run_dir(target: Target, run_id: str) -> str:
    return f"{target.state_path}/runs/{run_id}"


def log_path(target: Target, run_id: str) -> str:
    return f"{target.log_dir}/{target.name}-{run_id}.log"


def trainer_env(target: Target) -> dict[str, str]:
    """What warm-up and trainer share, so the warmed kernels are the ones training looks up."""
    return {"TORCHINDUCTOR_CACHE_DIR": target.inductor_cache_dir, "VIRTUAL_ENV": target.venv_dir, **target.env}


def env_exports(target: Target) -> str:
    exports = [f"export PATH={shlex.quote(target.venv_dir + '/bin')}:\"$PATH\""]
    exports += [f"export {k}={shlex.quote(v)}" for k, v in trainer_env(target).items()]
    return "\n".join(exports)


def trainer_command(target: Target, checkpoint: str | None) -> str:
    if not checkpoint:
        return target.launch_command
    return f"{target.launch_command} {target.resume_arg.format(checkpoint=shlex.quote(checkpoint))}"


def supervisor_script(target: Target, run_id: str, command: str) -> str:
    """Runs the trainer outside tmux, appends its output to the attempt log, records PID and exit code."""
    q = shlex.quote
    rdir, log = run_dir(target, run_id), log_path(target, run_id)
    return f"""#!/usr/bin/env bash
# relaunch supervisor: target {target.name}, run {run_id}.
# The trainer runs in its own process group, outside tmux: a lost session loses no output
# and kills nothing. Its exit code is written when it exits, so no death is silent.
set -o pipefail
run_dir={q(rdir)}
log={q(log)}
note() {{ printf '[relaunch] %s run {run_id}: %s\\n' "$(date -u +%FT%TZ)" "$1" >> "$log"; }}
# A handler (not an ignore) so the trainer still gets default signal handling.
trap 'true' TERM HUP INT
s=$(cat "/proc/$$/stat"); s=${{s##*) }}; read -ra f <<< "$s"
echo "$$ ${{f[19]}}" > "$run_dir/supervisor_pid.tmp" && mv -f "$run_dir/supervisor_pid.tmp" "$run_dir/supervisor_pid"
cd -- {q(target.repo_dir)} || {{ note "cannot cd to {target.repo_dir}"; echo 126 > "$run_dir/exit_code"; exit 126; }}
{env_exports(target)}
note {q("start: " + command)}
bash -c {q(command)} >> "$log" 2>&1 < /dev/null &
pid=$!
s=$(cat "/proc/$pid/stat" 2>/dev/null); s=${{s##*) }}; read -ra f <<< "$s"
echo "$pid ${{f[19]}}" > "$run_dir/pid.tmp" && mv -f "$run_dir/pid.tmp" "$run_dir/pid"
wait "$pid"; code=$?
while kill -0 "$pid" 2>/dev/null; do wait "$pid"; code=$?; done
echo "$code" > "$run_dir/exit_code.tmp" && mv -f "$run_dir/exit_code.tmp" "$run_dir/exit_code"
note "trainer exited with code $code"
exit "$code"
"""


def launcher_script(target: Target, run_id: str) -> str:
    """What tmux runs: detach the supervisor into its own session, then show the log until it ends."""
    q = shlex.quote
    rdir, log = run_dir(target, run_id), log_path(target, run_id)
    return f"""#!/usr/bin/env bash
# relaunch launcher: target {target.name}, run {run_id}. The pane shows the log; the log is the record.
# setsid -f: the supervisor is nobody's child here, so init reaps it and the pane ends with it.
setsid -f bash {q(rdir + '/supervisor.sh')} < /dev/null > /dev/null 2>&1
for _ in $(seq 200); do [ -s {q(rdir + '/supervisor_pid')} ] && break; sleep 0.05; done
read -r spid _ < {q(rdir + '/supervisor_pid')}
touch {q(log)}
exec tail -n +1 -F --pid="$spid" {q(log)} 2>/dev/null
"""


def parse_snapshot(stdout: str, host: str) -> HealthSnapshot:
    """Read the SNAPSHOT script's sections; lines before the first marker (shell noise) are ignored."""
    fields: dict[str, str] = {}
    sections: dict[str, list[str]] = {"tail": [], "matches": [], "gpu": [], "kernel": []}
    current: list[str] | None = None
    for line in stdout.splitlines():
        if line.startswith(MARK):
            key, _, value = line[len(MARK):].partition(" ")
            current = sections.get(key)
            if current is None:
                fields[key] = value.strip()
        elif current is not None:
            current.append(line)
    matches = _before_tail(sections["matches"], _int(fields.get("log_lines")), len(sections["tail"]))
    now = _float(fields.get("now"))
    started, mtime = _float(fields.get("started_at")), _float(fields.get("log_mtime"))
    return HealthSnapshot(
        host=host,
        launched=fields.get("launched") == "1",
        run_id=fields.get("run_id") or None,
        session_alive=fields.get("session") == "1",
        pid=_int(fields.get("pid")),
        pid_alive=fields.get("pid_alive") == "1",
        exit_code=_int(fields.get("exit_code")),
        seconds_since_launch=(now - started) if now is not None and started is not None else None,
        seconds_since_log_write=max(0.0, now - mtime) if now is not None and mtime is not None else None,
        log_size_bytes=_int(fields.get("log_size")) or 0,
        log_tail=sections["tail"],
        log_matches=matches,
        gpus=parse_gpu_csv("\n".join(sections["gpu"])),
        kernel_lines=sections["kernel"],
    )


NUMBERED = re.compile(r"^(\d+)[:-](.*)$")


def _before_tail(numbered: list[str], total: int | None, tail_len: int) -> list[str]:
    """grep -n -B output, in log order, without the lines the tail already holds."""
    first_tail = (total or 0) - tail_len + 1
    lines: dict[int, str] = {}
    for line in numbered:
        m = NUMBERED.match(line)
        if m and int(m[1]) < first_tail:
            lines[int(m[1])] = m[2]
    return [lines[n] for n in sorted(lines)]


GPU_LINE = re.compile(r"^\s*(\d+),\s*(\d+)(?:\s*MiB)?,\s*(\d+)(?:\s*%)?\s*$")


def parse_gpu_csv(text: str) -> list[GpuSample]:
    """`index, memory.used, utilization.gpu` rows, with or without units."""
    out = []
    for line in text.splitlines():
        m = GPU_LINE.match(line)
        if m:
            out.append(GpuSample(index=int(m[1]), memory_used_mib=int(m[2]), utilization_percent=int(m[3])))
    return out


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None
