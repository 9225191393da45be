"""What relaunch/host/list_checkpoints.sh prints, read: the entries of checkpoint_dir, the bytes read of the newest,
its trackers, the checkpoints refused once, and the current run's records. The choice is relaunch/deciding/checkpoints.py's.
"""

from __future__ import annotations

import base64
import binascii

from pydantic import BaseModel, Field

from relaunch.judging.logtext import number_or_none


class Entry(BaseModel):
    """One name in checkpoint_dir, as the host listed it."""

    name: str
    kind: str = Field(description="`f` file, `d` folder, `l` link, as find's %y prints it.")
    mtime: float = Field(description="Seconds since the epoch (the entry's own; a refusal is recorded with it).")
    empty: bool = Field(False, description="An empty file or folder: a save that never wrote.")
    newest: float | None = Field(None, description="A folder's newest write: the newest mtime of anything in it, a few levels down.")

    @property
    def written(self) -> float:
        """When the entry was last written: a file growing inside a folder leaves the folder's own mtime alone."""
        return max(self.mtime, self.newest) if self.newest is not None else self.mtime


class RunFacts(BaseModel):
    """What the current run's folder (STATE/runs/ID) says about how it began and how it ended."""

    run_id: str | None = None
    started_at: float | None = None
    stop_term_at: float | None = Field(None, description="When a stop sent its SIGTERMs.")
    stop_killed_at: float | None = Field(None, description="When that stop had to SIGKILL what was left.")
    exit_code: int | None = None
    exit_at: float | None = Field(None, description="When the trainer died: the mtime of its exit_code.")
    resumed_from: str | None = Field(
        None,
        description="The checkpoint relaunch launched the run with (RUN/checkpoint: its name in checkpoint_dir), `` for none (from "
        "scratch), None where not recorded (an adopted run, an older run folder).",
    )
    command: str | None = Field(None, description="An adopted run's command line, as /proc showed it (RUN/command).")


class Probe(BaseModel):
    """The bytes the host read of one file: its size, its first bytes and its last ones (`-` on the host: none read)."""

    size: int
    head: bytes = b""
    tail: bytes = b""
    read: bool = Field(True, description="False where the host listed only the size.")


class EntryProbe(BaseModel):
    """What the host read of one of the newest entries: the file itself (key ""), or the files of a folder by their
    path inside it; `crowded` where the folder held more files than were listed."""

    files: dict[str, Probe] = Field(default_factory=dict)
    crowded: bool = False


class Listing(BaseModel):
    """Everything list_checkpoints.sh reports, read."""

    present: bool = True
    entries: list[Entry] = Field(default_factory=list)
    refused: set[tuple[int, str]] = Field(default_factory=set, description="(whole-second mtime, name) that failed to load once.")
    links: dict[str, str] = Field(default_factory=dict, description="Symbolic link name -> where it points.")
    contents: dict[str, str] = Field(default_factory=dict, description="Tracker file name -> its first line.")
    probes: dict[str, EntryProbe] = Field(default_factory=dict, description="Entry name -> the bytes read of the newest entries.")
    run: RunFacts = Field(default_factory=RunFacts)


def _b64(text: str) -> bytes | None:
    try:
        return b"" if text == "-" else base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


def _probe(listing: Listing, body: str) -> None:
    """`P SIZE HEAD TAIL NAME[/PATH]`: HEAD and TAIL base64, `-` for none read."""
    parts = body.split(" ", 3)
    if len(parts) != 4 or not parts[0].isdigit():
        return
    head, tail = _b64(parts[1]), _b64(parts[2])
    name, _, rel = parts[3].partition("/")
    if head is None or tail is None or not name:
        return
    read = parts[0] == "0" or not (parts[1] == "-" and parts[2] == "-")
    listing.probes.setdefault(name, EntryProbe()).files[rel] = Probe(size=int(parts[0]), head=head, tail=tail, read=read)


def _run_facts(run: dict[str, str]) -> RunFacts:
    code = run.get("exit_code", "")
    resumed = run.get("resumed_from")
    return RunFacts(
        run_id=run.get("run") or None,
        started_at=number_or_none(run.get("started_at"), float),
        stop_term_at=number_or_none(run.get("stop_term_at"), float),
        stop_killed_at=number_or_none(run.get("stop_killed_at"), float),
        exit_code=int(code) if code.lstrip("-").isdigit() else None,
        exit_at=number_or_none(run.get("exit_at"), float),
        # launch.sh records CHECKPOINT_DIR/NAME: the name is what the listing holds.
        resumed_from=None if resumed is None else resumed.rsplit("/", 1)[-1],
        command=run.get("command") or None,
    )


def read_listing(stdout: str) -> Listing:
    """Every record list_checkpoints.sh prints (see its header), after its `present`/`missing` line if any."""
    head, newline, rest = stdout.partition("\n")
    if head.strip() in ("present", "missing") and "\0" not in head:
        if head.strip() == "missing":
            return Listing(present=False)
        stdout = rest
    elif not newline:
        stdout = head
    listing = Listing()
    newest: dict[str, float] = {}
    run: dict[str, str] = {}
    for record in stdout.split("\0"):
        tag, _, body = record.partition(" ")
        if tag == "S":
            mtime, _, name = body.partition(" ")
            if mtime.isdigit() and name:
                listing.refused.add((int(mtime), name))
        elif tag == "W":
            value, _, name = body.partition(" ")
            if (number := number_or_none(value, float)) is not None and name:
                newest[name] = number
        elif tag in ("L", "C"):
            name, slash, value = body.partition("/")
            if slash and name:
                (listing.links if tag == "L" else listing.contents)[name] = value
        elif tag == "R":
            key, _, value = body.partition(" ")
            run[key] = value.strip()
        elif tag == "P":
            _probe(listing, body)
        elif tag == "T" and body:
            listing.probes.setdefault(body, EntryProbe()).crowded = True
        elif len(tag) == 1:
            parts = body.split(" ", 2)
            if len(parts) == 3 and parts[2] and (mtime := number_or_none(parts[0], float)) is not None:
                listing.entries.append(Entry(name=parts[2], kind=tag, mtime=mtime, empty=parts[1] == "E"))
    for entry in listing.entries:
        entry.newest = newest.get(entry.name)
    listing.run = _run_facts(run)
    return listing
