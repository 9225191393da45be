"""Flows put the steps in order and branch on the verdict; all the work is in tasks/.

Importing any of them makes flow runs end when their work ends, not up to a second later (flows/heartbeats.py).
"""

from relaunch.flows.heartbeats import install

install()
