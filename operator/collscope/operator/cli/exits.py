"""The exit codes of the ``collscope`` command, shared by ``main`` and every subcommand.

0 analysed (anomaly or not) / simulated / demo diagnosed correctly; 1 the demo's diagnosis
disagreed with the injected truth; 2 bad input or bad arguments, with one line on stderr naming
what and where, never a traceback. (``flightrecorder`` also answers 1 when a rank has no file.)
"""

from __future__ import annotations

OK = 0
MISMATCH = 1
BAD_INPUT = 2
