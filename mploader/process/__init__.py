"""Worker processes as the main process sees them.

* ``group``: starts, talks to, watches and stops a loader's workers.
* ``pipes``: the non-blocking task pipes and the main process's single ``poll(2)`` wait.
* ``zygote``: forks spawn/forkserver workers from a warm interpreter.
* ``sigchld``: the live worker groups and the SIGCHLD handler that wakes them.
* ``inherited_fds``: the main-process pipe ends a forked worker must close.
* ``death``: turns a dead worker's exit status into a named report.
* ``reaper``: waits, off the loader's path, for the exit of workers that said goodbye.

May import ``worker`` (the entry point, the spec and the messages), ``channel`` (block releases,
which forks are workers), ``monitor`` and the leaves (``compat``, ``errors``, ``polling``); never
the iterator.
"""
