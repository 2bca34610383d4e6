"""The local back end: engines as processes on this machine."""
