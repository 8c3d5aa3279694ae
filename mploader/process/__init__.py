"""Worker processes as the main process sees them.

``group`` starts, talks to, watches and stops a loader's workers; ``pipes`` holds the non-blocking
task pipes and the single ``poll(2)`` wait; ``zygote`` forks spawn/forkserver workers from a warm
interpreter; ``sigchld`` keeps the live groups and the SIGCHLD handler; ``inherited_fds`` the
pipe ends a forked worker must close; ``death`` turns an exit status into a named report.  May
import ``worker`` (the entry point, the spec and the messages), ``monitor``, ``config`` and
``errors``; never the iterator.
"""
