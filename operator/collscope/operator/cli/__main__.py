"""``python -m collscope.operator.cli``: the same as the ``collscope`` script."""

from collscope.operator.cli import main

raise SystemExit(main.main())
