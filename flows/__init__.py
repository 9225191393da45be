"""Flows put the steps in order and branch on the verdict; all the work is in tasks/."""
