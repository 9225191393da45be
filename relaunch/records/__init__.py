"""Records: what relaunch tells a person and keeps of a target's time: the report, goodput, the dead-man alarm. Pure."""
