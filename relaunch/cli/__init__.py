"""The application wing: the `relaunch` command (app), its entry point and warm agent, the temporary Prefect server,
the log viewer and the dry run. It may import the flows, tasks and demo; nothing below it imports it
(scripts/check_layers.py). Importing this package imports nothing: `relaunch.cli.entry` stays standard-library only."""
