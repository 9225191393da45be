"""The training target: one pydantic model, loaded from YAML or given as a flow parameter."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from relaunch.errors import ConfigError
from relaunch.paths import (
    check_cache_dir_is_dedicated,
    check_clean_text,
    check_host_path,
    check_relative_path,
    check_resume_arg,
    check_venv_dir_is_dedicated,
)

# A target file is a few KiB; a bound keeps a hostile one from exhausting the parser.
MAX_TARGET_FILE_BYTES = 1 << 20
# One folder per target, outside log_dir; /var/tmp survives a reboot, so a deliberate stop is still known after one.
DEFAULT_STATE_ROOT = "/var/tmp/relaunch"
DEFAULT_CACHE_PREFIX = "/tmp/torchinductor_relaunch_"
ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _Model(BaseModel):
    # inf/nan are never a sensible threshold: `min_free_disk_gb: .inf` would refuse every host.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class Container(_Model):
    """A container on the host that every command runs inside."""

    kind: Literal["pct", "docker"] = Field(description="Proxmox LXC (`pct exec ID --`) or Docker (`docker exec NAME`).")
    id: str = Field(min_length=1, description="Container id (pct) or name (docker).")


class SSHLogin(_Model):
    """One SSH server: where it listens, who logs in with which key, and how its host key is trusted."""

    hostname: str = Field(description="SSH host name or address.")
    port: int = Field(22, ge=1, le=65535, description="SSH port.")
    user: str = Field("root", description="SSH user.")
    known_hosts_path: str | None = Field(None, description="known_hosts file to verify the host key against (default ~/.ssh/known_hosts).")
    trust_on_first_use: bool = Field(False, description="Accept and record an unknown host key. Off: unknown keys are refused.")
    key_path: str | None = Field(
        None, description="Private key file. The passphrase, if any, comes from RELAUNCH_SSH_PASSPHRASE or a Secret block."
    )
    key_secret_block: str | None = Field(
        None,
        description="Name of a Prefect Secret block holding the private key's text (OpenSSH or PEM), used in memory only; instead of key_path.",
    )
    passphrase_secret_block: str | None = Field(None, description="Name of a Prefect Secret block holding the key passphrase.")

    @field_validator("hostname", "user", "known_hosts_path", "key_path", "key_secret_block", "passphrase_secret_block")
    @classmethod
    def _no_control_characters(cls, value: str | None) -> str | None:
        return None if value is None else check_clean_text(value)

    @model_validator(mode="after")
    def _one_key_source(self) -> SSHLogin:
        if self.key_path and self.key_secret_block:
            raise ValueError(
                "key_path and key_secret_block are both set: give one of them (a key file on this machine, or the Secret block holding the key)"
            )
        return self

    @property
    def address(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"


class JumpHost(SSHLogin):
    """A bastion on the way to the host (OpenSSH's ProxyJump): the next hop is reached through a tunnel from it."""


class Host(SSHLogin):
    """Where the trainer runs: this machine, or a host reached over SSH, directly or through jump hosts."""

    kind: Literal["local", "ssh"] = Field("local", description="`local` runs commands here; `ssh` through fabric.")
    hostname: str = Field("localhost", description="SSH host name or address (as the last jump host resolves it, if any).")
    connect_timeout_seconds: float = Field(10.0, gt=0, description="Give up connecting (to each hop) after this long.")
    command_timeout_seconds: float = Field(600.0, gt=0, description="Default limit for one remote command.")
    container: Container | None = Field(None, description="Run every command inside this container.")
    jump: list[JumpHost] = Field(
        default_factory=list,
        description="Jump hosts passed through in order, each reached through the one before; the host through the last. Empty: direct.",
    )
    ssh_config: bool = Field(
        False,
        description="hostname is an alias in ~/.ssh/config (of the user running relaunch): its HostName, User, Port, IdentityFile, "
        "ProxyJump and UserKnownHostsFile are used, and ssh-agent's keys; fields set here win. Host keys are verified as without it.",
    )

    @model_validator(mode="after")
    def _jump_needs_ssh(self) -> Host:
        if self.jump and self.kind != "ssh":
            raise ValueError("jump is set but kind is not ssh: jump hosts only lead to an ssh host (set kind: ssh, or remove jump)")
        if self.ssh_config and self.kind != "ssh":
            raise ValueError("ssh_config is on but kind is not ssh: only an ssh host is looked up in ~/.ssh/config (set kind: ssh)")
        return self

    @property
    def route(self) -> str:
        """user@host:port, and the jump hosts it is reached through (`root@10.0.0.5:22 via bastion@1.2.3.4:22`)."""
        return f"{self.address} via {' -> '.join(j.address for j in self.jump)}" if self.jump else self.address

    @property
    def label(self) -> str:
        where = "local" if self.kind == "local" else self.route
        return f"{where} ({self.container.kind} {self.container.id})" if self.container else where


class Thresholds(_Model):
    """When a run is starting, healthy, degraded or stalled."""

    startup_grace_seconds: float = Field(
        900.0,
        ge=0,
        description="Before the first step line, a live trainer is `starting` for this long (the incident's start-up took well over 7 minutes).",
    )
    poll_interval_seconds: float = Field(
        5.0,
        ge=0.1,
        description="Longest wait between two health polls (fractions honoured); a death is noticed sooner through the exit-code file.",
    )
    settle_timeout_seconds: float = Field(1800.0, gt=0, description="Give up waiting for a settled verdict after this long.")
    healthy_steps: int = Field(3, ge=1, description="Step lines after launch needed to call a run healthy.")
    stall_window_floor_seconds: float = Field(
        300.0, gt=0, description="A live run with no new step line for this long (or 10x its step interval, if longer) is stalled."
    )
    stall_interval_factor: float = Field(10.0, gt=1, description="Stall window as a multiple of the observed step interval.")
    baseline_tokens_per_second: float | None = Field(
        None, gt=0, description="Known-good throughput; below degraded_ratio of it is degraded (incident: 21500)."
    )
    baseline_scope: Literal["job", "gpu"] = Field(
        "job",
        description="What baseline_tokens_per_second counts: the whole job's tokens per second (job) or one GPU's (gpu). "
        "A figure the log marks as the other scope (`2690 tok/s/gpu` against a job's baseline) never makes a run degraded.",
    )
    degraded_ratio: float = Field(
        0.5, gt=0, lt=1, description="Fraction of the baseline under which a run is degraded (incident: 4.3/21.5 = 0.2)."
    )
    throughput_pattern: str | None = Field(
        None,
        description="Regex with a named group `value` (and optional `unit` k/K) for tokens per second; default reads 20.0Ktok/s, 21500 tok/s, tokens/s, tok/sec.",
    )
    step_pattern: str = Field(r"\bstep[=: ]\s*(?P<step>\d+)", description="Regex with a named group `step` that finds a step line.")
    expected_gpus: int = Field(
        0, ge=0, description="GPUs the trainer should use; 0 where there are none (the demo). Fewer listed by nvidia-smi is a GPU fault."
    )
    diverged_steps: int = Field(
        3, ge=1, description="A live run whose last this-many step lines all show a non-finite loss (nan, inf) has diverged."
    )
    loss_pattern: str | None = Field(
        None,
        description="Regex with a named group `value` for the loss on a step line; default reads loss=nan, loss nan, loss: inf, 'loss': nan, train_loss=3.6.",
    )

    @property
    def progress_sample_seconds(self) -> float:
        """How often the run's recorder (relaunch/host/recorder.sh) samples its tree: a twentieth of the stall window's
        floor, 0.5 to 5 s (the default 300 s floor: every 5 s; a floor scaled to 20 s: every second), so a window always
        spans twenty samples or more and a hang is judged within seconds of its window, for a few process reads a sample."""
        return min(5.0, max(0.5, self.stall_window_floor_seconds / 20))

    @field_validator("step_pattern")
    @classmethod
    def _step_pattern(cls, value: str) -> str:
        return _pattern_with_group(value, "step")

    @field_validator("throughput_pattern", "loss_pattern")
    @classmethod
    def _value_pattern(cls, value: str | None) -> str | None:
        return None if value is None else _pattern_with_group(value, "value")


def _pattern_with_group(value: str, group: str) -> str:
    try:
        compiled = re.compile(value)
    except (re.error, RecursionError, OverflowError) as exc:
        raise ValueError(f"not a valid regular expression: {exc}") from None
    if group not in compiled.groupindex:
        raise ValueError(f"needs a named group (?P<{group}>...)")
    return value


def check_env(values: dict[str, str]) -> dict[str, str]:
    """Environment keys are shell variable names and values hold no NUL."""
    for key, value in values.items():
        if not ENV_KEY.match(key):
            raise ValueError(f"{key!r} is not a shell variable name ([A-Za-z_][A-Za-z0-9_]*)")
        if "\0" in value:
            raise ValueError(f"the value of {key} contains a NUL character, which no environment can hold")
    return values


class Node(_Model):
    """One host of a run that spans several (docs/multinode.md): reached as a target's host is, with what differs there."""

    host: Host = Field(default_factory=Host, description="Where this node's share of the run runs (local, SSH, jump hosts, container).")
    address: str | None = Field(
        None,
        description="Where the other nodes reach this one (NODE_ADDR; node 0's is MASTER_ADDR and the rendezvous endpoint); "
        "default host.hostname.",
    )
    repo_dir: str | None = Field(None, description="This node's checkout, where it differs from the target's repo_dir.")
    venv_dir: str | None = Field(None, description="This node's venv, where it differs from the target's venv_dir.")
    log_dir: str | None = Field(None, description="This node's log folder, where it differs from the target's log_dir.")
    state_dir: str | None = Field(
        None, description="relaunch's own files on this node; default /var/tmp/relaunch/<name>-node<K> (each node its own)."
    )
    inductor_cache_dir: str | None = Field(None, description="This node's compile cache, where it differs from the target's.")
    checkpoint_dir: str | None = Field(
        None, description="This node's view of checkpoint_dir (shared storage: every node resumes from the checkpoint node 0 chose)."
    )
    tmux_session: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_-]+$", description="This node's tmux session, where it differs (two nodes on one machine)."
    )
    env: dict[str, str] = Field(default_factory=dict, description="Environment added on this node only (e.g. GLOO_SOCKET_IFNAME).")
    spare: bool = Field(
        False,
        description="Held in reserve: launched only in place of a node that cannot be reached (its venv, code and cache made first).",
    )

    @field_validator("repo_dir", "venv_dir", "log_dir", "state_dir", "inductor_cache_dir", "checkpoint_dir")
    @classmethod
    def _host_paths(cls, value: str | None) -> str | None:
        return None if value is None else check_host_path(value)

    @field_validator("address")
    @classmethod
    def _clean_address(cls, value: str | None) -> str | None:
        return None if value is None else check_clean_text(value)

    @field_validator("env")
    @classmethod
    def _env(cls, values: dict[str, str]) -> dict[str, str]:
        return check_env(values)


class Rendezvous(_Model):
    """How the nodes of a multi-node run meet: node 0's address and a port that is new at every launch."""

    master_port: int = Field(29500, ge=1, le=65535, description="First port of the range node 0's rendezvous listens on (MASTER_PORT).")
    port_range: int = Field(
        100,
        ge=1,
        le=10000,
        description="Each launch takes a port in [master_port, master_port + port_range), chosen from its run id, and RDZV_ID is the "
        "run id: a relaunch never meets the last launch's rendezvous (nor a port it left in TIME_WAIT).",
    )

    min_nodes: int | None = Field(
        None,
        ge=1,
        description="The fewest nodes the trainer accepts (its launch_command takes NNODES, e.g. torchrun --nnodes $NNODES or MIN:MAX): "
        "with too few spares, a node that cannot be reached is left out if at least this many remain; None: the world is fixed.",
    )

    @model_validator(mode="after")
    def _ports_fit(self) -> Rendezvous:
        if self.master_port + self.port_range - 1 > 65535:
            raise ValueError(f"master_port + port_range - 1 = {self.master_port + self.port_range - 1} is past port 65535")
        return self


class Target(_Model):
    """One training run on one host, and how to recover it."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="Short name; used for the state folder and Prefect tags.")
    host: Host = Field(default_factory=Host, description="Where the trainer runs (for a run of several nodes: see nodes).")
    nodes: list[Node] = Field(
        default_factory=list,
        description="The hosts of a run that spans several (docs/multinode.md): launch_command runs on each with NODE_RANK, NNODES, "
        "NODE_ADDR, MASTER_ADDR, MASTER_PORT, RDZV_ENDPOINT and RDZV_ID in its environment, and they are checked and recovered "
        "as one gang; `host` is then unused. Empty: one node, `host`.",
    )
    rendezvous: Rendezvous = Field(default_factory=Rendezvous, description="How the nodes meet (used only with nodes).")
    repo_dir: str = Field(description="Git checkout of the training code on the host.")
    known_good_ref: str = Field("HEAD", description="Git ref the model code is restored to.")
    restore_paths: list[str] = Field(
        default_factory=list, description="Paths (relative to repo_dir) restored to known_good_ref; empty: none."
    )
    venv_dir: str = Field(description="Virtual environment the trainer runs in.")
    lock_file: str = Field(description="Pinned requirements (`name==version` lines), relative to repo_dir or absolute.")
    python: str = Field("python3", description="Interpreter uv builds the venv with.")
    index_urls: list[str] = Field(default_factory=list, description="Extra package indexes for the installer.")
    find_links: list[str] = Field(default_factory=list, description="Folders or URLs of wheels for the installer.")
    offline: bool = Field(False, description="Install only from find_links; never touch an index.")
    system_site_packages: bool = Field(
        False,
        description="Build the venv with `uv venv --system-site-packages`: it also sees the packages of `python` (a GPU image's torch), "
        "which the lock then leaves out; the rebuild records their versions.",
    )
    import_check: list[str] = Field(default_factory=list, description="Modules that must import in the fresh venv.")
    inductor_cache_dir: str = Field(
        "",
        description="TORCHINDUCTOR_CACHE_DIR for warm-up and trainer; default /tmp/torchinductor_relaunch_<name>, the target's own "
        "(torch's default for root, /tmp/torchinductor_root, is shared by every root job on the host).",
    )
    warmup_command: str | None = Field(
        None, description="Shell command (run in repo_dir with the venv active) that compiles every kernel once, single-threaded."
    )
    launch_command: str = Field(description="Shell command that starts the trainer, run in repo_dir with the venv active.")
    tmux_session: str = Field(
        "train",
        pattern=r"^[A-Za-z0-9_-]+$",
        description="tmux session the trainer runs in. No `.` or `:`: tmux reads `x.0` as session x, pane 0, another session's.",
    )
    log_dir: str = Field(description="Folder for per-attempt logs; logs are never deleted.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment for warm-up and trainer.")
    checkpoint_dir: str | None = Field(None, description="Folder of checkpoints (one sub-folder or file each); never modified.")
    resume_arg: str = Field(
        "--resume {checkpoint}", description="Appended to launch_command when a checkpoint exists; {checkpoint} is its path."
    )
    state_dir: str | None = Field(
        None,
        description="relaunch's own files on the host (launcher, PIDs, exit codes, patches), one folder per target; "
        "default /var/tmp/relaunch/<name>: outside log_dir, so a full or archived log folder loses no record.",
    )
    stop_grace_seconds: float = Field(
        60.0, gt=0, description="After its one SIGTERM, a stopping trainer has this long to save and exit before SIGKILL."
    )
    resume_from: Literal["entry", "folder"] = Field(
        "entry",
        description="What {checkpoint} names: the chosen checkpoint itself (`entry`), or checkpoint_dir (`folder`) for loaders "
        "that take the parent folder and read its tracker (Megatron's --load, DeepSpeed).",
    )
    unbuffered: bool = Field(
        True, description="Give the trainer PYTHONUNBUFFERED=1 (unless env sets it), so step lines reach the log as printed."
    )
    min_free_disk_gb: float = Field(5.0, ge=0, description="Preflight refuses to start with less free disk at venv_dir.")
    max_attempts: int = Field(3, ge=1, le=20, description="Recovery attempts before giving up.")
    keep_old_venvs: int = Field(2, ge=1, description="Old venvs kept aside; older ones are the only thing relaunch ever removes.")
    thresholds: Thresholds = Field(default_factory=Thresholds, description="Health thresholds.")
    # Across nights (relaunch/deciding/history.py, relaunch/deciding/ledger.py; docs/nights.md): the restart budget, and the GPUs a run
    # may use in place of GPUs in the ledger. The defaults fit a nightly check: the third return in three days.
    storm_window_hours: float = Field(
        72.0,
        gt=0,
        description="A cause that returns storm_max_returns times within this many hours, the checkpoint never advancing, is a restart storm: escalated, not relaunched.",
    )
    storm_max_returns: int = Field(
        3, ge=2, le=50, description="Returns of one cause (this night's included) within storm_window_hours that make a restart storm."
    )
    spare_gpus: list[int] = Field(
        default_factory=list,
        description="GPU indexes the trainer may run on in place of a GPU in the ledger, one for one (its world size kept); empty: none, a ledgered GPU is escalated.",
    )
    min_gpus: int | None = Field(
        None,
        ge=1,
        description="The fewest GPUs the trainer accepts: with too few spares, relaunch on the good GPUs left if at least this many; None: its world size is fixed.",
    )

    @field_validator("spare_gpus")
    @classmethod
    def _gpu_indexes(cls, values: list[int]) -> list[int]:
        if any(v < 0 for v in values) or len(set(values)) != len(values):
            raise ValueError("GPU indexes are whole numbers from 0, each listed once")
        return values

    @model_validator(mode="before")
    @classmethod
    def _own_cache_by_default(cls, data: object) -> object:
        if isinstance(data, dict) and not data.get("inductor_cache_dir") and isinstance(data.get("name"), str):
            data = {**data, "inductor_cache_dir": f"{DEFAULT_CACHE_PREFIX}{data['name']}"}
        return data

    @field_validator("repo_dir", "venv_dir", "log_dir", "inductor_cache_dir", "checkpoint_dir", "state_dir")
    @classmethod
    def _host_paths(cls, value: str | None) -> str | None:
        return None if value is None else check_host_path(value)

    @field_validator("lock_file", "python")
    @classmethod
    def _file_names(cls, value: str) -> str:
        return check_clean_text(value)

    @field_validator("find_links", "index_urls", "import_check")
    @classmethod
    def _clean_items(cls, values: list[str]) -> list[str]:
        return [check_clean_text(v) for v in values]

    @field_validator("restore_paths")
    @classmethod
    def _relative_paths(cls, values: list[str]) -> list[str]:
        return [check_relative_path(v) for v in values]

    @field_validator("known_good_ref")
    @classmethod
    def _git_ref(cls, value: str) -> str:
        check_clean_text(value)
        # A ref is an argument to git: `--output=/etc/x` would be an option, not a ref.
        if not value or value.startswith("-") or any(c.isspace() for c in value):
            raise ValueError(f"{value!r} is not a git ref (no leading '-', no spaces)")
        return value

    @field_validator("resume_arg")
    @classmethod
    def _resume_arg(cls, value: str) -> str:
        return check_resume_arg(value)

    @field_validator("env")
    @classmethod
    def _env(cls, values: dict[str, str]) -> dict[str, str]:
        return check_env(values)

    @model_validator(mode="after")
    def _nodes_are_apart(self) -> Target:
        working = sum(not n.spare for n in self.nodes)
        if self.nodes and not working:
            raise ValueError("every node is a spare: at least one node must be launched (spare: false)")
        if self.nodes and self.rendezvous.min_nodes is not None and self.rendezvous.min_nodes > working:
            raise ValueError(f"rendezvous.min_nodes is {self.rendezvous.min_nodes} but only {working} nodes are launched (not spare)")
        seen: dict[tuple[str, str], int] = {}
        for k, node in enumerate(self.nodes):
            where = (node.host.label, node.state_dir or f"{DEFAULT_STATE_ROOT}/{self.name}-node{k}")
            if where in seen:
                raise ValueError(
                    f"nodes {seen[where]} and {k} share host {where[0]} and state folder {where[1]}: give each node its own state_dir"
                )
            seen[where] = k
        return self

    @model_validator(mode="after")
    def _folders_do_not_overlap(self) -> Target:
        if self.checkpoint_dir and "{checkpoint}" not in self.resume_arg:
            raise ValueError("resume_arg must contain {checkpoint}")
        others = self.protected_dirs()
        check_cache_dir_is_dedicated(self.inductor_cache_dir, {k: v for k, v in others.items()})
        check_venv_dir_is_dedicated(self.venv_dir, {k: v for k, v in others.items() if k not in ("venv_dir", "repo_dir")})
        return self

    def protected_dirs(self) -> dict[str, str]:
        """Folders holding the user's work: nothing relaunch clears may equal, hold or lie inside them."""
        dirs = {"repo_dir": self.repo_dir, "venv_dir": self.venv_dir, "log_dir": self.log_dir, "state_dir": self.state_path}
        if self.checkpoint_dir:
            dirs["checkpoint_dir"] = self.checkpoint_dir
        return dirs

    @property
    def state_path(self) -> str:
        return self.state_dir or f"{DEFAULT_STATE_ROOT}/{self.name}"

    @property
    def legacy_state_path(self) -> str:
        """Where relaunch before 0.2 kept this target's records: its marked processes still count as this target's."""
        return f"{self.log_dir}/.relaunch"

    @property
    def lock_path(self) -> str:
        return self.lock_file if self.lock_file.startswith("/") else f"{self.repo_dir}/{self.lock_file}"


def targets_folder() -> Path:
    """Where targets live by name: `$XDG_CONFIG_HOME/relaunch/targets` (default ~/.config/relaunch/targets)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "relaunch" / "targets"


def target_names() -> list[str]:
    """The names of the target files in targets_folder()."""
    folder = targets_folder()
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def target_file(name_or_path: str | Path) -> Path:
    """A target file, given as a path or as a NAME in targets_folder() (NAME.yaml): an existing path wins."""
    path = Path(name_or_path)
    text = str(name_or_path)
    if path.exists() or "/" in text or path.suffix in (".yaml", ".yml"):
        return path
    named = targets_folder() / f"{text}.yaml"
    if named.exists():
        return named
    known = target_names()
    raise ConfigError(
        f"{text}: no such target file, and no target of that name in {targets_folder()}"
        + (f" (known: {', '.join(known)})" if known else "")
        + f"\n  what to do: give the path of a target YAML file, or save it as {named}"
    )


def load_target(path: str | Path) -> Target:
    """Read a target file (a path, or a name in targets_folder()); a bad file fails naming the file and each bad field,
    with its line, the value it has, and the field meant where a name is misspelled."""
    path = target_file(path)
    text = _read_text(path)
    data = parse_yaml(path, text)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of target fields, got {type(data).__name__}")
    try:
        return Target.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: invalid target:\n{format_validation_error(exc, key_lines(text))}") from exc


def load_targets(path: str | Path) -> list[Target]:
    """The targets a file names: a fleet file's (a mapping with `targets:`), else the one target of a target file (or
    of a name in targets_folder())."""
    resolved = target_file(path)
    data = parse_yaml(resolved, _read_text(resolved))
    if isinstance(data, dict) and "targets" in data:
        return load_fleet(resolved)[0]
    return [load_target(resolved)]


def _read_text(path: Path) -> str:
    try:
        # Checked before opening: a FIFO would block the read, /dev/zero would never end it.
        if not stat.S_ISREG(path.stat().st_mode):
            raise ConfigError(f"{path}: not a regular file: give the path of a target YAML file")
        with path.open("rb") as f:
            raw = f.read(MAX_TARGET_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read target file: {exc.strerror}") from exc
    if len(raw) > MAX_TARGET_FILE_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_TARGET_FILE_BYTES} bytes; a target file is a few KiB")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}): save it as UTF-8") from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys; a target with two `venv_dir`s is a mistake to name."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:  # type: ignore[override]
        seen: set[object] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise ConfigError(f"duplicate key {key!r} (line {key_node.start_mark.line + 1})")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_yaml(path: Path, text: str) -> object:
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a target file") from None


Loc = tuple[str | int, ...]


def key_lines(text: str) -> dict[Loc, int]:
    """The line (from 1) of every key and list item of a YAML document, by its path (`("host", "port")`, `("targets", 0)`);
    empty where the text does not compose (it was parsed before, so that is never expected)."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)  # noqa: S506 - SafeLoader
    except (yaml.YAMLError, RecursionError):
        return {}
    lines: dict[Loc, int] = {}

    def walk(node: yaml.Node, at: Loc) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    lines[(*at, key.value)] = key.start_mark.line + 1
                    walk(value, (*at, key.value))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                lines[(*at, i)] = item.start_mark.line + 1
                walk(item, (*at, i))

    if root is not None:
        walk(root, ())
    return lines


def _model_at(model: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    """The model whose fields are at LOC under MODEL (list items and optional values unwrapped); None: not a model."""
    import typing

    current: type[BaseModel] | None = model
    for part in loc:
        if isinstance(part, int):
            continue
        if current is None or part not in current.model_fields:
            return None
        found: list[type[BaseModel]] = []
        pending = [current.model_fields[part].annotation]
        while pending:
            kind = pending.pop()
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                found.append(kind)
            else:
                pending.extend(typing.get_args(kind))
        current = found[0] if found else None
    return current


def did_you_mean(model: type[BaseModel], loc: Loc) -> str | None:
    """The field of MODEL at LOC's parent closest to LOC's last name (a misspelling), if one is close enough."""
    import difflib

    if not loc or not isinstance(loc[-1], str):
        return None
    parent = _model_at(model, loc[:-1])
    if parent is None:
        return None
    close = difflib.get_close_matches(loc[-1], list(parent.model_fields), n=1, cutoff=0.6)
    if not close:
        # A misspelling that keeps the words, in another order or case (`LaunchCommand`, `command_launch`).
        words = sorted(loc[-1].lower().replace("-", "_").split("_"))
        close = [f for f in parent.model_fields if sorted(f.split("_")) == words]
    return close[0] if close else None


def _shown(value: object) -> str | None:
    """A value as an error line shows it: scalars only, cut to a readable length."""
    if isinstance(value, (dict, list, tuple, set)):
        return None
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def format_validation_error(
    exc: ValidationError, lines: dict[Loc, int] | None = None, model: type[BaseModel] = Target, prefix: Loc = ()
) -> str:
    """One line per problem: the field (dotted), its line in the file where LINES knows it (PREFIX is where the model
    sits in the file: `("targets", 2)` for a fleet's inline target), what is wrong, the value given, and for an
    unknown field the field meant."""
    out = []
    for err in exc.errors():
        loc: Loc = tuple(err["loc"])
        field = ".".join(str(p) for p in loc)
        # Checks across fields have no location; their message starts with the field it refuses.
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            meant = did_you_mean(model, loc)
            message = f"unknown field{f'; did you mean `{meant}`?' if meant else ''}"
        elif err["type"] != "missing" and (value := _shown(err.get("input"))) is not None:
            message = f"{message} (got {value})"
        where = (lines or {}).get((*prefix, *loc))
        if where is None and err["type"] == "missing" and (prefix or len(loc) > 1):
            # A missing field: the line of the mapping it is missing from (not for the file's top level: that is all of it).
            where = (lines or {}).get((*prefix, *loc[:-1]))
        at = f" (line {where})" if where is not None else ""
        out.append(f"  {field}{at}: {message}" if field else f"  {message}")
    return "\n".join(out)


def load_fleet(path: str | Path) -> tuple[list[Target], int]:
    """A fleet file: `targets:` (paths of target files, relative to the fleet file, or inline targets) and
    an optional `max_concurrent:`; every target is validated before anything runs."""
    path = Path(path)
    data = parse_yaml(path, _read_text(path))
    if not isinstance(data, dict) or not isinstance(data.get("targets"), list) or not data["targets"]:
        raise ConfigError(f"{path}: expected `targets:` with a list of target files or targets")
    unknown = set(data) - {"targets", "max_concurrent"}
    if unknown:
        raise ConfigError(
            f"{path}: unknown field(s) {', '.join(sorted(map(str, unknown)))}; a fleet file has `targets` and `max_concurrent`"
        )
    targets = []
    lines: dict[Loc, int] | None = None
    for i, item in enumerate(data["targets"]):
        if isinstance(item, str):
            targets.append(load_target(path.parent / item))
            continue
        try:
            targets.append(Target.model_validate(item))
        except ValidationError as exc:
            lines = key_lines(_read_text(path)) if lines is None else lines
            raise ConfigError(
                f"{path}: targets[{i}]: invalid target:\n{format_validation_error(exc, lines, prefix=('targets', i))}"
            ) from None
    limit = data.get("max_concurrent", 4)
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 256:
        raise ConfigError(f"{path}: max_concurrent must be a whole number from 1 to 256, not {limit!r}")
    _one_session_each(path, targets)
    return targets, limit


def _one_session_each(path: Path, targets: list[Target]) -> None:
    """Two targets of a fleet in one tmux session of one host are refused: the second's check would see the first's
    trainer in its session, call it unmanaged, and a recovery of either would stop the other's pane."""
    seen: dict[tuple[str, str], str] = {}
    for t in targets:
        places = [(n.host.label, n.tmux_session or t.tmux_session) for n in t.nodes] if t.nodes else [(t.host.label, t.tmux_session)]
        for place in dict.fromkeys(places):
            if place in seen and seen[place] != t.name:
                raise ConfigError(
                    f"{path}: targets {seen[place]!r} and {t.name!r} share tmux session {place[1]!r} on {place[0]}: "
                    "each target's trainer runs in a session of its own\n"
                    f"  what to do: give {t.name!r} its own tmux_session"
                )
            seen.setdefault(place, t.name)
